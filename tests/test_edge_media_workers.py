"""WebRTC media in worker processes (`duplex serve --media-workers N`), end to end over loopback
with a real aiortc client against `--config toy-voice`: events both ways through a worker, a
worker killed mid-reply (its call ends and frees its slot, the worker is started again, the next
call is answered), an offer to a worker that stops before answering (503), and no worker left
behind when the server stops. The call tests of test_edge_webrtc.py run through workers too (its
server fixture runs both ways)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys

import httpx
import numpy as np
import psutil
import pytest

from duplex_tools.client import RealtimeClient
from duplex_tools.harness import ServerProcess, espeak
from duplex_tools.offer import offer_sdp
from duplex_tools.probes import ask
from tests.runtime_helpers import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("loopback_candidates")]
STALL_S = 2.0  # the server's watchdog ends a worker silent this long (checked twice, every 0.5 s)


@pytest.fixture(scope="module")
def server():
    with ServerProcess(["--config", "toy-voice", "--port", "0", "--ice-loopback", "--max-sessions", "2",
                        "--media-workers", "1", "--media-stall-s", str(STALL_S)]) as proc:
        yield proc
        pids = asyncio.run(media(proc.url))["pids"]
        assert pids, "no media worker was up at the end"
        assert proc.stop() == 0, "".join(proc.output[-30:])
    for pid in pids:  # gone with the server (a zombie would be the server's to reap; it exited)
        assert not _alive(pid), f"media worker {pid} outlived the server"


@pytest.fixture(scope="module")
def question() -> np.ndarray:
    return espeak("Could you tell me what time it is")


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def stats(url: str) -> dict:
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        reply = await http.get("/duplex/stats", params={"detail": "1"})  # loopback: pids shown
        assert reply.status_code == 200
        return reply.json()


async def media(url: str) -> dict:
    return (await stats(url))["edges"]["media"]


async def media_down_refusals(url: str) -> float:
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        metrics = (await http.get("/metrics")).text
    key = 'duplex_calls_refused_total{door="webrtc",reason="media_down"} '
    (line,) = [line for line in metrics.splitlines() if line.startswith(key)]
    return float(line.removeprefix(key))


async def until(url: str, accept, timeout: float = 10.0) -> dict:
    """The server's stats once ``accept(stats)`` holds."""
    seen: list[dict] = []

    async def reached() -> bool:
        seen.append(await stats(url))
        return accept(seen[-1])

    await wait_for(reached, timeout=timeout, what="the expected stats")
    return seen[-1]


async def test_events_travel_both_ways_through_the_worker(server):
    client = RealtimeClient(server.url)
    await client.connect()
    try:
        assert (await media(server.url))["calls"] == [1]
        client.send({"type": "session.update", "session": {"instructions": "Speak like a pirate."}})
        updated = await client.wait_event("session.updated")
        assert updated["session"]["instructions"] == "Speak like a pirate."
        client.send({"type": "no.such.event"})
        error = await client.wait_event("error")
        assert "no.such.event" in error["error"]["message"]
    finally:
        assert await client.hang_up() == 204
    await until(server.url, lambda s: s["edges"]["media"]["calls"] == [0] and s["edges"]["webrtc"]["live_calls"] == 0)


async def test_a_worker_killed_mid_reply_ends_its_call_and_the_next_call_is_answered(server, question):
    await worker_gone_mid_reply(server, question, signal.SIGKILL, within_s=10.0)


async def test_a_stopped_worker_is_ended_by_the_watchdog_and_the_next_call_is_answered(server, question):
    """SIGSTOP: the process lives but answers nothing; the server must not wait for it forever."""
    await worker_gone_mid_reply(server, question, signal.SIGSTOP, within_s=STALL_S + 1.0 + 10.0)


async def worker_gone_mid_reply(server, question: np.ndarray, how: signal.Signals, within_s: float) -> None:
    before = await stats(server.url)
    failed_before = before["edges"]["webrtc"]["failed"]
    restarts_before = before["edges"]["media"]["restarts"]
    (victim,) = before["edges"]["media"]["pids"]
    client = RealtimeClient(server.url)
    await client.connect()
    try:
        created = await ask(client, question)
        await client.wait_event("output_audio_buffer.started", response_id=created["response"]["id"])
        os.kill(victim, how)
        after = await until(server.url, lambda s: s["edges"]["webrtc"]["live_calls"] == 0
                            and s["edges"]["media"]["up"] == 1
                            and s["edges"]["media"]["restarts"] == restarts_before + 1, timeout=within_s)
        assert after["edges"]["webrtc"]["failed"] == failed_before + 1
        assert after["sessions"]["live"] == 0  # the slot is free, not held until the caller gives up
        assert after["edges"]["media"]["pids"] != [victim]
        assert not _alive(victim)
    finally:
        await client.close()  # its media is gone: the server has nothing left to hang up
    await a_call_is_answered(server, question)


async def a_call_is_answered(server, question: np.ndarray) -> None:
    client = RealtimeClient(server.url)
    await client.connect()
    try:
        created = await ask(client, question)
        await client.wait_event("output_audio_buffer.started", response_id=created["response"]["id"])
        done = await client.wait_event("response.done", timeout=15)
        assert done["response"]["status"] == "completed"
    finally:
        assert await client.hang_up() == 204


async def test_an_offer_to_a_worker_that_stops_before_answering_gets_503_not_400(server, question):
    """The worker is stopped as the offer reaches it; the watchdog ends it. The offer was fine:
    the refusal is the server's (503 naming the worker, Retry-After, counted as media_down), not
    a bad offer, and no call was opened to fail."""
    before = await stats(server.url)
    (victim,) = before["edges"]["media"]["pids"]
    webrtc = before["edges"]["webrtc"]
    refusals = await media_down_refusals(server.url)
    os.kill(victim, signal.SIGSTOP)
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=STALL_S + 20) as http:
            refused = await http.post("/v1/realtime/calls", content=await offer_sdp(),
                                      headers={"Content-Type": "application/sdp"})
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGCONT)
    assert refused.status_code == 503, refused.text
    message = refused.json()["error"]["message"]
    assert f"media worker (pid {victim}) stopped answering" in message, message
    assert int(refused.headers["Retry-After"]) >= 1
    assert await media_down_refusals(server.url) == refusals + 1
    after = await until(server.url, lambda s: s["edges"]["media"]["up"] == 1
                        and s["edges"]["media"]["restarts"] == before["edges"]["media"]["restarts"] + 1)
    assert after["sessions"]["live"] == 0
    assert (after["edges"]["webrtc"]["bad_offers"], after["edges"]["webrtc"]["failed"]) == \
        (webrtc["bad_offers"], webrtc["failed"])
    await a_call_is_answered(server, question)


async def test_a_worker_running_late_refuses_new_calls_while_its_calls_go_on(server, question):
    """Admission by load counts a media worker's event loop: stopped for 1 s (past the 500 ms
    default, short of the watchdog), it reports that lateness when it runs again, and a new offer
    gets 503 + Retry-After naming the worker's loop while the live call keeps its reply."""
    client = RealtimeClient(server.url)
    await client.connect()
    try:
        (pid,) = (await media(server.url))["pids"]
        os.kill(pid, signal.SIGSTOP)
        await asyncio.sleep(1.0)
        os.kill(pid, signal.SIGCONT)
        await until(server.url, lambda s: max(s["edges"]["media"]["loop_lag_ms"], default=0) > 500)
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
            refused = await http.post("/v1/realtime/calls", content=await offer_sdp(),
                                      headers={"Content-Type": "application/sdp"})
        assert refused.status_code == 503, refused.text
        assert "media worker's event loop" in refused.json()["error"]["message"]
        assert int(refused.headers["Retry-After"]) >= 1
        created = await ask(client, question)  # the live call goes on
        await client.wait_event("output_audio_buffer.started", response_id=created["response"]["id"])
        done = await client.wait_event("response.done", timeout=15, after=client.time_of(created))
        assert done["response"]["id"] == created["response"]["id"] and done["response"]["status"] == "completed"
        assert (await media(server.url))["pids"] == [pid]  # late, not dead: the watchdog left it
    finally:
        assert await client.hang_up() == 204


def test_the_load_bench_measures_a_server_with_its_worker_beside_one_without(tmp_path):
    """`duplex bench load --versus ARGS`: the same level against two servers, one row each; the
    default server's CPU is counted with its media worker."""
    run = subprocess.run([sys.executable, "-m", "duplex.cli", "bench", "load", "--serve", "toy-voice",
                          "--sessions", "1", "--versus", "--media-workers 0", "--json", str(tmp_path / "load.json"),
                          "--plot", str(tmp_path / "load.png")], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    rows = json.loads((tmp_path / "load.json").read_text())["levels"]
    assert [(r["sessions"], r["variant"]) for r in rows] == [(1, ""), (1, "--media-workers 0")]
    assert all(r["calls_ok"] == r["calls"] == 1 for r in rows)
    with_worker, in_server = rows
    assert with_worker["server_processes"] == in_server["server_processes"] + 1  # the worker is counted
    assert "1 (--media-workers 0)" in run.stdout
    assert (tmp_path / "load.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
