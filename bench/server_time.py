"""Redis server time, CPU and commands per operation, from ``INFO commandstats`` and ``INFO cpu``.

Every ``cmdstat_*`` entry counts except the commands the bench sends to measure (``INFO``,
``SLOWLOG``, ``CONFIG``), so the figures hold whatever an operation sends: ``EVALSHA``,
``FCALL``/``FCALL_RO``, plain commands, ``MULTI``/``EXEC``.

* **Commands** are every command run, those a script or a function calls included.
* **Redis µs** is the time of the commands clients sent. Redis times a command a script
  calls twice: in its own entry and inside the script's (the store's default turn on
  Redis 7.0 here: its scripts' commands came to about as much time again as the scripts
  themselves). So :func:`server_cost` first runs the operation with the slow log taking
  every command, to count which of them were called from scripts (the slow log names
  their client ``?:0``), then again without it, for the figures; an entry's time counts
  in the share of its calls that clients sent.
* **Redis CPU µs** is ``used_cpu_sys`` + ``used_cpu_user``: every moment the server spent
  on a core, reading requests and writing replies included. The Redis µs are wall-clock
  times, which grow when the server waits for a core in the middle of a command: on a
  loaded machine, the CPU is the figure to trust.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import redis

#: The commands the bench sends to take its measure, left out of every count.
MEASURING = ("info", "slowlog", "config")
#: Script and function calls (each is one call, whatever it runs inside).
SCRIPTS = frozenset({"eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro"})
#: How the slow log names the client of a command a script or a function called.
SCRIPT_CLIENT = b"?:0"
#: Room in the slow log for every command of the counting pass.
SLOWLOG_ROOM = 1_000_000


@dataclass(frozen=True)
class CommandStats:
    """What Redis counted so far, summed over the servers asked: per command (its
    ``cmdstat_`` name), calls and microseconds, and the servers' CPU seconds."""

    calls: Counter[str] = field(default_factory=Counter)
    usec: Counter[str] = field(default_factory=Counter)
    cpu_s: float = 0.0

    def __add__(self, other: CommandStats) -> CommandStats:
        return CommandStats(self.calls + other.calls, self.usec + other.usec, self.cpu_s + other.cpu_s)

    def __sub__(self, other: CommandStats) -> CommandStats:
        calls, usec = Counter(self.calls), Counter(self.usec)
        calls.subtract(other.calls)
        usec.subtract(other.usec)
        return CommandStats(calls, usec, self.cpu_s - other.cpu_s)


def _measuring(name: str) -> bool:
    return name.split("|")[0] in MEASURING


def command_stats(servers: Iterable[redis.Redis]) -> CommandStats:
    """The sum of every server's ``INFO commandstats`` (less the measuring commands) and
    ``INFO cpu``."""
    total = CommandStats()
    for server in servers:
        cpu = server.info("cpu")
        calls, usec = Counter[str](), Counter[str]()
        for entry, figures in server.info("commandstats").items():
            name = entry.removeprefix("cmdstat_")
            if not _measuring(name):
                calls[name] = figures["calls"]
                usec[name] = figures["usec"]
        total += CommandStats(calls, usec, float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"]))
    return total


def per_op(spent: CommandStats, count: int, nested: Counter[str] | None = None) -> dict[str, float]:
    """``spent`` over ``count`` operations, as the bench's JSON reports it; with ``nested``
    (the calls of each command that scripts made), the Redis µs of the calls clients sent."""
    figures = {
        "commands_per_op": round(sum(spent.calls.values()) / count, 2),
        "scripts_per_op": round(sum(spent.calls[name] for name in SCRIPTS) / count, 2),
        "server_cpu_us_per_op": round(spent.cpu_s * 1e6 / count, 1),
    }
    if nested is not None:
        sent = sum(
            usec * max(0, spent.calls[name] - nested[name]) / spent.calls[name]
            for name, usec in spent.usec.items()
            if spent.calls[name] > 0
        )
        figures["server_us_per_op"] = round(sent / count, 1)
    return figures


def nested_calls(
    servers: list[redis.Redis], operation: Callable[[], Any], count: int, settle: Callable[[], Any]
) -> Counter[str]:
    """Calls of each command that scripts and functions made during ``count`` calls of
    ``operation`` (the slow log takes every command meanwhile, then is put back)."""
    saved = [server.config_get("slowlog-*") for server in servers]
    settle()
    for server in servers:
        server.config_set("slowlog-log-slower-than", 0)
        server.config_set("slowlog-max-len", SLOWLOG_ROOM)
        server.slowlog_reset()
    try:
        for _ in range(count):
            operation()
        settle()
        nested = Counter[str]()
        for server in servers:
            for entry in server.slowlog_get(SLOWLOG_ROOM):
                if entry.get("client_address") == SCRIPT_CLIENT:
                    nested[_entry_name(entry["command"])] += 1
    finally:
        for server, config in zip(servers, saved, strict=True):
            server.config_set("slowlog-log-slower-than", config["slowlog-log-slower-than"])
            server.config_set("slowlog-max-len", config["slowlog-max-len"])
            server.slowlog_reset()
    return nested


def _entry_name(command: bytes | list[Any]) -> str:
    """The ``cmdstat_`` name of a slow log entry's command (its first word)."""
    words = command.split() if isinstance(command, bytes) else command
    return words[0].decode().lower() if isinstance(words[0], bytes) else str(words[0]).lower()


def server_cost(
    servers: list[redis.Redis],
    operation: Callable[[], Any],
    count: int,
    settle: Callable[[], Any] = lambda: None,
) -> dict[str, float]:
    """Redis µs, Redis CPU µs, commands and script calls per call of ``operation``, over
    ``count`` calls (twice: see the module); ``settle`` waits, before and after, for the
    background work the calls cause, which is then counted as theirs."""
    nested = nested_calls(servers, operation, count, settle)
    settle()
    before = command_stats(servers)
    for _ in range(count):
        operation()
    settle()
    return per_op(command_stats(servers) - before, count, nested)
