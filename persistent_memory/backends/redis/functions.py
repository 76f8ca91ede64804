"""The Redis backend's Lua as a Redis function library, and what loads it.

``lua/redis.lua`` with the files it includes (``-- @include name.lua`` lines) is one Lua
chunk that defines every operation's helpers and a per-call ``entry``. On Redis 7+ it is
registered once with ``FUNCTION LOAD`` as the library ``persistent_memory_<version>``
(the version: a hash of the code, so that two releases run side by side during a
deploy) and each operation is one ``FCALL``: the helpers are built when the library
loads, not on every call, as an ``EVALSHA`` of the chunk rebuilds them (Lua 5.1 runs a
script's whole chunk per call). A read is an ``FCALL_RO`` of a function flagged
``no-writes``.

On a server without functions (Redis < 7; found on the first call, when ``FCALL`` is an
unknown command) the same chunk, ending with a call of ``entry`` instead of the
registration, is sent with ``EVALSHA``.

Either is loaded where a call finds it missing (a new or flushed server, a failover to a
node that lacks it, a restore): :func:`missing` tells that error, :meth:`Library.loading`
the commands that load it, and the call is sent again once.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Generator
from importlib import resources
from typing import Any

import redis


def _source() -> str:
    """lua/redis.lua with the files it includes in their place."""
    files = resources.files("persistent_memory.backends.redis").joinpath("lua")
    text = files.joinpath("redis.lua").read_text()
    return re.sub(r"^-- @include (\S+)$", lambda m: files.joinpath(m.group(1)).read_text(), text, flags=re.M)


#: Operations that change nothing a caller sees (REDIS_WAIT_REPLICAS does not wait for them).
READS = frozenset(
    {"get", "get_all", "keys", "info", "history", "list", "list_info", "page", "bucket_page", "snapshot"}
    | {"read_messages", "context", "conversations", "summary_source"}
)

#: The reads that write nothing when reads do not move an idle expiry: an ``FCALL_RO``. A
#: listing page writes (it catches the unowned index up, and sorts a search in a scratch key).
READ_ONLY = READS - {"page", "bucket_page"}

#: The operations that free memory: they run on a Redis at its maxmemory (``allow-oom``),
#: as a script's deletes did. Every other write is refused there before it starts.
FREES = frozenset({"delete", "clear", "clear_messages", "sweep_ids", "sweep_keys", "cp_prune"})


class Library:
    """The code, its names and the loader's state for one backend: whether the server has
    functions (until a call finds it does not)."""

    def __init__(self, source: str) -> None:
        version = hashlib.sha1(source.encode(), usedforsecurity=False).hexdigest()[:12]
        #: The library's name; its functions' names carry the version too (they are global).
        self.name = f"persistent_memory_{version}"
        self.write, self.read, self.free = f"pm_{version}", f"pm_ro_{version}", f"pm_free_{version}"
        self.code = (
            f"#!lua name={self.name}\n{source}\n"
            f"redis.register_function{{function_name = '{self.write}', callback = entry}}\n"
            f"redis.register_function{{function_name = '{self.read}', callback = read_entry,"
            " flags = {'no-writes'}}\n"
            f"redis.register_function{{function_name = '{self.free}', callback = entry,"
            " flags = {'allow-oom'}}\n"
        )
        # entry's own KEYS and ARGV locals hide the script's globals at the end of the chunk.
        self.script = f"{source}\nreturn entry(rawget(_G, 'KEYS'), rawget(_G, 'ARGV'))\n"
        self.sha = hashlib.sha1(self.script.encode(), usedforsecurity=False).hexdigest()
        self.functions = True

    def head(self, op: str, *, read_only: bool) -> tuple[str, str]:
        """The command and function (or script) that run ``op``; ``read_only``: the call's
        settings let reads write nothing (no idle expiry moved by a read)."""
        if not self.functions:
            return ("EVALSHA", self.sha)
        if read_only and op in READ_ONLY:
            return ("FCALL_RO", self.read)
        return ("FCALL", self.free if op in FREES else self.write)

    def again(self, command: tuple[Any, ...]) -> tuple[Any, ...]:
        """``command`` to send again after a load: an ``EVALSHA`` once the server was found
        to have no functions."""
        if self.functions or command[0] == "EVALSHA":
            return command
        return ("EVALSHA", self.sha, *command[2:])

    def writing(self, command: tuple[Any, ...]) -> tuple[Any, ...]:
        """A read's ``command`` as a write (see :func:`write_needed`)."""
        return ("FCALL", self.write, *command[2:])

    def loading(self) -> Generator[tuple[Any, ...], Any, None]:
        """The commands that load the code on one server, for a sync or an async sender: it
        yields each command and is sent its reply (an error as a value). A library already
        there is replaced by the same code (two clients may load at once)."""
        if self.functions:
            reply = yield ("FUNCTION", "LOAD", "REPLACE", self.code)
            if not _unknown_command(reply):
                if isinstance(reply, Exception):
                    raise reply
                return
            self.functions = False  # Redis < 7: the same code as a script, from now on
        reply = yield ("SCRIPT", "LOAD", self.script)
        if isinstance(reply, Exception):
            raise reply


def _unknown_command(reply: Any) -> bool:
    return isinstance(reply, redis.ResponseError) and str(reply).lower().startswith("unknown command")


def missing(exc: BaseException) -> bool:
    """Whether ``exc`` says the server lacks the code: a function not found, a script not
    loaded, or FCALL unknown (a server without functions, before the first load)."""
    if isinstance(exc, redis.exceptions.NoScriptError):
        return True
    if not isinstance(exc, redis.ResponseError):
        return False
    text = str(exc)
    return text.startswith("Function not found") or (_unknown_command(exc) and "fcall" in text.lower())


def write_needed(exc: BaseException) -> bool:
    """Whether ``exc`` is a read's answer that it must write after all (a read of a session
    that has just expired cleans it up): nothing was written, it is sent again as a write."""
    return isinstance(exc, redis.ResponseError) and str(exc).startswith("PM_WRITE_NEEDED")


SOURCE = _source()


#: The commands that run the library, as ``INFO commandstats`` names them.
CALL_STATS = ("cmdstat_fcall", "cmdstat_fcall_ro", "cmdstat_evalsha")


def library_calls(commandstats: dict[str, Any]) -> int:
    """The calls of the library in an ``INFO commandstats`` reply."""
    return sum(commandstats.get(name, {}).get("calls", 0) for name in CALL_STATS)
