"""Redis server time and commands per operation, from ``INFO commandstats``.

Every ``cmdstat_*`` entry counts except the commands the bench sends to measure
(``INFO`` itself), so the figure holds whatever the operation sends: ``EVALSHA``,
``FCALL``/``FCALL_RO``, plain commands, ``MULTI``/``EXEC``. Commands a script or a
function calls are counted as commands (the commands per op include them), and Redis
also times each of them inside its script's own time, so their microseconds are
counted twice. That overstates a script's time by its commands' own share: in a script
that does nothing but call ``GET`` 1,000 times, 16% (Redis 7.0 on this machine); less in
a script that does work of its own between its commands. A path without scripts is
counted exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import redis

#: Entries of the commands the bench sends to take its measure, left out of every count.
MEASURING = frozenset({"cmdstat_info"})
#: Entries of script and function calls (each is one call, whatever it runs inside).
SCRIPTS = frozenset(
    f"cmdstat_{name}" for name in ("eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro")
)


@dataclass(frozen=True)
class CommandStats:
    """What Redis counted so far, summed over the servers asked."""

    #: Commands run, those called from scripts and functions included.
    calls: int = 0
    #: Script and function calls.
    scripts: int = 0
    #: Microseconds Redis spent running them.
    usec: int = 0

    def __sub__(self, other: CommandStats) -> CommandStats:
        return CommandStats(self.calls - other.calls, self.scripts - other.scripts, self.usec - other.usec)


def command_stats(servers: Iterable[redis.Redis]) -> CommandStats:
    """The sum of every server's ``INFO commandstats``, less the measuring commands."""
    calls = scripts = usec = 0
    for server in servers:
        for name, entry in server.info("commandstats").items():
            if name in MEASURING:
                continue
            calls += entry["calls"]
            usec += entry["usec"]
            if name in SCRIPTS:
                scripts += entry["calls"]
    return CommandStats(calls, scripts, usec)


def server_cost(
    servers: list[redis.Redis],
    operation: Callable[[], Any],
    count: int,
    settle: Callable[[], Any] = lambda: None,
) -> dict[str, float]:
    """Redis time (µs), commands and script calls per call of ``operation``, over ``count``
    calls; ``settle`` waits (before and after) for the background work the calls cause,
    which is then counted as theirs."""
    settle()
    before = command_stats(servers)
    for _ in range(count):
        operation()
    settle()
    spent = command_stats(servers) - before
    return per_op(spent, count)


def per_op(spent: CommandStats, count: int) -> dict[str, float]:
    """``spent`` over ``count`` operations, as the bench's JSON reports it."""
    return {
        "server_us_per_op": round(spent.usec / count, 1),
        "commands_per_op": round(spent.calls / count, 2),
        "scripts_per_op": round(spent.scripts / count, 2),
    }
