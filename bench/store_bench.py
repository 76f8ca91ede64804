"""The floor (redis-py alone) and the store's operations, single-threaded.

Needs Django set up (bench/run.py does it): the memory store's mirror writes to the
default database.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

import redis
from conversation_bench import conversation_operations, lanes_with_idle_ttl, lanes_without_recording
from timing import timed

from persistent_memory.backends.redis_functions import CALL_STATS, library_calls
from persistent_memory.conf import MemorySettings
from persistent_memory.pipeline import MemoryFilter
from persistent_memory.store import MemoryStore

#: Operations in the pass that counts round trips and Redis commands (not timed).
COUNTED = 200
VALUE = {"text": "The user prefers short answers in French.", "score": 0.87, "tags": ["pref", "lang"]}
ANSWER = "Paris is the capital of France."
EVALSHA = "EVALSHA (return 1)"
POOLED_EVALSHA = "EVALSHA (return 1) on a pooled connection"
FLOOR_PREFIX = "redis-py "
ENRICH, STORE = "enrich lane", "store lane"
TURN = "turn (enrich + store)"
#: The variant the default turn is compared with.
BARE = "recording and extraction off"


class CountingConnection(redis.Connection):
    """Counts network round trips: one per packed send (a command or a whole pipeline)."""

    sends = 0

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        type(self).sends += 1
        super().send_packed_command(command, check_health)


def count_round_trips(client: redis.Redis) -> None:
    """Make ``client``'s new connections count their round trips."""
    client.connection_pool.disconnect()
    client.connection_pool.connection_class = CountingConnection


def command_stats(stats: redis.Redis) -> tuple[int, int, int]:
    """Commands Redis has run (those inside the library's calls too, INFO excluded), the
    library's calls (FCALL, FCALL_RO; EVALSHA without functions), and the microseconds it
    spent on the ones clients sent (those, PING)."""
    table = stats.info("commandstats")
    calls = sum(v["calls"] for k, v in table.items() if k != "cmdstat_info")
    usec = sum(table.get(k, {}).get("usec", 0) for k in (*CALL_STATS, "cmdstat_ping"))
    return calls, library_calls(table), usec


def per_op(
    operation: Callable[[], Any], stats: redis.Redis | None, settle: Callable[[], Any] = lambda: None
) -> dict[str, float]:
    """Round trips, Redis commands, scripts and Redis time per call of ``operation`` (0
    without Redis), what the background workers did about the calls included (``settle``
    waits for them)."""
    if stats is None:
        return {"round_trips_per_op": 0.0, "commands_per_op": 0.0, "server_us_per_op": 0.0}
    settle()
    calls, scripts, usec = command_stats(stats)
    CountingConnection.sends = 0
    for _ in range(COUNTED):
        operation()
    settle()
    sends = CountingConnection.sends
    calls_after, scripts_after, usec_after = command_stats(stats)
    return {
        "round_trips_per_op": sends / COUNTED,
        "scripts_per_op": (scripts_after - scripts) / COUNTED,
        "commands_per_op": (calls_after - calls) / COUNTED,
        "server_us_per_op": round((usec_after - usec) / COUNTED, 1),
    }


def measure(
    operations: dict[str, Callable[[], Any]],
    duration: float,
    stats: redis.Redis | None,
    settle: Callable[[], Any] = lambda: None,
) -> dict[str, dict[str, Any]]:
    """Time the operations (taking turns), then count each one's round trips and commands.

    Many short turns: a burst of the machine's other work (the memory backend's mirror
    thread, another process) then falls on each operation alike."""
    figures = timed(operations, duration, slices=50)
    for name, operation in operations.items():
        figures[name].update(per_op(operation, stats, settle))
    return figures


def floor_operations(client: redis.Redis) -> dict[str, Callable[[], Any]]:
    """redis-py alone, one round trip each: PING, and EVALSHA of a script that returns 1,
    through the client and, as the store sends its script, on a pooled connection."""
    sha = client.script_load("return 1")
    pool = client.connection_pool

    def on_connection() -> Any:
        connection = pool.get_connection()
        try:
            connection.send_command("EVALSHA", sha, 0)
            return connection.read_response()
        finally:
            pool.release(connection)

    return {"PING": client.ping, EVALSHA: lambda: client.evalsha(sha, 0), POOLED_EVALSHA: on_connection}


def build_store(
    backend: str,
    url: str,
    max_sessions: int = 1000,
    journal_dir: str | None = None,
    layout: str = "node",
    **extra: Any,
) -> MemoryStore:
    """A store as a project configures it: the backend's default mirror mode and TTL
    (on memory, with a journal in ``journal_dir`` when given), with ``extra`` settings.
    Conversations keep up to 20,000 messages, for the 10,000-message window."""
    conf: dict[str, Any] = {
        "BACKEND": backend,
        "MAX_SESSIONS": max_sessions,
        "JOURNAL_DIR": journal_dir or False,
        "MAX_MESSAGES": 20_000,
        "MAX_SESSION_BYTES": None,
        # The lanes' window: 20 messages, as a chat sends (the conversations grow while timed).
        "CONTEXT_MAX_MESSAGES": 20,
        # Everything else as a project gets it: conversations recorded, the extraction
        # worker running (its cost is the default path's), the backend's mirror mode.
        **extra,
    }
    if backend == "redis":
        conf["REDIS_URL"] = url
        conf.setdefault("REDIS_LAYOUT", layout)
    store = MemoryStore.from_settings(MemorySettings(conf))
    if isinstance(getattr(store.backend, "client", None), redis.Redis):  # a cluster counts otherwise
        count_round_trips(store.backend.client)
    return store


def fill(store: MemoryStore, name: str, sessions: int, keys: int) -> list[str]:
    """Ids of ``sessions`` sessions named for ``name``, each given ``keys`` values."""
    ids = [f"bench-{name}-{i}" for i in range(sessions)]
    for session_id in ids:
        store.create_session(session_id)
        for n in range(keys):
            store.put(session_id, f"k{n}", {**VALUE, "n": n})
    return ids


def _cycle(items: list[Any]) -> Callable[[], Any]:
    return itertools.cycle(items).__next__


def operations(
    store: MemoryStore, sessions: int, keys: list[int], bare: MemoryStore | None = None
) -> dict[str, Callable[[], Any]]:
    """Each measured operation, on sessions of its own, spread over ``sessions`` ids; with
    ``bare`` (the same backend with recording and extraction off), a turn on each."""
    written = _cycle(fill(store, "write", sessions, 1))
    result: dict[str, Callable[[], Any]] = {
        "put": lambda: store.put(written(), "k0", VALUE),
        "get": lambda: store.get(written(), "k0"),
    }
    for count in keys:
        full = _cycle(fill(store, f"full{count}", sessions, count))
        result[f"get_all ({count} keys)"] = lambda full=full: store.get_all(full())
    result["increment"] = lambda: store.increment(written(), "counter")
    lanes = MemoryFilter(store)
    questions = [
        {"text": "Where?", "metadata": {"session_id": sid}}
        for sid in fill(store, "enrich", sessions, keys[0])
    ]
    answers = [
        {"text": ANSWER, "metadata": {"session_id": sid}} for sid in fill(store, "answer", sessions, 0)
    ]
    question, answer = _cycle(questions), _cycle(answers)
    result[f"{ENRICH} ({keys[0]} keys)"] = lambda: lanes.enrich(question())
    result[STORE] = lambda: lanes.store(answer())
    result.update(conversation_operations(store, sessions))
    result.update(lanes_without_recording(store, sessions, ENRICH, STORE))
    values = {f"k{n}": {**VALUE, "n": n} for n in range(keys[0])}
    result.update(lanes_with_idle_ttl(store, sessions, values, ENRICH, STORE))
    if bare is not None:
        result[TURN] = turn(store, fill(store, "turn", sessions, keys[0]))
        result[f"{TURN} ({BARE})"] = turn(bare, fill(bare, "bare-turn", sessions, keys[0]))
    return result


def turn(store: MemoryStore, session_ids: list[str]) -> Callable[[], Any]:
    """One pipeline item: a question through the enrich lane, its answer through the store lane."""
    lanes = MemoryFilter(store)
    session = _cycle(session_ids)

    def call() -> None:
        metadata = {"session_id": session()}
        lanes.open()
        lanes.enrich({"text": "Where?", "metadata": metadata})
        lanes.store({"text": ANSWER, "metadata": metadata})

    return call


def redis_figures(
    url: str, duration: float, sessions: int, keys: list[int], layout: str = "node"
) -> dict[str, dict[str, Any]]:
    """The floor and the store on Redis (in ``layout``), taking turns in one timing run."""
    client = redis.Redis.from_url(url)
    count_round_trips(client)
    stats = redis.Redis.from_url(url)
    store = build_store("redis", url, layout=layout)
    bare = build_store("redis", url, layout=layout, RECORD_CONVERSATION=False, MEMORY_EXTRACTION_WORKER=False)
    try:
        floor = floor_operations(client)
        ops = {f"{FLOOR_PREFIX}{name}": op for name, op in floor.items()}
        ops.update(operations(store, sessions, keys, bare))
        return measure(ops, duration, stats, lambda: store.extraction_worker.wait_idle(30))
    finally:
        store.close()
        bare.close()
        client.close()
        stats.close()


def memory_figures(
    duration: float, sessions: int, keys: list[int], passes: int = 2, journal_dir: str | None = None
) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """The store on memory with its default mirror, and the mirror's catch-up after.

    Each operation is timed once the mirror has caught up with the one before, so its
    figure includes the mirror work its own writes cause and not the others'; a lane's
    variants (as configured, recording off, idle TTL on), which the targets compare,
    take turns in one timing instead, so that the machine's drift shifts them alike.
    There is no floor to take turns with here, so each is timed in ``passes`` passes
    and the better one counts, as for the API.
    """
    from persistent_memory.models import MemorySession

    MemorySession.objects.all().delete()  # the bench's own database: start each run empty
    store = build_store("memory", "", max_sessions=max(1000, 20 * sessions), journal_dir=journal_dir)
    try:
        figures: dict[str, dict[str, Any]] = {}
        groups: dict[str, dict[str, Callable[[], Any]]] = {}
        for name, operation in operations(store, sessions, keys).items():
            lane = next((lane for lane in (ENRICH, STORE) if name.startswith(lane)), name)
            groups.setdefault(lane, {})[name] = operation
        # The lanes last, the store lane's variants at the end: the catch-up below is then
        # measured after a run of writes, as it was before the variants were grouped.
        ordered = [group for lane, group in groups.items() if lane not in (ENRICH, STORE)]
        ordered += [groups[ENRICH], groups[STORE]]
        for _ in range(passes):
            for group in ordered:
                _wait_for_mirror(store, store.list_sessions())
                for name, result in measure(group, len(group) * duration / passes, None).items():
                    if name not in figures or result["ops_per_s"] > figures[name]["ops_per_s"]:
                        figures[name] = result
        return figures, mirror_catch_up(store)
    finally:
        store.close()


def _caught_up(store: MemoryStore, session_ids: list[str]) -> bool:
    """Whether every row shows its session's newest history entry: every write adds one,
    and a sync writes a session whole, so this is cheap to ask and enough."""
    from persistent_memory.models import MemorySession

    rows = dict(
        MemorySession.objects.filter(session_id__in=session_ids).values_list("session_id", "last_activity")
    )
    for session_id in session_ids:
        newest = store.get_history(session_id, 1)
        if session_id not in rows or (
            newest and abs(rows[session_id].timestamp() - newest[-1]["timestamp"]) > 1e-5
        ):
            return False
    return True


def _mirrored(store: MemoryStore, session_ids: list[str]) -> bool:
    """Whether the mirror's rows hold what the store holds: values, and every history entry."""
    from persistent_memory.models import HistoryEntry, MemorySession, MemoryValue

    snapshots = store.backend.snapshots(session_ids)
    rows = {row.session_id: row for row in MemorySession.objects.filter(session_id__in=session_ids)}
    values: dict[str, dict[str, str]] = {sid: {} for sid in session_ids}
    for sid, key, value in MemoryValue.objects.filter(session__session_id__in=session_ids).values_list(
        "session__session_id", "key", "value"
    ):
        values[sid][key] = value
    history: dict[str, list[tuple[Any, ...]]] = {sid: [] for sid in session_ids}
    entries = HistoryEntry.objects.filter(session__session_id__in=session_ids).order_by("session", "position")
    for sid, op, key, timestamp in entries.values_list("session__session_id", "op", "key", "timestamp"):
        history[sid].append((op, key or None, timestamp.timestamp()))
    return all(
        snapshot is not None
        and sid in rows
        and rows[sid].key_count == snapshot["info"]["key_count"]
        and values[sid] == snapshot["values"]  # the mirror holds the store's JSON text
        and _same_history(history[sid], snapshot["history"])
        for sid, snapshot in snapshots.items()
    )


def _same_history(rows: list[tuple[Any, ...]], entries: list[dict[str, Any]]) -> bool:
    """Rows and entries alike, times to the microsecond the database keeps."""
    return len(rows) == len(entries) and all(
        (op, key) == (entry["op"], entry.get("key")) and abs(timestamp - entry["timestamp"]) < 2e-6
        for (op, key, timestamp), entry in zip(rows, entries, strict=True)
    )


def mirror_catch_up(store: MemoryStore, timeout: float = 10.0) -> dict[str, Any]:
    """Seconds from the last write until the mirror shows every session's last write
    (None: not within ``timeout``), and whether its rows then equal the store."""
    session_ids = store.list_sessions()
    seconds = _wait_for_mirror(store, session_ids, timeout)
    return {"seconds": seconds, "rows_equal_store": _mirrored(store, session_ids)}


def _wait_for_mirror(store: MemoryStore, session_ids: list[str], timeout: float = 10.0) -> float | None:
    start = time.perf_counter()
    while time.perf_counter() - start < timeout:
        # The pending count first: the full check reads every session (30 ms for 1,100 of
        # them), and run every 20 ms it took the GIL from the mirror it was waiting for.
        if store.backend.dirty_count() == 0 and _caught_up(store, session_ids):
            return round(time.perf_counter() - start, 3)
        time.sleep(0.02)
    return None
