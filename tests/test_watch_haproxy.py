"""Two `duplex serve --config toy-voice` behind a real haproxy (Debian's package) on loopback,
health-checked on ``/readyz``: calls spread over both; SIGTERM to one drains it: its live call
goes on to the end, every new call lands on the other one, and no call fails. The signalling goes
through haproxy; the media goes straight to the server that answered (its loopback candidates)."""

from __future__ import annotations

import asyncio
import shutil

import httpx
import numpy as np
import pytest
from ops_helpers import haproxy

from duplex_tools.client import RealtimeClient
from duplex_tools.harness import ServerProcess, espeak
from duplex_tools.probes import ask, hear

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("loopback_candidates"),
              pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng is not installed"),
              pytest.mark.skipif(shutil.which("haproxy") is None, reason="haproxy is not installed "
                                                                           "(scripts/setup.sh --test)")]
COOKIE = "DUPLEX"  # haproxy's affinity cookie: which server took the call


def _server(*extra: str) -> ServerProcess:
    return ServerProcess(["--config", "toy-voice", "--port", "0", "--ice-loopback", "--max-sessions", "6",
                          "--drain-timeout-s", "120", *extra])


async def _call(url: str, question: np.ndarray) -> tuple[RealtimeClient, str]:
    """A call through the balancer, heard answering; returns it and the server that took it."""
    client = RealtimeClient(url)
    await client.connect()
    created = await ask(client, question)
    started = await client.wait_event("output_audio_buffer.started", timeout=20,
                                      response_id=created["response"]["id"])
    await hear(client, client.time_of(started), 0.3)
    return client, client.cookies[COOKIE]


def _ready(server: ServerProcess) -> httpx.Response:
    return httpx.get(f"{server.url}/readyz", timeout=5)


async def _until_draining(server: ServerProcess, timeout: float = 10.0) -> None:
    """Wait until the server took the signal in (its /readyz says so); haproxy may not know yet."""
    deadline = asyncio.get_running_loop().time() + timeout
    while _ready(server).status_code != 503:
        assert asyncio.get_running_loop().time() < deadline, "the server did not start draining"
        await asyncio.sleep(0.02)


async def test_a_draining_server_finishes_its_call_while_new_calls_go_to_the_other(tmp_path):
    question = espeak("Could you tell me what time it is")
    with _server() as a, _server("--no-metrics") as b:
        assert httpx.get(f"{b.url}/metrics", timeout=5).status_code == 404  # off, and said so
        servers = {"a": a, "b": b}
        backends = {name: s.url.removeprefix("http://") for name, s in servers.items()}
        with haproxy(backends, tmp_path) as url:
            first = [await _call(url, question) for _ in range(2)]
            assert sorted(name for _, name in first) == ["a", "b"]  # spread over both
            (live_a, _), (live_b, _) = sorted(first, key=lambda c: c[1])
            assert _ready(a).json()["sessions"] == 1

            a.terminate()  # SIGTERM: a drains
            await _until_draining(a)  # haproxy notices within two checks (500 ms): a call may still be
            later = [await _call(url, question) for _ in range(3)]  # sent to a, refused, retried on b; none fails ...
            assert [name for _, name in later] == ["b", "b", "b"]  # ... and all go to b
            direct = httpx.post(f"{a.url}/v1/realtime/calls", content="v=0\r\n", timeout=5,
                                headers={"Content-Type": "application/sdp"})  # a itself turns new calls away
            assert direct.status_code == 503 and direct.headers["Retry-After"]
            assert direct.json()["error"]["type"] == "server_busy"
            exposed = httpx.get(f"{a.url}/metrics", timeout=5).text
            assert "duplex_draining 1.0" in exposed
            refusals = next(line for line in exposed.splitlines()
                            if line.startswith('duplex_calls_refused_total{door="webrtc",reason="draining"}'))
            assert float(refusals.split()[-1]) >= 1
            refused = _ready(a)
            assert refused.status_code == 503 and refused.json()["draining"] and refused.json()["sessions"] == 1

            # a's call goes on: the caller asks again and is answered, then hangs up.
            reply = await ask(live_a, question)
            started = await live_a.wait_event("output_audio_buffer.started", timeout=20,
                                              response_id=reply["response"]["id"])
            await hear(live_a, live_a.time_of(started), 0.3)
            assert await live_a.hang_up() == 204  # the affinity cookie takes it to a, draining or not
            assert await asyncio.to_thread(a.wait, 60) == 0  # its last call over, a stops by itself
            assert "duplex: draining: 1 live call(s)" in "".join(a.output)
            assert "cut off" not in "".join(a.output)

            for client, _ in [(live_b, "b"), *later]:
                assert await client.hang_up() == 204
            assert _ready(b).json() == {"ready": True, "load": 0.0, "sessions": 0, "max_sessions": 6,
                                        "draining": False, "reasons": [],
                                        "stages": {"ears": "up", "mind": "up", "voice": "up"}}
