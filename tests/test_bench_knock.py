"""Knocks on a full server's door (`duplex bench load --knock-rate`), against a real
`duplex serve --config toy-voice` with one slot: while a real call holds it, every knock is a
503 with Retry-After and the call stays up; once it is free, knocks are admitted and hung up at
once, so they hold nothing."""

from __future__ import annotations

import asyncio

import pytest

from duplex.cli import main
from duplex_tools.bench.knock import knock_until
from duplex_tools.client import RealtimeClient
from duplex_tools.harness import ServerProcess
from tests.test_edge_doors import stats, wait_no_sessions

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("loopback_candidates")]


def test_knocks_need_one_level(capsys):
    assert main(["bench", "load", "--url", "http://127.0.0.1:9", "--sessions", "1,2", "--knock-rate", "5"]) == 2
    assert "--knock-rate needs" in capsys.readouterr().err


async def test_a_full_server_refuses_knocks_and_admitted_knocks_are_hung_up():
    with ServerProcess(["--config", "toy-voice", "--port", "0", "--ice-loopback", "--max-sessions", "1"]) as server:
        assert server.url is not None
        caller = RealtimeClient(server.url)
        await caller.connect()
        try:
            knocks = await knock_until(server.url, 50.0, asyncio.Event(), max_knocks=10)
            assert dict(knocks.answers) == {503: 10} and not knocks.errors
            assert knocks.without_retry_after == 0 and knocks.admitted == 0
            assert len(knocks.refused_ms) == 10 and min(knocks.refused_ms) > 0
            assert caller.pc.connectionState == "connected"
            assert (await stats(server.url))["sessions"]["live"] == 1
        finally:
            assert await caller.hang_up() == 204
        await wait_no_sessions(server.url)
        knocks = await knock_until(server.url, 50.0, asyncio.Event(), max_knocks=3)
        assert knocks.admitted == 3 and dict(knocks.answers) == {201: 3}
        await wait_no_sessions(server.url)
