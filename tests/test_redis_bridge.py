"""The async bridge (persistent_memory.integrations.redis_bridge): sync store code run for
a coroutine, its awaits handed to the event loop."""

from __future__ import annotations

import asyncio
import contextvars

import pytest

from persistent_memory.integrations.redis_bridge import await_only, blocking, current, run_bridged

REQUEST = contextvars.ContextVar("request", default="none")


async def sleep_then(value: int) -> int:
    await asyncio.sleep(0)
    return value


def test_a_bridged_call_awaits_on_the_loop_and_sees_the_callers_context():
    def body(base: int) -> tuple[int, str, bool]:
        total = base + await_only(sleep_then(1)) + await_only(sleep_then(2))
        return total, REQUEST.get(), current() is not None

    async def main() -> tuple[int, str, bool]:
        REQUEST.set("mine")
        return await run_bridged(body, 10)

    assert asyncio.run(main()) == (13, "mine", True)


def test_errors_cross_the_bridge_both_ways():
    async def fails() -> None:
        raise KeyError("from the loop")

    def body() -> str:
        try:
            await_only(fails())
        except KeyError as exc:
            raise ValueError(f"caught {exc}") from None
        return "unreachable"

    with pytest.raises(ValueError, match="caught 'from the loop'"):
        asyncio.run(run_bridged(body))


def test_many_bridged_calls_interleave_on_one_loop():
    order: list[str] = []

    def body(name: str) -> str:
        order.append(f"{name} start")
        await_only(asyncio.sleep(0.01))
        order.append(f"{name} end")
        return name

    async def main() -> list[str]:
        return await asyncio.gather(*(run_bridged(body, str(i)) for i in range(3)))

    assert asyncio.run(main()) == ["0", "1", "2"]
    assert order[:3] == ["0 start", "1 start", "2 start"]  # none blocked the loop


def test_outside_a_bridge_blocking_calls_run_here_and_await_only_refuses():
    assert current() is None
    assert blocking(lambda: 42) == 42
    with pytest.raises(RuntimeError):
        await_only(sleep_then(1))
