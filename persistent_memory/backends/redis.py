"""The Redis backend: the node's key layout, one round trip per operation.

Every operation is one EVALSHA of ``redis.lua``, which keeps each write atomic with
its history entry, TTL alignment and summarization. Layout, byte for byte the
original node's (so either can read the other's data)::

    {prefix}:{session_id}:{key}         value as JSON text (counters: Redis integers)
    {prefix}:{session_id}:__keys__      set of the session's keys
    {prefix}:{session_id}:__history__   list of JSON history entries
    {prefix}:{session_id}:__meta__      hash: created_at, ttl_seconds
    {prefix}:__sessions__               set of session ids

Owned sessions use the same layout with their storage id (``~o:{owner}~{session_id}``,
see :mod:`persistent_memory.owners`) in place of the session id; all owned ids are in
``{prefix}:~owned``. The listing keeps each namespace's ids in two sorted sets, by
creation time and by name: ``{prefix}:~o:{owner}~:sessions`` and ``...:names`` for an
owner, ``{prefix}:~sessions`` and ``{prefix}:~names`` for the unowned namespace. A
session's run references are in ``{prefix}:{session_id}:~runs``.
Idempotency records (:mod:`persistent_memory.idempotency`) are ``{prefix}:~idem:{key}``
and ``{prefix}:~o:{owner}~:idem:{key}``, each expiring after its TTL.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from typing import Any

import redis
from django.core.exceptions import ImproperlyConfigured
from django.views.decorators.debug import sensitive_variables
from redis.backoff import NoBackoff
from redis.retry import Retry

from persistent_memory.backends.base import (
    AnswerRecord,
    BaseBackend,
    IdempotencyRecord,
    RunBinding,
    SessionInfo,
    SessionSnapshot,
    remaining_seconds,
    session_info,
)
from persistent_memory.backends.conversations import Answer
from persistent_memory.backends.redis_conversations import (
    RedisConversations,
    RedisSummaries,
    message_args,
    restore_blob,
    snapshot_conversations,
)
from persistent_memory.conf import MemorySettings, mirror_mode, owner_session_cap, summarize_after_tokens
from persistent_memory.exceptions import (
    BackendUnavailable,
    CapacityExceeded,
    IdempotencyKeyReused,
    KeyNotFound,
    MessageConflict,
    MessageNotFound,
    NotANumber,
    OrphanToolResult,
    PersistentMemoryError,
    QuotaExceeded,
    SessionExists,
    SessionExpired,
    SessionNotFound,
)
from persistent_memory.owners import namespace_of


def _script() -> str:
    """redis.lua with the files it includes (``-- @include name.lua`` lines) in their place."""
    files = resources.files("persistent_memory.backends")
    text = files.joinpath("redis.lua").read_text()
    return re.sub(r"^-- @include (\S+)$", lambda m: files.joinpath(m.group(1)).read_text(), text, flags=re.M)


SCRIPT = _script()

#: Up to this many sessions, listing them is one script; beyond, batches (see redis.lua).
ONE_STEP_LIST_LIMIT = 2000


class _TooMany(Exception):
    """redis.lua declined to list every session in one step."""


# Reply prefixes of redis.lua's errors.
_SCRIPT_ERRORS: dict[str, type[PersistentMemoryError]] = {
    "PM_NOT_FOUND": SessionNotFound,
    "PM_EXPIRED": SessionExpired,
    "PM_EXISTS": SessionExists,
    "PM_KEY_NOT_FOUND": KeyNotFound,
    "PM_NOT_A_NUMBER": NotANumber,
    "PM_QUOTA": QuotaExceeded,
    "PM_IDEMPOTENCY_REUSED": IdempotencyKeyReused,
    "PM_MESSAGE_NOT_FOUND": MessageNotFound,
    "PM_MESSAGE_CONFLICT": MessageConflict,
    "PM_ORPHAN_TOOL_RESULT": OrphanToolResult,
}

#: ARGV 14-16 of a call without an idempotency key (see redis.lua).
_NO_IDEMPOTENCY = ("", "", "0")


def _ttl_text(ttl_seconds: float | None) -> str:
    # The node writes "None" for no TTL and a number otherwise.
    return "None" if ttl_seconds is None else repr(ttl_seconds)


def _parse_ttl(raw: bytes | None) -> float | None:
    if raw is None or raw == b"None":
        return None
    text = raw.decode()
    return int(text) if text.lstrip("-").isdigit() else float(text)


def _seconds(ms: str) -> float | int | None:
    """Milliseconds as the script writes them ('' for none) in seconds."""
    if not ms:
        return None
    seconds = int(ms) / 1000
    return int(seconds) if seconds.is_integer() else seconds


def _ttl_ms(ttl_seconds: float | None) -> str:
    return "0" if ttl_seconds is None else str(max(1, round(ttl_seconds * 1000)))


def _glob_escape(text: str) -> str:
    """``text`` as a literal in a SCAN/SSCAN MATCH pattern."""
    return re.sub(r"([\\*?\[\]])", r"\\\1", text)


def _idle_args(info: SessionInfo) -> str:
    """The restore op's idle TTL: "{idle ms} {ms left to the fixed deadline}" ('' for none)."""
    idle = info.get("idle_ttl_seconds")
    if not idle:
        return ""
    if info["ttl_seconds"] is None:
        return _ttl_ms(idle)
    left = info["created_at"] + info["ttl_seconds"] - time.time()
    return f"{_ttl_ms(idle)} {max(1, round(left * 1000))}"


# Error reports (DEBUG off) hide every local of this call and of the calls it makes
# (redis-py's URL parsing holds the password).
@sensitive_variables()
def _build_client(conf: MemorySettings) -> redis.Redis:
    """A client from REDIS_CACHE_ALIAS, REDIS_URL, or host/port (in that order)."""
    if conf.REDIS_CACHE_ALIAS:
        from django_redis import get_redis_connection

        return get_redis_connection(conf.REDIS_CACHE_ALIAS)
    options: dict[str, Any] = {
        "socket_timeout": conf.REDIS_SOCKET_TIMEOUT,
        "socket_connect_timeout": conf.REDIS_SOCKET_TIMEOUT,
        # No retries: a reply lost after the script ran cannot be told from a command
        # never sent, and running a write twice (an increment, a history entry) is
        # wrong. The caller gets BackendUnavailable (the API: 503 with Retry-After).
        "retry": Retry(NoBackoff(), 0),
    }
    if conf.REDIS_URL:
        return redis.Redis.from_url(conf.REDIS_URL, **options)
    if not conf.REDIS_HOST:
        raise ImproperlyConfigured("PERSISTENT_MEMORY: the redis backend needs REDIS_URL or REDIS_HOST.")
    return redis.Redis(
        host=conf.REDIS_HOST, port=conf.REDIS_PORT, db=conf.REDIS_DB, password=conf.REDIS_PASSWORD, **options
    )


class RedisBackend(RedisConversations, RedisSummaries, BaseBackend):
    """Sessions in Redis, shared by every process that points at the same server."""

    name = "redis"

    def __init__(
        self,
        *,
        client: redis.Redis,
        key_prefix: str = "rr:memory",
        owns_client: bool = True,
        **options: Any,
    ) -> None:
        super().__init__(**options)
        self.client = client
        self.owns_client = owns_client
        self.key_prefix = key_prefix
        self._dirty_key = f"{key_prefix}:~dirty"
        # ARGV 5-13 of every call (see redis.lua); 14-16 are the idempotency key's.
        self._policy = (
            str(self.max_history),
            "1" if self.auto_summarize else "0",
            "1" if self.track_dirty else "0",
            str(self.max_sessions_per_owner or 0),
            str(self.max_session_bytes or 0),
            str(self.max_messages),
            _ttl_ms(self.idle_ttl_seconds),
            "1" if self.refresh_on_read else "0",
            str(self.summarize_after_tokens or 0),
        )
        self._script = client.register_script(SCRIPT)
        self._sha = self._script.sha

    @classmethod
    def from_settings(cls, conf: MemorySettings) -> RedisBackend:
        return cls(
            client=_build_client(conf),
            key_prefix=conf.KEY_PREFIX,
            max_history=conf.MAX_HISTORY,
            auto_summarize=conf.AUTO_SUMMARIZE,
            track_dirty=mirror_mode(conf) != "off",
            owns_client=not conf.REDIS_CACHE_ALIAS,
            max_sessions_per_owner=owner_session_cap(conf),
            max_session_bytes=conf.MAX_SESSION_BYTES,
            max_messages=conf.MAX_MESSAGES,
            idle_ttl_seconds=conf.SESSION_IDLE_TTL_SECONDS or None,
            refresh_on_read=conf.IDLE_TTL_REFRESH_ON_READ,
            summarize_after_tokens=summarize_after_tokens(conf),
        )

    def describe(self) -> str:
        """``redis://host:port/db`` with no credentials."""
        kwargs = self.client.connection_pool.connection_kwargs
        if "path" in kwargs:
            return f"redis+unix://{kwargs['path']}"
        return f"redis://{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}/{kwargs.get('db', 0)}"

    def _error(self, exc: redis.RedisError) -> Exception:
        """The store's exception for a redis-py error."""
        if isinstance(exc, redis.ResponseError):
            message = str(exc)
            code, _, text = message.partition(" ")
            if code in _SCRIPT_ERRORS:
                return _SCRIPT_ERRORS[code](text)
            if code == "PM_TOO_MANY":
                return _TooMany()
            # redis-py raises OutOfMemoryError for "OOM ..." replies, without the code.
            if code == "OOM" or isinstance(exc, redis.exceptions.OutOfMemoryError):
                return CapacityExceeded(f"Redis at {self.describe()} is out of memory: {message}")
            return BackendUnavailable(f"Redis at {self.describe()} refused the operation: {message}")
        return BackendUnavailable(f"Redis at {self.describe()} is unavailable: {exc}")

    @contextmanager
    def _errors(self) -> Iterator[None]:
        """Turn redis-py errors into the store's exceptions."""
        try:
            yield
        except redis.RedisError as exc:
            raise self._error(exc) from None

    def _args(
        self, op: str, session_id: str, args: tuple[Any, ...], idempotency: IdempotencyRecord | None = None
    ) -> tuple[Any, ...]:
        once = _NO_IDEMPOTENCY
        if idempotency is not None:
            once = (idempotency.ref, idempotency.fingerprint, _ttl_ms(idempotency.ttl_seconds))
        return (op, self.key_prefix, session_id, repr(time.time()), *self._policy, *once, *args)

    def _run(self, op: str, session_id: str, *args: Any, idempotency: IdempotencyRecord | None = None) -> Any:
        """One EVALSHA of the script (it builds its keys from the prefix and session id).

        Sent on a pooled connection directly rather than through ``Redis.evalsha``:
        the client's command wrapper (retries, which are off, and instrumentation)
        costs more on this hot path than the rest of the store's Python code.
        """
        pool = self.client.connection_pool
        command = ("EVALSHA", self._sha, 0, *self._args(op, session_id, args, idempotency))
        try:
            connection = pool.get_connection()
            try:
                connection.send_command(*command)
                try:
                    return connection.read_response()
                except redis.exceptions.NoScriptError:  # a restarted or flushed server
                    connection.send_command("SCRIPT", "LOAD", SCRIPT)
                    connection.read_response()
                    connection.send_command(*command)
                    return connection.read_response()
            except redis.ResponseError:
                raise  # a whole reply was read: the connection is fine
            except BaseException:
                connection.disconnect()  # a reply may be left half read
                raise
            finally:
                pool.release(connection)
        except redis.RedisError as exc:
            raise self._error(exc) from None

    @staticmethod
    def _info(session_id: str, reply: list[Any]) -> SessionInfo:
        created_at, ttl, key_count, history_length, expire_ms, idle = reply[:6]
        if created_at is None:  # the meta expired between the script's commands
            raise SessionExpired(f"Session {session_id!r} has expired.")
        idle_ms, _, deadline_ms = idle.decode().partition(" ")
        return session_info(
            session_id,
            created_at=float(created_at),
            ttl_seconds=_parse_ttl(ttl),
            expires_at=expire_ms / 1000 if expire_ms >= 0 else None,
            key_count=key_count,
            history_length=history_length,
            idle_ttl_seconds=_seconds(idle_ms),
            deadline=_seconds(deadline_ms),
        )

    @staticmethod
    def _pairs(flat: list[bytes]) -> dict[str, str]:
        return {flat[i].decode(): flat[i + 1].decode() for i in range(0, len(flat), 2)}

    # Sessions ---------------------------------------------------------------

    def create_session(
        self,
        session_id: str,
        ttl_seconds: float | None,
        *,
        idle_ttl_seconds: float | None = None,
        idempotency: IdempotencyRecord | None = None,
    ) -> SessionInfo:
        reply = self._run(
            "create",
            session_id,
            _ttl_text(ttl_seconds),
            _ttl_ms(ttl_seconds),
            _ttl_ms(idle_ttl_seconds),
            idempotency=idempotency,
        )
        return self._info(session_id, reply)

    def resume_session(self, session_id: str) -> SessionInfo:
        return self._info(session_id, self._run("info", session_id))

    session_info = resume_session

    def list_sessions(self) -> list[str]:
        try:
            return sorted(item.decode() for item in self._run("list", "", "", str(ONE_STEP_LIST_LIMIT)))
        except _TooMany:
            return sorted(info["session_id"] for info in self._scan_infos(""))

    def list_session_infos(self, prefix: str = "") -> list[SessionInfo]:
        try:
            flat = self._run("list_info", "", prefix, str(ONE_STEP_LIST_LIMIT))
        except _TooMany:
            return self._scan_infos(prefix)
        return [self._info(flat[i].decode(), flat[i + 1 : i + 7]) for i in range(0, len(flat), 7)]

    def _scan_infos(self, prefix: str) -> list[SessionInfo]:
        """Many sessions: SSCAN and one pipelined step per batch, so Redis is never held long."""
        infos: list[SessionInfo] = []
        cursor = 0
        while True:
            cursor, ids = self.scan_sessions(cursor, 500, prefix)
            wanted = [sid for sid in dict.fromkeys(ids) if sid.startswith(prefix)]
            infos.extend(self.infos(wanted).values())
            if cursor == 0:
                return list({info["session_id"]: info for info in infos}.values())

    def list_session_page(self, prefix: str, offset: int, limit: int) -> tuple[int, list[SessionInfo]]:
        flat = self._run("page", "", prefix, str(offset), str(limit))
        infos = [self._info(flat[i].decode(), flat[i + 1 : i + 7]) for i in range(1, len(flat), 7)]
        return flat[0], infos

    def delete_session(self, session_id: str, *, idempotency: IdempotencyRecord | None = None) -> list[str]:
        return sorted(item.decode() for item in self._run("delete", session_id, idempotency=idempotency))

    # Values -----------------------------------------------------------------

    def put(
        self, session_id: str, key: str, value_json: str, *, idempotency: IdempotencyRecord | None = None
    ) -> None:
        self._run("put", session_id, key, value_json, idempotency=idempotency)

    def get(self, session_id: str, key: str) -> str:
        return self._run("get", session_id, key).decode()

    def get_all(self, session_id: str) -> str:
        return self._run("get_all", session_id).decode()

    def list_keys(self, session_id: str) -> list[str]:
        return sorted(item.decode() for item in self._run("keys", session_id))

    def increment(
        self, session_id: str, key: str, amount: int, *, idempotency: IdempotencyRecord | None = None
    ) -> int:
        return int(self._run("increment", session_id, key, str(amount), idempotency=idempotency))

    def clear(
        self, session_id: str, key: str | None, *, idempotency: IdempotencyRecord | None = None
    ) -> list[str]:
        return [item.decode() for item in self._run("clear", session_id, key or "", idempotency=idempotency)]

    # History ----------------------------------------------------------------

    def get_history(self, session_id: str, limit: int) -> list[dict[str, Any]]:
        return [json.loads(raw) for raw in self._run("history", session_id, str(limit))]

    def summarize(
        self, session_id: str, max_entries: int, *, idempotency: IdempotencyRecord | None = None
    ) -> int:
        return self._run("summarize", session_id, str(max_entries), idempotency=idempotency)

    # Lanes ------------------------------------------------------------------

    def enrich(
        self,
        session_id: str,
        ttl_seconds: float | None,
        run: RunBinding | None = None,
        *,
        idempotency: IdempotencyRecord | None = None,
    ) -> str:
        run_args = (run.run_id, _ttl_ms(run.ttl_seconds)) if run else ("", "0")
        reply = self._run(
            "enrich",
            session_id,
            _ttl_text(ttl_seconds),
            _ttl_ms(ttl_seconds),
            *run_args,
            "",  # no question to record (enrich_recording)
            idempotency=idempotency,
        )
        return reply.decode()

    def record_answer(
        self,
        session_id: str | None,
        answer_json: str,
        ttl_seconds: float | None,
        run_id: str | None = None,
        message: Answer | None = None,
        *,
        idempotency: IdempotencyRecord | None = None,
    ) -> AnswerRecord | None:
        recorded = ()
        if message is not None:
            recorded = (message.conversation, message.parent_id or "", *message_args([message.message]))
        reply = self._run(
            "answer",
            session_id or "",
            _ttl_text(ttl_seconds),
            _ttl_ms(ttl_seconds),
            answer_json,
            run_id or "",
            *recorded,
            idempotency=idempotency,
        )
        return AnswerRecord(reply[0].decode(), reply[1]) if reply else None

    # Whole sessions, for the mirror, export and import -----------------------

    def snapshots(self, session_ids: list[str]) -> dict[str, SessionSnapshot | None]:
        replies = self._pipelined("snapshot", session_ids)
        result: dict[str, SessionSnapshot | None] = {}
        for session_id in session_ids:
            reply = replies.get(session_id)
            if not reply:  # 0 from the script: not live
                result[session_id] = None
                continue
            info, values, history, conversations = reply
            result[session_id] = {
                "info": self._info(session_id, info),
                "values": self._pairs(values),
                "history": [json.loads(raw) for raw in history],
                "conversations": snapshot_conversations(conversations),
            }
        return result

    def restore_session(self, snapshot: SessionSnapshot, *, replace: bool) -> None:
        # An idle TTL comes back with its fixed deadline, as time left (clocks may differ).
        info = snapshot["info"]
        remaining = remaining_seconds(info)
        values = snapshot["values"]
        self._run(
            "restore",
            info["session_id"],
            "1" if replace else "0",
            repr(info["created_at"]),
            _ttl_text(info["ttl_seconds"]),
            _ttl_ms(remaining),
            restore_blob(snapshot.get("conversations") or {}),
            _idle_args(info),
            str(len(values)),
            *[part for key, value_json in values.items() for part in (key, value_json)],
            *[json.dumps(entry) for entry in snapshot["history"]],
        )

    # Maintenance in batches -------------------------------------------------

    def _session_sets(self, prefix: str) -> list[str]:
        """The sets ``prefix`` selects (the rule of redis.lua's ``sets_for``); an owner's
        is a sorted set."""
        namespace = namespace_of(prefix)
        if namespace:
            return [f"{self.key_prefix}:{namespace}:sessions"]
        node = f"{self.key_prefix}:__sessions__"
        return [node] if prefix else [node, f"{self.key_prefix}:~owned"]

    def scan_sessions(self, cursor: int, count: int, prefix: str = "") -> tuple[int, list[str]]:
        # One cursor over up to two sets: the low bit says which, the rest is its SSCAN (ZSCAN) cursor.
        sets = self._session_sets(prefix)
        phase, position = cursor % 2, cursor // 2
        owner_set = bool(namespace_of(prefix))
        following, ids = self._scan_set(sets[phase], position, count, prefix, sorted_set=owner_set)
        if following:
            following = following * 2 + phase
        elif phase + 1 < len(sets):
            following = 1  # the next set, from its start
        return following, ids

    def _scan_set(
        self, key: str, cursor: int, count: int, prefix: str, *, sorted_set: bool
    ) -> tuple[int, list[str]]:
        """One SSCAN (or ZSCAN) step of ``key``, ids starting with ``prefix``."""
        match = _glob_escape(prefix) + "*" if prefix else None
        with self._errors():
            if sorted_set:
                following, pairs = self.client.zscan(key, cursor, match=match, count=count)
                return following, [member.decode() for member, _ in pairs]
            following, ids = self.client.sscan(key, cursor, match=match, count=count)
        return following, [item.decode() for item in ids]

    def existing(self, session_ids: list[str]) -> set[str]:
        with self._errors():
            pipe = self.client.pipeline(transaction=False)
            for session_id in session_ids:
                pipe.exists(f"{self.key_prefix}:{session_id}:__meta__")
            found = pipe.execute()
        return {sid for sid, exists in zip(session_ids, found, strict=True) if exists}

    def _pipelined(self, op: str, session_ids: list[str], *args: Any) -> dict[str, Any]:
        """Run ``op`` for each session in one round trip; sessions gone meanwhile are left out."""
        with self._errors():
            pipe = self.client.pipeline(transaction=False)
            for session_id in session_ids:
                self._script(args=self._args(op, session_id, args), client=pipe)
            replies = pipe.execute(raise_on_error=False)
        result: dict[str, Any] = {}
        for session_id, reply in zip(session_ids, replies, strict=True):
            if isinstance(reply, redis.ResponseError):
                if str(reply).startswith(("PM_NOT_FOUND", "PM_EXPIRED")):
                    continue
                with self._errors():
                    raise reply
            result[session_id] = reply
        return result

    def infos(self, session_ids: list[str]) -> dict[str, SessionInfo]:
        return {sid: self._info(sid, reply) for sid, reply in self._pipelined("info", session_ids).items()}

    def summarize_many(self, session_ids: list[str], max_entries: int) -> dict[str, int]:
        return self._pipelined("summarize", session_ids, str(max_entries))

    def forget_namespace(self, namespace: str) -> int:
        # Every per-owner key that is no session's starts with "{namespace}:" (a session id
        # never starts with ':'); SCAN, never KEYS.
        pattern = _glob_escape(f"{self.key_prefix}:{namespace}:") + "*"
        deleted = 0
        with self._errors():
            batch: list[bytes] = []
            for key in self.client.scan_iter(match=pattern, count=500):
                batch.append(key)
                if len(batch) >= 500:
                    deleted += self.client.unlink(*batch)
                    batch = []
            if batch:
                deleted += self.client.unlink(*batch)
        return deleted

    def sweep(self, *, dry_run: bool, batch_size: int, prefix: str = "") -> dict[str, int]:
        dry = "1" if dry_run else "0"
        counts = {"expired_sessions": 0, "leftover_keys": 0, "run_bindings": 0}
        cursor = 0
        while True:  # ids in the sessions sets whose meta has expired
            cursor, ids = self.scan_sessions(cursor, batch_size, prefix)
            if ids:
                counts["expired_sessions"] += self._run("sweep_ids", "", dry, *ids)
            if cursor == 0:
                break
        if not namespace_of(prefix):  # the unowned listing: ids the node's set no longer holds
            listing = f"{self.key_prefix}:~sessions"
            while True:
                cursor, ids = self._scan_set(listing, cursor, batch_size, prefix, sorted_set=True)
                if ids:
                    counts["expired_sessions"] += self._run("sweep_listed", "", dry, *ids)
                if cursor == 0:
                    break
        # Every key under the prefix, never KEYS: SCAN in batches.
        pattern = _glob_escape(f"{self.key_prefix}:{prefix}") + "*"
        with self._errors():
            batches = self.client.scan_iter(match=pattern, count=batch_size)
            batch: list[bytes] = []
            for key in batches:
                batch.append(key)
                if len(batch) >= batch_size:
                    self._sweep_keys(batch, dry, counts)
                    batch = []
            self._sweep_keys(batch, dry, counts)
        return counts

    def _sweep_keys(self, keys: list[bytes], dry: str, counts: dict[str, int]) -> None:
        if keys:
            leftovers, runs = self._run("sweep_keys", "", dry, *keys)
            counts["leftover_keys"] += leftovers
            counts["run_bindings"] += runs

    def pop_dirty(self, count: int) -> list[str]:
        with self._errors():
            return [item.decode() for item in self.client.spop(self._dirty_key, count) or []]

    def dirty_count(self) -> int:
        with self._errors():
            return self.client.scard(self._dirty_key)

    def mark_dirty(self, session_ids: list[str]) -> None:
        if session_ids:
            with self._errors():
                self.client.sadd(self._dirty_key, *session_ids)

    # Health -----------------------------------------------------------------

    def ping(self) -> None:
        with self._errors():
            self.client.ping()

    def close(self) -> None:
        # A connection borrowed from a django-redis cache belongs to that cache.
        if self.owns_client:
            self.client.close()
            self.client.connection_pool.disconnect()
