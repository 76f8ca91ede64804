"""Which keys the Redis backend's scripts touch, checked on real servers.

1. Every EVALSHA declares every key it touches, reads included. The backend's calls are sent
   one at a time and each is matched with the keys Redis reports written by it (keyspace
   notifications) and the keys of every command the script ran (MONITOR, each command's keys
   found by COMMAND GETKEYS), both read up to a mark of ours. The workload calls every
   operation of the script (a test fails when one is not called), on both layouts, with
   idle expiries pushed, an owner at its cap and reads that refresh. A key a call names from
   its arguments (the value key of put, increment and clear, the conversation of a
   conversation operation or lane, the run binding of a lane, the ids the sweep is given and
   the sessions of the keys it is given) is declared in its KEYS, and so is every fixed key
   of the call's own session (``__meta__``, ``__keys__``, ``__history__``, ``~runs``,
   ``~convs``, ``~cp``, ``~cpi``). Any other key it touches is declared, or named from what
   Redis stores under the call's root (``KEYS[8]`` less ``:__sessions__``), the exceptions
   docs/reference/redis-layout.md lists:

   * the fixed keys of another session, an id a declared index set holds (``__sessions__``,
     ``~owned``, a namespace's ``:sessions``/``:names``) before or after the call (a listing,
     an owner's cap), or the session a declared run binding names;
   * a session's value keys that its ``__keys__`` set held before the call;
   * its conversation keys (``~c:{name}`` and its suffixes), ``name`` in its ``~convs`` before;
   * run bindings (``~run:{id}``, ``~o:{owner}~:run:{id}``) in a ``~runs`` index;
   * the listing sets of the namespace of an id a declared index set holds;
   * in the node layout only, an answer given only its run: its session comes from the
     binding, so that session's answer keys and the keys of the conversation it records
     into cannot be declared.

   In the cluster layout, besides: every key a call declares or touches is in one slot. The
   only writes outside the backend's script are the cluster layout's run pointer (a SET of
   ``{prefix}:{run ref}``, in its own slot, see ``redis_layout``) and the sweep's
   compare-and-delete of a pointer whose binding has gone (an EVAL declaring it).
2. In the cluster layout (on one server and on a real cluster) every key is in its
   session's bucket and expires with its session; the sweep leaves nothing of expired
   sessions (their run pointers included), and forgetting an owner nothing that names it.
3. The cluster layout spreads sessions evenly over a real cluster's primaries.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable, Iterator
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

import pytest
import redis

from persistent_memory import get_store
from persistent_memory.backends.conversations import Summary
from persistent_memory.backends.redis.backend import RedisBackend
from persistent_memory.backends.redis.functions import SOURCE
from persistent_memory.backends.redis.layout import Layout
from persistent_memory.backends.redis.maintenance import _glob_escape
from persistent_memory.exceptions import PersistentMemoryError
from persistent_memory.idempotency import Idempotency
from persistent_memory.operations import maintenance
from persistent_memory.operations.forget import forget_owner
from persistent_memory.owners import storage_id
from persistent_memory.store import MemoryStore
from tests.conftest import memory_settings_for
from tests.timing import LIVE_TTL, wait_past

PREFIX = "rr:memory"
#: Long enough that nothing expires while test 1 runs (an expiry is a write of no call's).
LONG_TTL = 3600
#: An idle TTL that a call pushes once a tenth of a second has passed (see touch() in
#: windows.lua); a session idle that long may expire, which test 1 allows.
IDLE_TTL = 10
OWNERS = ("", "user:a", "user:b")
CONVERSATIONS = ("default", "side")
MARK = "pm-test:mark"
#: Every operation of the script (its dispatch: ``op == '...'``).
SCRIPT_OPERATIONS = set(re.findall(r"(?<![.\w])op == '(\w+)'", SOURCE))
#: The value keys the answer lane writes, named by the script, not declared.
ANSWER_KEYS = ("last_answer", "answer_count")
FIXED = ("__meta__", "__keys__", "__history__", "~runs", "~convs", "~cp", "~cpi")
RUN_REF = re.compile(r"(~run:[\w-]+|~o:[^~]+~:run:[\w-]+)")
INDEX = re.compile(r"(~sessions|~names|__sessions__|~owned|(~o:[^~]+~):(sessions|names))")
SESSION_KEY = re.compile(r"(~o:[^~]+~[\w-]+|[\w-]+):(.+)")
#: Bucket-level keys of the cluster layout, below the bucket's root (run bindings,
#: idempotency records and sessions' keys aside).
BUCKET_LEVEL = re.compile(
    r"~sessions|~names|__sessions__|~owned|~dirty|~summarize|~summarizer|~o:[^~]+~:(sessions|names)"
)


def _text(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


def _root(key: str) -> str:
    """The root a cluster-layout key starts with (``{prefix}:{tag}``), else the prefix."""
    match = re.match(re.escape(PREFIX) + r":\{[^}]+\}", key)
    return match.group(0) if match else PREFIX


def _below_root(key: str) -> str:
    return key[len(_root(key)) + 1 :]


Stored = dict[str, set[str]]


def stored(client: redis.Redis, root: str) -> Stored:
    """Members of every set and sorted set, and the value of every run binding, by key,
    of the keys under ``root``."""
    match = _glob_escape(root) + ":*"
    names = [_text(key) for key in client.scan_iter(match=match, count=1000)]
    pipe = client.pipeline(transaction=True)
    for name in names:
        pipe.type(name)
    kinds = [_text(kind) for kind in pipe.execute()]
    pipe = client.pipeline(transaction=True)
    read = []
    for name, kind in zip(names, kinds, strict=True):
        if kind == "set":
            pipe.smembers(name)
        elif kind == "zset":
            pipe.zrange(name, 0, -1)
        elif kind == "string" and RUN_REF.fullmatch(_below_root(name)):
            pipe.get(name)
        else:
            continue
        read.append(name)
    result: Stored = {}
    for name, reply in zip(read, pipe.execute(), strict=True):
        items = reply if isinstance(reply, (set, list)) else [reply] if reply else []
        result[name] = {_text(item) for item in items}
    return result


# 1. Every EVALSHA call declares its keys ------------------------------------------------


#: A line of MONITOR: '{time} [{db} {client}] "{command}" "{argument}" ...' (client "lua"
#: for a command a script ran), each argument quoted and escaped as sdscatrepr does.
MONITOR_LINE = re.compile(r"[\d.]+ \[\d+ ([^\]]*)\] (.*)", re.DOTALL)
MONITOR_ARGUMENT = re.compile(r'"((?:[^"\\]|\\.)*)"', re.DOTALL)
_ESCAPED = re.compile(r"\\(x[0-9a-fA-F]{2}|.)", re.DOTALL)
_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "a": "\a", "b": "\b"}


def _unescape(argument: str) -> str:
    def one(match: re.Match[str]) -> str:
        escaped = match.group(1)
        return chr(int(escaped[1:], 16)) if len(escaped) == 3 else _ESCAPES.get(escaped, escaped)

    return _ESCAPED.sub(one, argument)


def command_keys(client: redis.Redis, commands: list[list[str]]) -> set[str]:
    """The keys ``commands`` name, as the server finds them (COMMAND GETKEYS, which knows
    every command's key positions); commands with no key (TIME) give none."""
    commands = [command for command in commands if len(command) > 1]  # TIME: none, and GETKEYS refuses it
    pipe = client.pipeline(transaction=False)
    for command in commands:
        pipe.execute_command("COMMAND GETKEYS", *command)
    keys: set[str] = set()
    for command, reply in zip(commands, pipe.execute(raise_on_error=False), strict=True):
        if isinstance(reply, redis.ResponseError):
            assert "no key arguments" in str(reply), (command, reply)
            continue
        keys.update(_text(key) for key in reply)
    return keys


@dataclass
class Call:
    """One EVALSHA: its KEYS and ARGV, the keys Redis reported written, the keys of every
    command it ran (reads included) and those commands, what was stored before and after it."""

    keys: list[str]
    argv: list[str]
    written: set[str]
    touched: set[str]
    commands: list[list[str]]
    before: Stored
    after: Stored

    def members(self, key: str) -> set[str]:
        return self.before.get(key, set()) | self.after.get(key, set())

    @property
    def root(self) -> str:
        return self.keys[7].removesuffix(":__sessions__")


class WriteRecorder:
    """Sends the backend's commands one at a time and, after each, reads the keyspace
    notifications Redis published for it: up to a PUBLISH of our own on a channel the
    same subscriber follows, which Redis delivers after them (one thread, one output
    buffer per subscriber), so no wait depends on timing."""

    def __init__(self, backend: RedisBackend, client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
        self.backend = backend
        self.client = client
        self.calls: list[Call] = []
        self.others: list[tuple[tuple[Any, ...], set[str]]] = []
        self.marks = 0
        client.config_set("notify-keyspace-events", "KEA")
        database = client.connection_pool.connection_kwargs.get("db", 0)
        self.pubsub = client.pubsub()
        self.pubsub.psubscribe(f"__keyevent@{database}__:*")
        self.pubsub.subscribe(MARK)
        transport = backend.transport
        transport.load_everywhere()  # a call that finds the library missing would be sent twice
        monkeypatch.setattr(transport, "exchange", self._exchange(transport.exchange))
        monkeypatch.setattr(transport, "run_many", self._run_many)
        monkeypatch.setattr(backend.client, "execute_command", self._execute(backend.client.execute_command))
        monkeypatch.setattr(transport, "batch", self._batch(transport.batch))
        # A command sent beside a script (the run pointer), its reply read after the script's:
        # here it runs (and its writes are read) before the script is sent.
        self.replies: dict[int, Any] = {}
        monkeypatch.setattr(transport, "send", self._send(transport.send))
        monkeypatch.setattr(transport, "receive", self._receive)
        # Every command a script runs, reads included, as MONITOR shows it (client "lua").
        self.monitor = client.monitor()
        self.monitor.__enter__()

    def close(self) -> None:
        self.pubsub.close()
        self.monitor.__exit__()

    def observed(self) -> tuple[set[str], set[str], list[list[str]]]:
        """The keys written since the last call of this (an expiry is no command's), those
        the commands run by scripts meanwhile named (read or written), and those commands."""
        self.marks += 1
        self.client.publish(MARK, str(self.marks))
        written: set[str] = set()
        deadline = time.monotonic() + 60  # only so that a broken run ends
        while time.monotonic() < deadline:
            message = self.pubsub.get_message(timeout=1.0)
            if message is None:
                continue
            if message["type"] == "pmessage" and not _text(message["channel"]).endswith(":expired"):
                written.add(_text(message["data"]))
            elif message["type"] == "message" and _text(message["data"]) == str(self.marks):
                commands = self._scripted()
                return written, command_keys(self.client, commands), commands
        raise AssertionError("the mark never came back")

    def _scripted(self) -> list[list[str]]:
        """The commands scripts ran, read from MONITOR up to our mark (MONITOR shows every
        command in the order the server ran it)."""
        mark = ["PUBLISH", MARK, str(self.marks)]
        commands = []
        while True:
            line = _text(self.monitor.connection.read_response())
            client_info, arguments = MONITOR_LINE.match(line).groups()
            command = [_unescape(argument) for argument in MONITOR_ARGUMENT.findall(arguments)]
            if client_info == "lua":
                commands.append(command)
            elif command == mark:
                return commands

    def written(self) -> set[str]:
        written, scripted, _ = self.observed()
        assert not scripted, f"keys named by a script outside the backend's calls: {scripted}"
        return written

    def _between(self) -> None:
        stray = self.written()
        assert not stray, f"keys written by no command of the backend's: {stray}"

    def _exchange(self, exchange: Callable[..., Any]) -> Callable[..., Any]:
        # Also the script call beside a thread's tail (its third argument is then what it reads).
        def spy(connection: redis.Connection, command: tuple[Any, ...], wait: Any) -> Any:
            count = int(command[2])
            keys, argv = [str(k) for k in command[3 : 3 + count]], [str(a) for a in command[3 + count :]]
            root = keys[7].removesuffix(":__sessions__")
            self._between()
            before = stored(self.client, root)
            try:
                return exchange(connection, command, wait)
            finally:
                written, touched, commands = self.observed()
                after = stored(self.client, root)
                self.calls.append(Call(keys, argv, written, touched, commands, before, after))

        return spy

    def _send(self, send: Callable[..., Any]) -> Callable[..., Any]:
        def spy(command: tuple[Any, ...], wait: int) -> tuple[Any, Any, Any]:
            self._between()
            pool, connection, packet = send(command, wait)
            try:
                self.replies[id(connection)] = [connection.read_response() for _ in packet]
            except redis.ResponseError as exc:
                self.replies[id(connection)] = exc
            self.others.append((command, self.written()))
            return pool, connection, packet

        return spy

    def _receive(
        self, command: tuple[Any, ...], pool: Any, connection: redis.Connection, packet: Any
    ) -> None:
        pool.release(connection)
        reply = self.replies.pop(id(connection))
        if isinstance(reply, Exception):
            raise reply

    def _run_many(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        """The pipelined EVALSHAs one by one, so that each one's writes are its own."""
        pool = self.backend.client.connection_pool
        replies: list[Any] = []
        for command in commands:
            connection = pool.get_connection()
            try:
                replies.append(self.backend.transport.exchange(connection, command, 0))
            except redis.ResponseError as exc:  # as a pipeline gives it (raise_on_error=False)
                replies.append(exc)
            finally:
                pool.release(connection)
        return replies

    def _execute(self, execute: Callable[..., Any]) -> Callable[..., Any]:
        def spy(*args: Any, **options: Any) -> Any:
            self._between()
            try:
                return execute(*args, **options)
            finally:
                self.others.append((args, self.written()))

        return spy

    def _batch(self, batch: Callable[..., list[Any]]) -> Callable[..., list[Any]]:
        def spy(commands: list[tuple[Any, ...]], key_at: int = 1) -> list[Any]:
            self._between()
            try:
                return batch(commands, key_at)
            finally:
                # The sweep's compare-and-delete of run pointers is a script of its own.
                written, touched, _ = self.observed()
                self.others.append((tuple(tuple(command) for command in commands), written | touched))

        return spy


def named_from_storage(key: str, call: Call) -> str | None:
    """Why ``key``, touched by ``call`` and not declared, may be touched (see the module's
    docstring), or None when nothing the call names or Redis holds leads to it."""
    root = call.root
    if not key.startswith(root + ":"):
        return None
    rest = key[len(root) + 1 :]
    index_sets = [name for name in call.before.keys() | call.after.keys() if name.startswith(root + ":")]
    indexed = {
        member
        for name in index_sets
        if INDEX.fullmatch(name[len(root) + 1 :]) and name in call.keys
        for member in call.members(name)
    }
    # The sessions the call's declared run bindings name (an answer given only a run id,
    # the sweep of leftover bindings).
    bound = {
        value.split(" ")[0]
        for name in call.keys
        if RUN_REF.fullmatch(name[len(root) + 1 :])
        for value in call.members(name)
    }
    sessions = indexed | bound | {call.argv[2]}
    if RUN_REF.fullmatch(rest):
        runs = [name for name in index_sets if name.endswith(":~runs")]
        return "run binding in a run index" if any(rest in call.members(name) for name in runs) else None
    listing = INDEX.fullmatch(rest)
    if listing and listing.group(2):
        return "listing of an indexed id" if any(s.startswith(listing.group(2)) for s in indexed) else None
    parts = SESSION_KEY.fullmatch(rest)
    if parts is None or parts.group(1) not in sessions:
        return None
    base, suffix = f"{root}:{parts.group(1)}:", parts.group(2)
    if suffix in FIXED:
        # The call's own session's are declared; another's come from what Redis holds.
        return "fixed key of an indexed or bound session" if parts.group(1) != call.argv[2] else None
    # Value keys and conversations held before the call: one written that the call adds
    # is named from its arguments, and must be declared.
    if suffix in call.before.get(base + "__keys__", ()):
        return "value key in a key set"
    conversation = suffix[3:].split(":")[0] if suffix.startswith("~c:") else None
    if conversation and conversation in call.before.get(base + "~convs", ()):
        return "conversation in a conversation set"
    # An answer given only its run (one call in the node layout): its session comes from
    # the binding, so the keys of the conversation it records into cannot be declared.
    # (The cluster layout reads the session first and declares them.)
    by_run = call.argv[0] == "answer" and call.argv[2] == "" and parts.group(1) in bound
    if by_run and (suffix in ANSWER_KEYS or conversation == call.argv[20]):
        return "answer by run: its session's keys"
    return None


#: Which argument of an operation names a value key, a run binding or a conversation (arg(i)
#: is ARGV[16 + i]).
VALUE_ARGUMENT = {"put": 1, "increment": 1, "clear": 1}
RUN_ARGUMENT = {"enrich": 3, "answer": 4}
CONVERSATION_ARGUMENT = {
    **dict.fromkeys(("messages", "read_messages", "context", "head", "clear_messages"), 1),
    **dict.fromkeys(("summary_source", "commit_summary"), 1),
    **dict.fromkeys(("enrich", "answer"), 5),
}


def named_by_arguments(call: Call, layout: Layout) -> set[str]:
    """The keys ``call`` names from its arguments: each must be declared when touched (even
    one its session's key set or conversation set already holds, or an index names)."""
    op, sid = call.argv[0], call.argv[2]
    named: set[str] = set()

    def argument(place: int) -> str:
        return call.argv[15 + place] if len(call.argv) > 15 + place else ""

    if op in RUN_ARGUMENT and argument(RUN_ARGUMENT[op]):
        named.add(f"{call.root}:{argument(RUN_ARGUMENT[op])}")
    # Sessions the call is given by id (the sweep's): their fixed keys and listings.
    indexes = [name for name in call.before.keys() | call.after.keys() if INDEX.fullmatch(_below_root(name))]
    held = {member for name in indexes for member in call.members(name)}
    for given in call.argv[16:]:
        if given != sid and given in held and SESSION_KEY.fullmatch(f"{given}:__meta__"):
            named.update(f"{call.root}:{given}:{suffix}" for suffix in FIXED)
            namespace = re.match(r"~o:[^~]+~", given)
            listing = f"{call.root}:{namespace.group(0)}:" if namespace else f"{call.root}:~"
            named.update((listing + "sessions", listing + "names"))
    # The keys a call is given (the sweep's, from KEYS[28] on): their sessions' metas.
    for given in call.keys[27:]:
        parts = SESSION_KEY.fullmatch(_below_root(given))
        if parts:
            named.add(f"{call.root}:{parts.group(1)}:__meta__")
    if not sid:  # an answer by run alone (node layout): see named_from_storage
        return named
    if op in VALUE_ARGUMENT and argument(VALUE_ARGUMENT[op]):
        named.add(layout.value_key(sid, argument(VALUE_ARGUMENT[op])))
    if op in CONVERSATION_ARGUMENT and argument(CONVERSATION_ARGUMENT[op]):
        named.update(layout.conversation_keys(sid, argument(CONVERSATION_ARGUMENT[op])))
    return named


def check_calls(recorder: WriteRecorder, layout: Layout) -> dict[str, int]:
    """Assert the rule on every key every recorded call read or wrote; how many keys each
    reason covered."""
    reasons: dict[str, int] = {}
    undeclared: dict[str, set[str]] = {}
    uses: dict[str, set[str]] = {}  # reason -> the operations that gave it
    for call in recorder.calls:
        op = call.argv[0]
        touched = call.written | call.touched
        assert all(key.startswith(call.root + ":") for key in call.keys), (op, call.keys)
        if layout.cluster:
            slots = {layout.slot(key) for key in call.keys}
            assert len(slots) == 1, f"{op} declares keys in slots {slots}: {call.keys}"
            strays = {key for key in touched if layout.slot(key) not in slots}
            assert not strays, f"{op} touched keys outside the slot of its KEYS: {strays}"
        named = named_by_arguments(call, layout)
        for key in touched:
            if key in call.keys:
                reason = "declared"
            else:  # named from the call's arguments, it must be declared
                reason = None if key in named else named_from_storage(key, call)
            if reason is None:
                undeclared.setdefault(op, set()).add(f"{'writes' if key in call.written else 'reads'} {key}")
            else:
                reasons[reason] = reasons.get(reason, 0) + 1
                uses.setdefault(reason, set()).add(op)
    print({reason: sorted(ops) for reason, ops in uses.items()})
    assert not undeclared, f"{len(undeclared)} operations touch undeclared keys:\n" + "\n".join(
        f"{op}: {sorted(keys)}" for op, keys in sorted(undeclared.items())
    )
    for command, written in recorder.others:
        if not written:
            continue
        # The cluster layout's run pointer: set beside the enrich lane's script, deleted by the
        # sweep's compare-and-delete (an EVAL declaring it) once its binding has gone.
        if isinstance(command[0], tuple):  # a pipeline: the sweep's compare-and-deletes
            assert layout.cluster and {c[0] for c in command} == {"EVAL"}, (command, written)
            pointers = {str(c[3]) for c in command}
            reason = "run pointer swept"
        else:
            assert layout.cluster and command[0] == "SET", (command, written)
            pointers = {str(command[1])}
            reason = "run pointer"
        assert written <= pointers, (command, written)
        assert all(RUN_REF.fullmatch(pointer.removeprefix(PREFIX + ":")) for pointer in written), written
        reasons[reason] = reasons.get(reason, 0) + 1
    return reasons


class Workload:
    """Seeded random operations of every kind on a few sessions of three namespaces (the
    unowned one and two owners); failures the store reports (a session not found, a
    message id gone with its conversation) are part of the workload."""

    def __init__(self, store: MemoryStore, seed: int, lifetimes: list[tuple[float, float | None]]) -> None:
        self.store = store
        self.rng = random.Random(seed)
        self.lifetimes = lifetimes  # (ttl_seconds, idle_ttl_seconds) a create picks from
        self.messages: dict[tuple[str, str, str], list[str]] = {}
        self.runs: list[tuple[str, str]] = []
        self.created: dict[tuple[str, str], float | None] = {}  # (owner, id) -> expires_at
        self.refs: list[str] = []  # channel values of checkpoints
        self.count = 0

    def _scoped(self) -> tuple[str, MemoryStore, str]:
        owner = self.rng.choice(OWNERS)
        scoped = self.store.for_owner(owner) if owner else self.store
        return owner, scoped, f"s{self.rng.randrange(3)}"

    def _name(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def step(self, name: str | None = None, session: tuple[str, str] | None = None) -> str:
        """One operation (``name``, else a random one) on ``session`` (owner, id; else a random
        one); its name."""
        operations = self.operations(session)
        # What walks every bucket (64 calls in the cluster layout) comes less often.
        walks = ("list", "page", "infos", "ids", "sweep")
        weights = [0.3 if op in walks else 1.0 for op in operations]
        name = name or self.rng.choices(list(operations), weights)[0]
        with suppress(PersistentMemoryError):
            operations[name]()
        return name

    def operations(self, session: tuple[str, str] | None = None) -> dict[str, Callable[[], Any]]:
        """Every kind of operation, by name, on ``session`` (else a random owner's session)
        and a random conversation."""
        owner, scoped, sid = self._scoped()
        if session is not None:
            owner, sid = session
            scoped = self.store.for_owner(owner) if owner else self.store
        conversation = self.rng.choice(CONVERSATIONS)
        ids = self.messages.setdefault((owner, sid, conversation), [])
        return {
            "create": lambda: self._create(owner, scoped, sid),
            "put": lambda: scoped.put(sid, self.rng.choice("abc"), {"n": self.rng.randrange(9)}),
            "put_once": lambda: scoped.put(
                sid, "a", 1, idempotency=Idempotency.of(self._name("k"), "put", sid)
            ),
            "increment": lambda: scoped.increment(sid, "n", 1),
            "clear_one": lambda: scoped.clear(sid, self.rng.choice("abc")),
            "clear_all": lambda: scoped.clear(sid, None),
            "delete": lambda: scoped.delete_session(sid),
            "enrich": lambda: self._enrich(owner, scoped, sid, conversation),
            "answer_by_run": lambda: self._answer(owner, scoped),
            "answer": lambda: scoped.record_answer(sid, "an answer", conversation=conversation),
            "add_messages": lambda: self._add(owner, scoped, sid, conversation, ids),
            "set_head": lambda: scoped.set_head(sid, self._message(ids), conversation=conversation),
            "clear_messages": lambda: scoped.clear_messages(sid, conversation=conversation),
            "context": lambda: scoped.get_context(sid, conversation=conversation),
            "summary": lambda: self._summary(owner, scoped, sid, conversation),
            "list": lambda: scoped.list_sessions(),
            "page": lambda: scoped.list_session_page(
                self.rng.choice(["", "s"]), offset=self.rng.choice([0, 0, 2]), limit=3
            ),
            "infos": lambda: self.store.list_session_infos(all_owners=True),
            "ids": lambda: self.store.backend.list_sessions(),
            "sweep": lambda: self.store.backend.sweep(dry_run=False, batch_size=3),
            "get": lambda: scoped.get(sid, self.rng.choice("abc")),
            "get_all": lambda: scoped.get_all(sid),
            "keys": lambda: scoped.list_keys(sid),
            "history": lambda: scoped.get_history(sid),
            "summarize": lambda: scoped.summarize(sid, 2),
            "info": lambda: scoped.session_info(sid),
            "messages": lambda: scoped.get_messages(sid, conversation=conversation),
            "conversations": lambda: scoped.list_conversations(sid),
            "pop": lambda: scoped.pop_message(sid, self._message(ids), conversation=conversation),
            "thread": lambda: self._thread(scoped, sid, conversation),
            "summary_source": lambda: self.store.backend.summary_source(storage_id(owner, sid), conversation),
            "export": lambda: self._export(owner, sid),
            "checkpoint": lambda: self._checkpoint(scoped, sid),
            "checkpoint_read": lambda: self._checkpoint_read(scoped, sid),
            "checkpoint_prune": lambda: scoped.prune_checkpoints(sid),
            "checkpoint_runs": lambda: scoped.delete_checkpoint_runs(sid, [self.rng.choice(["r1", "r2"])]),
            "checkpoint_copy": lambda: self._checkpoint_copy(scoped, sid),
        }

    def _create(self, owner: str, scoped: MemoryStore, sid: str) -> None:
        ttl, idle = self.rng.choice(self.lifetimes)
        info = scoped.create_session(sid, ttl_seconds=ttl, idle_ttl_seconds=idle)
        self.created[(owner, sid)] = info["expires_at"]

    def _enrich(self, owner: str, scoped: MemoryStore, sid: str, conversation: str) -> None:
        run = self._name("r")
        self.runs.append((owner, run))
        if self.rng.random() < 0.5:
            scoped.enrich(sid, run_id=run)
        else:
            scoped.enrich_recording(sid, "a question", conversation=conversation, run_id=run)

    def _answer(self, owner: str, scoped: MemoryStore) -> None:
        mine = [run for who, run in self.runs if who == owner]
        run = self.rng.choice(mine) if mine else self._name("r")
        scoped.record_answer(None, "an answer by run", run_id=run)

    def _add(self, owner: str, scoped: MemoryStore, sid: str, conversation: str, ids: list[str]) -> None:
        parent = self.rng.choice(ids) if ids and self.rng.random() < 0.3 else None  # a branch
        batch = [{"role": "user", "content": "hello " * 3}, {"role": "assistant", "content": "hi"}]
        added = scoped.add_messages(sid, batch, conversation=conversation, parent_id=parent)
        ids.extend(message["id"] for message in added["messages"])

    def _message(self, ids: list[str]) -> str:
        """A message id of the conversation (one perhaps gone since), or one it never had."""
        return self.rng.choice(ids) if ids else "never-added"

    def _thread(self, scoped: MemoryStore, sid: str, conversation: str) -> None:
        """A compare-and-set of a conversation and its record (written, or removed)."""
        record = scoped.get_all(sid).get("record") if self.rng.random() < 0.7 else None
        expected = record["revision"] if record else None
        if expected and self.rng.random() < 0.3:
            scoped.remove_thread(sid, key="record", expected=expected, conversation=conversation)
            return
        messages = [{"role": "user", "content": "in a thread"}]
        revision = self._name("v")
        scoped.write_thread(
            sid,
            key="record",
            expected=expected,
            record={"revision": revision},
            messages=messages,
            conversation=conversation,
        )

    def _export(self, owner: str, sid: str) -> None:
        """A session as exported (with its checkpoints), imported again in its place."""
        backend = self.store.backend
        snapshot = backend.snapshots([storage_id(owner, sid)], checkpoints=True)[storage_id(owner, sid)]
        if snapshot is not None:
            backend.restore_session(snapshot, replace=True)

    def _checkpoint(self, scoped: MemoryStore, sid: str) -> None:
        checkpoint, ref = self._name("c"), f"channel\x1f{self._name('v')}"
        run = self.rng.choice(["r1", "r2"])
        scoped.put_checkpoint(sid, "", checkpoint, "record", run_id=run, refs=[ref], blobs={ref: "value"})
        scoped.put_checkpoint_writes(sid, "", checkpoint, [("task", 0, "channel", "value", "")])
        self.refs.append(ref)

    def _checkpoint_read(self, scoped: MemoryStore, sid: str) -> None:
        scoped.get_checkpoint(sid, "")
        scoped.list_checkpoints(sid)
        scoped.checkpoint_chain(sid, "", self.rng.choice(self.refs) if self.refs else "channel\x1fv")

    def _checkpoint_copy(self, scoped: MemoryStore, sid: str) -> None:
        """Another session's checkpoint entries added to this one's."""
        entries = scoped.checkpoint_entries(f"s{self.rng.randrange(3)}")
        if entries:
            scoped.load_checkpoint_entries(sid, entries)

    def _summary(self, owner: str, scoped: MemoryStore, sid: str, conversation: str) -> None:
        messages = scoped.get_messages(sid, conversation=conversation)["messages"]
        if messages:
            anchor = messages[0]
            summary = Summary("what came before", anchor["id"], anchor["seq"], 3, 10)
            self.store.backend.commit_summary(storage_id(owner, sid), conversation, None, summary)


@pytest.fixture
def node_server(redis_client: redis.Redis) -> Iterator[redis.Redis]:
    """The test session's server, clean, with keyspace notifications back off at the end."""
    yield redis_client
    redis_client.config_set("notify-keyspace-events", "")


@pytest.mark.parametrize("layout", ["node", "cluster"])
@pytest.mark.parametrize("seed", [1, 2])
def test_every_evalsha_call_declares_its_keys(settings, redis_url, node_server, monkeypatch, layout, seed):
    settings.PERSISTENT_MEMORY = memory_settings_for(
        "redis",
        redis_url,
        REDIS_LAYOUT=layout,
        CONTEXT_STRATEGY="rolling_summary",
        SUMMARIZER_WORKER=False,  # its thread would send commands beside the recorded ones
        # At a cap an owner's index is read through (seed 2); under one, the cluster layout
        # counts the owner's sessions in the other buckets.
        MAX_SESSIONS_PER_OWNER=2 if seed == 2 else 50,
        IDLE_TTL_REFRESH_ON_READ=seed == 2,  # reads then push the idle expiry of every key
    )
    store = get_store()
    recorder = WriteRecorder(store.backend, node_server, monkeypatch)
    try:
        workload = Workload(store, seed, [(LONG_TTL, None), (LONG_TTL, IDLE_TTL), (0, None)])
        done = {workload.step() for _ in range(150)}
        # Then every kind, on a session with an idle TTL (deleted last). A call pushes the
        # idle expiry of every key of its session only once it would move by a hundredth of
        # the idle TTL: let that much time pass before each.
        store.create_session("idle", ttl_seconds=LONG_TTL, idle_ttl_seconds=IDLE_TTL)
        for name in sorted(workload.operations(), key=lambda name: name == "delete"):
            time.sleep(IDLE_TTL / 100)
            done.add(workload.step(name, ("", "idle")))
    finally:
        recorder.close()
    reasons = check_calls(recorder, store.backend.layout)
    # Every operation of the script was called (an owner's count and a bucket's part of a
    # page are the cluster layout's, a page of the one index the node layout's).
    called = {call.argv[0] for call in recorder.calls}
    expected = SCRIPT_OPERATIONS - ({"owner_count", "bucket_page"} if layout == "node" else {"page"})
    assert called >= expected, expected - called
    pushed = {
        call.argv[0]
        for call in recorder.calls
        if any(command[:2] == ["PEXPIREAT", call.keys[17]] for command in call.commands)
    }
    assert len(pushed) > 10, pushed  # every key of the session, the checkpoints (KEYS[18]) too
    # The check saw every kind of write it allows, so it could have failed on each.
    assert reasons["declared"] > 100
    assert reasons["value key in a key set"] and reasons["conversation in a conversation set"], reasons
    assert reasons["run binding in a run index"], reasons
    assert ("run pointer" in reasons) == (layout == "cluster"), reasons
    if layout == "cluster":  # every key of a call known before it: none named late
        assert "answer by run: its session's keys" not in reasons, reasons


# 2. The cluster layout: buckets, expiry, the sweep and forgetting an owner ----------------

IDEMPOTENCY_RECORD = re.compile(r"(~idem:|~o:[^~]+~:idem:).+")
#: PEXPIRETIME of keys of one session: set from the meta's in the same script (absolute), so
#: equal; a relative PTTL copy made in the same script stays within this.
TOLERANCE_MS = 5


@pytest.fixture(params=["one-server", "redis-cluster"])
def cluster_layout(
    request: pytest.FixtureRequest, settings: Any
) -> Iterator[tuple[MemoryStore, list[redis.Redis]]]:
    """The store in the cluster layout, on one server or on a real cluster (clean), and a
    client on each server that holds its keys."""
    if request.param == "one-server":
        nodes = [request.getfixturevalue("redis_client")]
        conf = memory_settings_for("redis", request.getfixturevalue("redis_url"), REDIS_LAYOUT="cluster")
    else:
        cluster = request.getfixturevalue("redis_cluster")
        request.getfixturevalue("redis_cluster_client")  # whole, and flushed
        nodes = [redis.Redis(host=host, port=port) for host, port in cluster.primaries()]
        conf = memory_settings_for("redis", cluster.url, REDIS_TOPOLOGY="cluster")
    settings.PERSISTENT_MEMORY = {**conf, "CONTEXT_STRATEGY": "rolling_summary", "SUMMARIZER_WORKER": False}
    store = get_store()
    assert store.backend.layout.cluster
    yield store, nodes
    if request.param != "one-server":
        for node in nodes:
            node.close()


def keyspace(nodes: list[redis.Redis]) -> dict[str, redis.Redis]:
    """Every key, with the server that holds it."""
    return {_text(key): node for node in nodes for key in node.scan_iter(count=1000)}


def expiry_times(node: redis.Redis, *keys: str) -> list[int]:
    """PEXPIRETIME of ``keys`` read at one moment (MULTI), so no key expires between them."""
    pipe = node.pipeline(transaction=True)
    for key in keys:
        pipe.pexpiretime(key)
    return pipe.execute()


def stored_names(nodes: list[redis.Redis]) -> dict[str, set[str]]:
    """Every member of every set and sorted set, and every run binding's or pointer's
    session, on every server: each storage id with the keys that hold it."""
    found: dict[str, set[str]] = {}
    for key, node in keyspace(nodes).items():
        kind = _text(node.type(key))
        if kind == "set":
            names = {_text(m) for m in node.smembers(key)}
        elif kind == "zset":
            names = {_text(m) for m in node.zrange(key, 0, -1)}
        elif kind == "string" and RUN_REF.fullmatch(_below_root(key)):
            names = {_text(node.get(key) or b"")}
        else:
            continue
        for name in names:  # a queue's "{id} {conversation}", a binding's "{id} {question}"
            found.setdefault(name.split(" ")[0], set()).add(key)
    return found


def check_cluster_keys(store: MemoryStore, nodes: list[redis.Redis]) -> dict[str, int]:
    """Every key is in its session's bucket and expires with its session; how many of each kind."""
    layout: Layout = store.backend.layout
    roots = set(layout.roots())
    kinds: dict[str, int] = {}
    for key, node in keyspace(nodes).items():
        below = key.removeprefix(PREFIX + ":")
        if RUN_REF.fullmatch(below):  # a run pointer: its own slot, its own TTL
            assert expiry_times(node, key)[0] != -1, f"{key} never expires"  # -2: expired meanwhile
            kinds["run pointer"] = kinds.get("run pointer", 0) + 1
            continue
        root = _root(key)
        assert root in roots, f"{key} is in no bucket"
        rest = key[len(root) + 1 :]
        if BUCKET_LEVEL.fullmatch(rest):
            kind = "bucket"
            if _text(node.type(key)) in ("set", "zset"):
                members = node.smembers(key) if _text(node.type(key)) == "set" else node.zrange(key, 0, -1)
                for member in members:
                    sid = _text(member).split(" ")[0]  # the summarizers' queue: "{id} {conversation}"
                    assert layout.root_of(sid) == root, f"{sid} of {key} is another bucket's"
        elif IDEMPOTENCY_RECORD.fullmatch(rest):
            kind = "idempotency record"
            assert expiry_times(node, key)[0] != -1, f"{key} never expires"
        elif RUN_REF.fullmatch(rest):
            kind = "run binding"
            value = node.get(key)
            if value is None:  # expired since the SCAN
                continue
            sid = _text(value).split(" ")[0]
            meta = f"{root}:{sid}:__meta__"
            assert layout.root_of(sid) == root, f"{key} binds {sid}, of another bucket"
            binding, session = expiry_times(node, key, meta)
            assert binding != -1 and (binding == -2 or session < 0 or binding <= session + TOLERANCE_MS), key
        else:
            parts = SESSION_KEY.fullmatch(rest)
            assert parts, f"{key}: not a key of the layout"
            sid = parts.group(1)
            assert layout.root_of(sid) == root, f"{key} is not in the bucket of {sid}"
            own, meta = expiry_times(node, key, f"{root}:{sid}:__meta__")
            if own != -2:  # expired meanwhile, with its meta (read at one moment)
                assert meta != -2, f"{key} outlives its session's meta"
                assert (own == meta == -1) or (min(own, meta) > 0 and abs(own - meta) <= TOLERANCE_MS), (
                    f"{key} expires at {own}, its session at {meta}"
                )
            kind = "session key"
        kinds[kind] = kinds.get(kind, 0) + 1
    return kinds


def test_cluster_layout_keys_stay_in_their_bucket_expire_with_their_session_and_go(cluster_layout, db):
    store, nodes = cluster_layout
    workload = Workload(store, 7, [(LONG_TTL, None), (LONG_TTL, LONG_TTL), (0, None), (0, LONG_TTL)])
    for _ in range(150):
        workload.step()
    # Sessions that expire soon, by their TTL or their idle TTL, with a key of every kind.
    doomed: dict[str, float] = {}
    for owner in OWNERS:
        scoped = store.for_owner(owner) if owner else store
        for sid, lifetime in (
            ("d1", {"ttl_seconds": LIVE_TTL}),
            ("d2", {"ttl_seconds": 0, "idle_ttl_seconds": LIVE_TTL}),
        ):
            scoped.create_session(sid, **lifetime)
            scoped.put(sid, "a", 1)
            scoped.enrich_recording(sid, "a question", run_id=f"{sid}run")
            scoped.record_answer(None, "an answer", run_id=f"{sid}run")
            scoped.add_messages(sid, [{"role": "user", "content": "hello"}], conversation="side")
            doomed[storage_id(owner, sid)] = scoped.session_info(sid)["expires_at"]
    kinds = check_cluster_keys(store, nodes)
    assert kinds["session key"] > 100 and kinds["bucket"] and kinds["run binding"], kinds
    assert kinds["idempotency record"] and ("run pointer" in kinds), kinds

    wait_past(max(doomed.values()))
    assert set(doomed) <= stored_names(nodes).keys()  # indexed until swept
    # A pointer is swept once its binding has gone and it is older than the grace (60 s): no waiting here.
    store.backend.maintenance.POINTER_GRACE_SECONDS = 0
    report = maintenance.sweep(store=store)
    assert report.expired_sessions >= len(doomed)
    left = [key for key in keyspace(nodes) if any(f":{sid}:" in key for sid in doomed)]
    assert left == []
    # Nothing names them any more: not even a run pointer (outside the buckets, swept once
    # the binding in the session's bucket has gone).
    holders = stored_names(nodes)
    assert {key for sid in doomed for key in holders.get(sid, ())} == set()
    check_cluster_keys(store, nodes)

    # Forgetting an owner leaves no key naming it, and no member or pointer naming it.
    mark = "~o:user:a~"
    assert any(mark in key for key in keyspace(nodes))
    forget_owner("user:a", store=store)
    assert [key for key in keyspace(nodes) if mark in key] == []
    assert [name for name in stored_names(nodes) if mark in name] == []
    assert any("~o:user:b~" in key for key in keyspace(nodes))  # the other owner's stay
    check_cluster_keys(store, nodes)


# 3. Key distribution over a real cluster's primaries -------------------------------------

SESSIONS = 5000
#: The most loaded primary over the least. The issue's 1.2 is for the benchmark's 100,000
#: sessions; 5,000 spread with more noise (each primary holds 21 or 22 of the 64 buckets).
MAX_SKEW = 1.3


def test_cluster_layout_spreads_sessions_evenly_over_the_primaries(
    settings, redis_cluster, redis_cluster_client
):
    settings.PERSISTENT_MEMORY = memory_settings_for("redis", redis_cluster.url, REDIS_TOPOLOGY="cluster")
    store = get_store()
    owners = ["", "user:1", "user:2", "user:3", "api"]
    for n in range(SESSIONS):
        owner = owners[n % len(owners)]
        scoped = store.for_owner(owner) if owner else store
        scoped.create_session(f"s{n}", ttl_seconds=LONG_TTL)
    counts = []
    for host, port in redis_cluster.primaries():
        with redis.Redis(host=host, port=port) as node:
            counts.append(node.dbsize())
    assert sum(counts) > SESSIONS  # every session's meta, and each bucket's indexes
    ratio = max(counts) / min(counts)
    print(f"keys per primary {counts}: most/least {ratio:.3f}")
    assert ratio <= MAX_SKEW, counts


def test_the_sweep_leaves_a_young_run_pointer_and_removes_one_whose_binding_went(cluster_layout, db):
    """A pointer is set beside the script that binds its run: a sweep that ran between the
    two would see no binding yet, so it only removes pointers older than the grace."""
    store, nodes = cluster_layout
    store.enrich("s1", run_id="r1")
    pointer = store.backend.layout.run_pointer("~run:r1")
    store.delete_session("s1")  # the binding goes with the session; the pointer stays
    assert store.record_answer(None, "late", run_id="r1") is None  # it leads nowhere
    assert pointer in keyspace(nodes)
    maintenance.sweep(store=store)
    assert pointer in keyspace(nodes)  # young: left alone
    store.backend.maintenance.POINTER_GRACE_SECONDS = 0
    maintenance.sweep(store=store)
    assert pointer not in keyspace(nodes)
