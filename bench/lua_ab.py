"""The Redis time of a turn's calls under two versions of the Lua, in one server, interleaved.

    python bench/lua_ab.py OTHER_LUA_DIR [--turns 800]

``OTHER_LUA_DIR`` is another checkout's ``persistent_memory/backends/redis/lua`` (for example
``git archive main | tar -x -C /tmp/main``). Both libraries are loaded side by side (their
names carry their versions); four stores, this checkout's and the other's Lua, each with
a default turn (window 100, recording and extraction on) and a bare one (recording and
extraction off), take turns call by call, and the server's own time of each ``FCALL``
(``SLOWLOG``) is compared: a loaded machine then slows both alike, which two runs one
after the other do not. Only the Lua differs: the Python that calls it is this
checkout's, so the two must take the same arguments.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(1, str(BENCH.parent))  # the project (bench/ itself is sys.path[0])

import redis  # noqa: E402
from local_redis import redis_url  # noqa: E402
from run import setup_django  # noqa: E402

#: Turns before timing: longer than the window.
WARM_TURNS = 1000
#: Turns of each store between reads of the slow log.
BATCH = 50


def lua_source(folder: Path) -> str:
    """``folder``'s redis.lua with the files it includes in their place."""
    text = (folder / "redis.lua").read_text()
    return re.sub(r"^-- @include (\S+)$", lambda m: (folder / m.group(1)).read_text(), text, flags=re.M)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("other", type=Path, help="the other checkout's persistent_memory/backends/redis/lua")
    parser.add_argument("--turns", type=int, default=800, help="timed turns of each store")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="pm-lua-ab-") as folder, redis_url(use_env=False) as url:
        setup_django(folder)
        from store_bench import build_store, fill, turn

        from persistent_memory.backends.redis.functions import Library

        client = redis.Redis.from_url(url)
        turns, stores = {}, []
        bare = {"RECORD_CONVERSATION": False, "MEMORY_EXTRACTION_WORKER": False}
        for lua in ("this", "other"):
            for kind, extra in (("default", {}), ("bare", bare)):
                store = build_store("redis", url, CONTEXT_MAX_MESSAGES=100, **extra)
                if lua == "other":
                    store.backend.transport.library = Library(lua_source(args.other))
                stores.append(store)
                turns[lua, kind] = turn(store, fill(store, f"ab-{lua}-{kind}", 20, 10))

        def settle() -> None:
            for store in stores:
                if store.extraction_worker:
                    store.extraction_worker.wait_idle(30)

        durations: dict[tuple[str, str, str], list[int]] = {}
        try:
            for _ in range(WARM_TURNS):
                for call in turns.values():
                    call()
            settle()
            client.config_set("slowlog-max-len", 100_000)
            client.config_set("slowlog-log-slower-than", 0)
            for _ in range(max(1, args.turns // BATCH)):
                client.slowlog_reset()
                for _ in range(BATCH):
                    for call in turns.values():
                        call()
                settle()
                for entry in client.slowlog_get(100_000):
                    words = entry["command"].split(b" ")
                    if words[0] != b"FCALL":
                        continue
                    session = words[3].decode()  # the session's meta: its id names the store
                    lua = "this" if "ab-this-" in session else "other"
                    kind = "default" if "-default-" in session else "bare"
                    op = words[3 + int(words[2])].decode()
                    # The slow log keeps 32 arguments: an answer's op is past them.
                    op = "answer" if op.startswith("(") else op
                    durations.setdefault((kind, lua, op), []).append(entry["duration"])
        finally:
            client.config_set("slowlog-log-slower-than", 10_000)
            for store in stores:
                store.close()
            client.close()
    print("| turn | call | this: median (p25) µs | other: median (p25) µs | this ÷ other |")
    print("|---|---|---|---|---|")
    for kind in ("default", "bare"):
        sums = {"this": [0.0, 0.0], "other": [0.0, 0.0]}
        for op in ("enrich", "answer"):
            cells = []
            for lua in ("this", "other"):
                times = sorted(durations[kind, lua, op])
                median, p25 = statistics.median(times), times[len(times) // 4]
                sums[lua][0] += median
                sums[lua][1] += p25
                cells.append(f"{median:.1f} ({p25})")
            this_op, other_op = durations[kind, "this", op], durations[kind, "other", op]
            ratio = statistics.median(this_op) / statistics.median(other_op)
            print(f"| {kind} | {op} | {cells[0]} | {cells[1]} | {ratio:.2f} |")
        this, other = sums["this"], sums["other"]
        print(
            f"| {kind} | both | {this[0]:.1f} ({this[1]:.0f}) | {other[0]:.1f} ({other[1]:.0f}) "
            f"| {this[0] / other[0]:.2f} |"
        )
    print(f"\nLoad average at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
