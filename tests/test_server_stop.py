"""The server's stop is bounded part by part: a part that hangs is named and the stop goes on."""

import asyncio
import logging

from duplex.server.compose import _stop_step


async def test_a_part_that_never_stops_is_named_and_passed(caplog):
    hung = asyncio.Event()
    with caplog.at_level(logging.ERROR, logger="duplex.server"):
        await asyncio.wait_for(_stop_step("the hanging part", hung.wait(), limit_s=0.05), timeout=5)
    assert "stopping: the hanging part did not stop within 0.05 s" in caplog.text


async def test_a_part_that_stops_is_awaited_to_its_end():
    done: list[str] = []

    async def part() -> None:
        await asyncio.sleep(0)
        done.append("stopped")

    await _stop_step("a part", part(), limit_s=5)
    assert done == ["stopped"]
