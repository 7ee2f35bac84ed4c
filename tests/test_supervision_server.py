"""A real ``duplex serve`` whose stage is down (killed, restarts off): ``/readyz`` says not
ready and names the stage, ``/duplex/stats`` still answers (the stage shown as down, the others
with their stats), a new call is refused 503 with Retry-After, and ``/metrics`` shows the stage
down."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import httpx
import pytest

from duplex_tools.harness import ServerProcess
from duplex_tools.offer import offer_sdp  # a real offer from a peer that then goes away

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("loopback_candidates")]


async def test_a_server_whose_stage_is_down_says_not_ready_refuses_calls_and_still_reports():
    with ServerProcess(["--config", "toy-voice", "--port", "0", "--ice-loopback",
                        "--supervision.restart", "false"]) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
            assert (await http.get("/readyz")).status_code == 200
            stats = (await http.get("/duplex/stats?detail=1")).json()  # pids: the same host may see them
            assert {s["state"] for s in stats["stages"].values()} == {"up"}
            os.kill(stats["stages"]["voice"]["pid"], signal.SIGKILL)
            deadline = time.monotonic() + 10
            # not ready comes first ("stages not ready": the process is seen dead), then the
            # supervisor settles the stage as down (restart off)
            while (ready := await http.get("/readyz")).status_code == 200 or ready.json()["stages"]["voice"] != "down":
                assert time.monotonic() < deadline, f"readyz not reporting the stage down: {ready.text}"
                await asyncio.sleep(0.05)  # polling the server's HTTP answer: nothing else tells us
            assert ready.status_code == 503
            body = ready.json()
            assert body["ready"] is False and body["stages"]["voice"] == "down"
            assert any("stage voice is down" in reason for reason in body["reasons"]), body
            stats = await http.get("/duplex/stats")
            assert stats.status_code == 200
            stages = stats.json()["stages"]
            assert stages["voice"]["state"] == "down" and stages["voice"]["live_requests"] is None
            assert stages["ears"]["state"] == "up" and stages["ears"]["live_requests"] == 0
            offer = await offer_sdp()
            began = time.monotonic()
            reply = await http.post("/v1/realtime/calls", content=offer, headers={"Content-Type": "application/sdp"})
            assert reply.status_code == 503 and int(reply.headers["Retry-After"]) >= 1
            assert "stage voice is down" in reply.json()["error"]["message"]
            print(f"\nrefused in {1000 * (time.monotonic() - began):.1f} ms (HTTP round trip)")
            metrics = (await http.get("/metrics")).text
            assert 'duplex_stage_up{stage="voice"} 0.0' in metrics and 'duplex_stage_up{stage="ears"} 1.0' in metrics
            assert 'duplex_calls_refused_total{door="webrtc",reason="stage_down"} 1.0' in metrics
            assert 'duplex_admission_refusals_total{reason="stage_down"} 1.0' in metrics
            assert 'duplex_stage_cpu_wait_seconds_total{stage="ears"} ' in metrics  # exported per stage
    assert server.stop() == 0


async def _stats(http: httpx.AsyncClient) -> tuple[dict, float]:
    """/duplex/stats with pids (the same host may see them) and how long it took."""
    began = time.monotonic()
    reply = await http.get("/duplex/stats?detail=1")
    assert reply.status_code == 200, reply.text
    return reply.json(), time.monotonic() - began


async def test_stats_answer_at_once_while_a_stage_is_stopped_and_mark_it_not_answering():
    """A stage process stopped (SIGSTOP; a wedged one looks the same) holds /duplex/stats for
    supervision.stats_timeout_s (0.5 s), not for the coordinator's 5 s: the stage is shown up but
    not answering, with the age of its last stats; once continued it answers again. (It is
    continued well before the watchdog's 5 s would kill it.)"""
    timeout_s = 0.5  # supervision.stats_timeout_s, the default
    with ServerProcess(["--config", "toy-voice", "--port", "0"]) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
            stats, _ = await _stats(http)
            assert all(s["answering"] and s["stats_age_s"] == 0.0 for s in stats["stages"].values()), stats
            pid = stats["stages"]["voice"]["pid"]
            os.kill(pid, signal.SIGSTOP)
            try:
                stats, took = await _stats(http)
            finally:
                os.kill(pid, signal.SIGCONT)
            print(f"\n/duplex/stats with the voice stage stopped: {1000 * took:.0f} ms")
            voice, ears = stats["stages"]["voice"], stats["stages"]["ears"]
            assert took < timeout_s + 1.0  # the bound, plus an HTTP round trip on a busy box
            assert voice["answering"] is False and voice["state"] == "up" and voice["pid"] == pid, voice
            assert voice["live_requests"] is None and 0 <= voice["stats_age_s"] < 5, voice
            assert ears["answering"] is True and ears["live_requests"] == 0
            deadline = time.monotonic() + 5
            while not (stats := (await _stats(http))[0])["stages"]["voice"]["answering"]:
                assert time.monotonic() < deadline, f"the continued stage does not answer: {stats}"
            assert stats["stages"]["voice"]["pid"] == pid  # the same process: not killed by the watchdog
    assert server.stop() == 0
