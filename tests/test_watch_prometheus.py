"""A real Prometheus (Debian's package) scrapes a real `duplex serve --config toy-voice` on loopback
while a real aiortc client calls it and barges in; the turn and barge-in histograms are read back
through Prometheus's own query API and must say what the client was told, call by call. The same
server records its calls (``--record``): the recorded WAV must have the agent's audio stop where
the caller barged in. The server has an API key: Prometheus scrapes with it; without it
``/metrics`` is refused while the health probes stay open."""

from __future__ import annotations

import json
import shutil
import wave

import httpx
import numpy as np
import pytest
from ops_helpers import prometheus

from duplex.config.session import VadConfig
from duplex_tools.client import RealtimeClient
from duplex_tools.harness import ServerProcess, espeak
from duplex_tools.probes import ask, barge_in, next_response

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("loopback_candidates"),
              pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng is not installed"),
              pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus is not installed "
                                                                              "(scripts/setup.sh --test)")]
FRAME_S = 0.02
BARGE_INS = 2
KEY = "sk-test-metrics-scrape-key"


@pytest.fixture(scope="module")
def recordings(tmp_path_factory):
    return tmp_path_factory.mktemp("recordings")


@pytest.fixture(scope="module")
def server(recordings):
    with ServerProcess(["--config", "toy-voice", "--port", "0", "--ice-loopback", "--max-sessions", "4",
                        "--record", str(recordings), "--api-key", KEY]) as proc:
        yield proc
    assert proc.stop() == 0, "".join(proc.output[-30:])


@pytest.fixture(scope="module")
def question() -> np.ndarray:
    return espeak("Could you tell me what time it is")


@pytest.fixture(scope="module")
def interruption() -> np.ndarray:
    return espeak("Wait, stop")


async def call_with_barge_ins(url: str, question: np.ndarray, interruption: np.ndarray, rounds: int):
    """Ask, then cut ``rounds`` replies in a row; hang up once the last reply was heard starting.
    Returns the client (closed) and the call id."""
    client = RealtimeClient(url, api_key=KEY)
    await client.connect()
    try:
        response_id = (await ask(client, question))["response"]["id"]
        for _ in range(rounds):
            await barge_in(client, response_id, interruption)
            cut = next(e for e in client.of_type("response.done") if e["response"]["id"] == response_id)
            response_id = (await next_response(client, after=client.time_of(cut)))["response"]["id"]
        await client.wait_event("output_audio_buffer.started", timeout=20, response_id=response_id)
        await client.wait_event("duplex.metrics", timeout=5, response_id=response_id)
    finally:
        call_url = client.call_url
        assert await client.hang_up() == 204
    return client, call_url.rsplit("/", 1)[1].rsplit("_", 1)[0]  # the call's id, without its Location token


def _server_metrics(client: RealtimeClient) -> tuple[list[dict], list[float]]:
    events = client.of_type("duplex.metrics")
    return [e for e in events if e.get("ttfa_ms") is not None], [e["barge_in_ms"] for e in events
                                                                  if e.get("barge_in_ms") is not None]


async def test_prometheus_reads_the_turn_and_barge_in_histograms(server, question, interruption, tmp_path):
    assert httpx.get(f"{server.url}/metrics", timeout=5).status_code == 401  # the key guards the metrics ...
    assert httpx.get(f"{server.url}/metrics", timeout=5).status_code == 401  # (twice: counted below)
    for probe in ("/healthz", "/readyz"):  # ... not the probes a load balancer makes
        assert httpx.get(f"{server.url}{probe}", timeout=5).status_code == 200
    with prometheus([server.url.removeprefix("http://")], tmp_path, bearer=KEY) as prom:
        prom.wait_for('up{job="duplex"}', lambda v: v == 1)
        client, _ = await call_with_barge_ins(server.url, question, interruption, BARGE_INS)
        turns, stops = _server_metrics(client)
        assert len(stops) == BARGE_INS and len(turns) == BARGE_INS + 1
        door = '{door="webrtc"}'
        prom.wait_for(f"duplex_barge_in_stop_seconds_count{door}", lambda v: v == BARGE_INS)
        prom.wait_for(f"duplex_turn_first_audio_seconds_count{door}", lambda v: v == len(turns))
        # The buckets say what each call was told, barge-in by barge-in.
        for le in ("0.04", "0.1", "0.2", "+Inf"):
            bound = float(le.replace("+Inf", "inf"))
            counted = prom.value(f'duplex_barge_in_stop_seconds_bucket{{door="webrtc",le="{le}"}}')
            assert counted == sum(1 for ms in stops if ms / 1000 <= bound), (le, stops)
        ttfa_sum = prom.value(f"duplex_turn_first_audio_seconds_sum{door}")
        assert ttfa_sum == pytest.approx(sum(e["ttfa_ms"] for e in turns) / 1000, abs=1e-6)
        # Each part of a turn is there, once per turn, and together they make up the time to first audio.
        parts = prom.query(f"duplex_turn_part_seconds_sum{door}")
        by_part = {p["metric"]["part"]: float(p["value"][1]) for p in parts}
        assert {"end_of_turn", "asr_tail", "first_token", "first_phrase", "tts_first_chunk", "playout"} <= set(by_part)
        assert sum(by_part.values()) == pytest.approx(ttfa_sum, abs=0.001 * len(turns) * len(by_part))
        silence = VadConfig().silence_ms / 1000  # the end-of-turn wait is at least the silence that ends a turn
        assert by_part["end_of_turn"] >= len(turns) * (silence - FRAME_S)
        # The stages: every step timed, the voice stage's real-time factor (its pace is 0.3 s per s).
        assert prom.value('sum(duplex_stage_step_seconds_count{stage="voice"})') > 0
        rtf = prom.value('duplex_stage_real_time_factor{stage="voice"}')
        assert rtf is not None and 0.3 <= rtf < 1.0
        assert prom.value('duplex_calls_total{door="webrtc"}') >= 1
        # every verdict on the caller's sounds the client was told of is counted, by kind
        judged = [e["kind"] for e in client.of_type("duplex.overlap.judged")]
        assert judged.count("interruption") == BARGE_INS
        for kind in ("interruption", "backchannel", "noise"):  # each scraped once it was counted
            prom.wait_for(f'duplex_overlap_verdicts_total{{door="webrtc",kind="{kind}"}}',
                          lambda v, n=judged.count(kind): v == n)
        assert prom.value('duplex_auth_refused_total{reason="refused"}') >= 2
        prom.wait_for("sum(duplex_sessions) or vector(0)", lambda v: v == 0)


async def test_a_recorded_call_has_the_agent_stop_where_the_caller_barged_in(server, question, interruption,
                                                                            recordings):
    client, call_id = await call_with_barge_ins(server.url, question, interruption, 1)
    events = [json.loads(line) for line in (recordings / f"{call_id}.jsonl").read_text().splitlines()]
    truncated = next(e["event"] for e in events if e["event"]["type"] == "conversation.item.truncated")
    stop_ms = next(e["event"]["barge_in_ms"] for e in events
                   if e["event"]["type"] == "duplex.metrics" and e["event"]["barge_in_ms"] is not None)
    with wave.open(str(recordings / f"{call_id}.wav")) as w:
        rate = w.getframerate()
        pcm = np.frombuffer(w.readframes(w.getnframes()), np.int16).reshape(-1, 2).astype(np.float32) / 32768
    frame = int(rate * FRAME_S)
    usable = len(pcm) - len(pcm) % frame
    rms = np.sqrt(np.mean(pcm[:usable].reshape(-1, frame, 2) ** 2, axis=1))  # per 20 ms frame, per channel
    caller_loud, agent_loud = rms[:, 0] > 0.01, rms[:, 1] > 0.01
    # On the recording's own timeline: the reply starts, the caller speaks over it, the reply stops.
    first_agent = int(np.flatnonzero(agent_loud)[0])
    onset = next(i for i in range(first_agent, len(caller_loud)) if caller_loud[i:i + 3].all())
    quiet_after = round(0.6 / FRAME_S)  # the next reply comes after the interruption and the end-of-turn silence
    assert not agent_loud[onset + quiet_after // 2:onset + quiet_after].any(), "the agent went on talking"
    last_agent = int(np.flatnonzero(agent_loud[:onset + quiet_after])[-1])
    tolerance = 3  # frames: the frame in flight, the pacer's frame, the rate conversion's delay
    # The agent was still speaking when the caller began, and stopped as soon after as the server
    # says it flushed the reply, counted from the onset. The server counts from its VAD's onset,
    # which may lie up to the VAD's start window after the audio turned loud here.
    cut_ms = (last_agent + 1 - onset) * FRAME_S * 1000
    late_onset_ms = VadConfig().start_window_ms
    assert 0 < cut_ms <= stop_ms + late_onset_ms + tolerance * FRAME_S * 1000, (first_agent, onset, last_agent, stop_ms)
    # ... and the recording holds as much of the reply as the server says the caller heard of it
    # (its audible frames: a frame the pipeline was late with is silence, heard by no one).
    heard_ms = int(agent_loud[first_agent:last_agent + 1].sum()) * FRAME_S * 1000
    assert abs(heard_ms - truncated["audio_end_ms"]) <= tolerance * FRAME_S * 1000, (heard_ms, truncated)
    print(f"\nrecording: cut {cut_ms:.0f} ms after the caller's onset (server: {stop_ms} ms); "
          f"{heard_ms:.0f} ms of the reply in it (server: {truncated['audio_end_ms']} ms heard)")
    stats = httpx.get(f"{server.url}/duplex/stats", timeout=5, headers={"Authorization": f"Bearer {KEY}"})
    assert stats.json()["sessions"]["live"] == 0
