"""The server's watch on its calls, part by part, without a server: the turn breakdown's
arithmetic, the recording's timeline, the metrics a call's events make, refusing calls while
draining."""

from __future__ import annotations

import os
import time
import wave

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from duplex.config.session import SessionConfig
from duplex.runtime.contract import SESSION_RATE, AgentAudio, AgentText, Transcript
from duplex.server.metrics import CallMetrics, MetricsTap
from duplex.server.recording import RATE, CallRecording, Recorder
from duplex.session.manager import ServerDraining, SessionManager, SessionsFull
from duplex.session.observe import Refusal
from duplex.session.playout import OutputFormat
from duplex.session.realtime import events as ev
from duplex.session.turn_timing import PARTS, TurnTiming

FORMAT = OutputFormat(sample_rate=48000, channels=2, frame_ms=20)


# -- the turn breakdown ---------------------------------------------------------------------------
def _timed(**marks: float) -> TurnTiming:
    """A response's marks, in seconds after an end of speech at t=10."""
    timing = TurnTiming()
    timing.committed = 10 + marks["committed"]
    if "transcript" in marks:
        timing.saw(Transcript("hello", final=True), 10 + marks["transcript"])
    for word, at in marks.get("words", ()):
        timing.saw(AgentText(word), 10 + at)
    if "chunk" in marks:
        timing.saw(AgentAudio(np.ones(160, np.float32), 16000, marks["chunk_text"]), 10 + marks["chunk"])
    return timing


def test_the_parts_follow_one_another_and_add_up_to_the_time_to_first_audio():
    timing = _timed(committed=0.5, transcript=0.6, words=[("Sure", 0.7), (",", 0.75), (" a", 0.8)],
                    chunk=0.9, chunk_text="Sure,")
    b = timing.breakdown(10.0, 10.95)
    assert b.parts() == {"end_of_turn": 500.0, "asr_tail": 100.0, "first_token": 100.0, "first_phrase": 50.0,
                         "tts_first_chunk": 150.0, "playout": 50.0}
    assert b.ttfa_ms == 950.0 == sum(b.parts().values())


def test_what_came_during_the_pause_costs_nothing_on_the_critical_path():
    # Preemptive generation: transcript and text before the turn was committed, audio after.
    timing = _timed(committed=0.5, transcript=0.2, words=[("Hi", 0.3)], chunk=0.55, chunk_text="Hi")
    b = timing.breakdown(10.0, 10.6)
    assert (b.end_of_turn_ms, b.asr_tail_ms, b.first_token_ms, b.first_phrase_ms) == (500.0, 0.0, 0.0, 0.0)
    assert b.tts_first_chunk_ms == pytest.approx(50.0) and b.ttfa_ms == pytest.approx(600.0)


def test_a_pipeline_without_transcript_or_text_leaves_those_parts_out():
    timing = _timed(committed=0.5, chunk=0.7, chunk_text="")
    b = timing.breakdown(10.0, 10.72)
    assert b.asr_tail_ms is b.first_token_ms is b.first_phrase_ms is None
    assert b.tts_first_chunk_ms == pytest.approx(200.0) and b.ttfa_ms == pytest.approx(720.0)
    assert set(b.parts()) == set(PARTS)


# -- metrics from a call's events -------------------------------------------------------------
def test_a_calls_events_fill_the_turn_and_barge_in_histograms():
    registry = CollectorRegistry()
    metrics = CallMetrics(registry)
    tap = MetricsTap(metrics, "webrtc", FORMAT)
    tap.event(ev.TurnMetrics(response_id="r1", ttfa_ms=640.0, end_of_turn_ms=500.0, asr_tail_ms=40.0,
                             first_token_ms=None, first_phrase_ms=30.0, tts_first_chunk_ms=50.0, playout_ms=20.0),
              "req1")
    tap.event(ev.TurnMetrics(response_id="r1", barge_in_ms=85.0), "req1")
    tap.event(ev.SpeechStarted(audio_start_ms=0, item_id="i"), None)  # not a metric: ignored
    for kind in ("backchannel", "backchannel", "interruption"):
        tap.event(ev.OverlapJudged(response_id="r1", kind=kind, decided_by="sound", audio_start_ms=0,
                                   overlap_ms=300, voiced_ms=200), "req1")
    frame = np.zeros(FORMAT.frame_samples * 2, np.int16)
    tap.agent_frame(frame, 1.0, late_s=0.019, starved=False)  # within a frame period: on time
    tap.agent_frame(frame, 1.0, late_s=0.021, starved=True)
    value = registry.get_sample_value
    assert value("duplex_turn_first_audio_seconds_count", {"door": "webrtc"}) == 1
    assert value("duplex_turn_first_audio_seconds_sum", {"door": "webrtc"}) == pytest.approx(0.64)
    assert value("duplex_turn_part_seconds_sum", {"door": "webrtc", "part": "end_of_turn"}) == pytest.approx(0.5)
    assert value("duplex_turn_part_seconds_count", {"door": "webrtc", "part": "first_token"}) == 0
    assert value("duplex_barge_in_stop_seconds_bucket", {"door": "webrtc", "le": "0.1"}) == 1
    assert value("duplex_barge_in_stop_seconds_bucket", {"door": "webrtc", "le": "0.08"}) == 0
    assert value("duplex_audio_late_frames_total", {"door": "webrtc"}) == 1
    assert value("duplex_audio_underrun_frames_total", {"door": "webrtc"}) == 1
    assert value("duplex_calls_total", {"door": "webrtc"}) == 1
    verdicts = {kind: value("duplex_overlap_verdicts_total", {"door": "webrtc", "kind": kind})
                for kind in ("interruption", "backchannel", "noise")}
    assert verdicts == {"interruption": 1, "backchannel": 2, "noise": 0}


# -- refusing calls -------------------------------------------------------------------------------
class _Refusals:
    def __init__(self) -> None:
        self.seen: list[tuple[str, Refusal]] = []

    def open_call(self, *args):
        raise AssertionError("no call may open")

    def refused(self, door: str, reason: Refusal) -> None:
        self.seen.append((door, reason))


def test_a_draining_server_refuses_new_calls_as_busy_and_says_why():
    observer = _Refusals()
    manager = SessionManager(runtime=None, config=SessionConfig(), max_sessions=2, model="m",  # type: ignore[arg-type]
                             observer=observer)
    manager.draining = True
    with pytest.raises(ServerDraining) as caught:
        manager.reserve("sip")
    assert isinstance(caught.value, SessionsFull)  # every door answers it as "busy, try again"
    assert observer.seen == [("sip", Refusal.DRAINING)]
    assert manager.counters["rejected_draining"] == 1


# -- the recording's timeline ---------------------------------------------------------------------
def _channels(path) -> np.ndarray:
    with wave.open(str(path)) as w:
        assert (w.getnchannels(), w.getframerate(), w.getsampwidth()) == (2, RATE, 2)
        return np.frombuffer(w.readframes(w.getnframes()), np.int16).reshape(-1, 2)


def test_the_recording_puts_both_sides_on_one_timeline_with_the_cut(tmp_path):
    recording = CallRecording(tmp_path / "c.wav", tmp_path / "c.jsonl", FORMAT, max_bytes=2**30)
    t0 = recording._t0
    frame_s, caller_chunk = 0.02, SESSION_RATE // 50
    loud_agent = np.full(FORMAT.frame_samples * 2, 8000, np.int16)
    quiet_agent = np.zeros_like(loud_agent)
    # 3 s of call: the agent speaks from 0.5 s and is cut at 2.0 s; the caller speaks from 1.9 s.
    for i in range(150):
        at = t0 + 0.1 + i * frame_s
        recording.agent_frame(loud_agent if 0.5 <= i * frame_s < 2.0 else quiet_agent, at, 0.0, False)
        caller = np.full(caller_chunk, 6000 if i * frame_s >= 1.9 else 0, np.int16)
        recording.caller_audio(caller, at + frame_s)  # a chunk arrives when it has all come in
    recording.event(ev.OutputAudioCleared(response_id="r"), "req")
    recording.close()
    pcm = _channels(tmp_path / "c.wav")
    loud_caller = np.flatnonzero(np.abs(pcm[:, 0]) > 3000)
    loud = np.flatnonzero(np.abs(pcm[:, 1]) > 3000)
    resampler_delay = RATE // 100  # the agent channel's rate conversion may shift it by a few ms
    assert abs(loud_caller[0] / RATE - (0.1 + 1.9)) * RATE <= 1
    assert abs(loud[0] / RATE - (0.1 + 0.5)) * RATE <= resampler_delay
    assert abs(loud[-1] / RATE - (0.1 + 2.0)) * RATE <= resampler_delay
    assert (tmp_path / "c.jsonl").read_text().count("output_audio_buffer.cleared") == 1


def test_recordings_stay_under_their_size_and_age(tmp_path):
    recorder = Recorder(tmp_path, max_bytes=3000, max_age_s=3600)
    for name in ("old", "older"):
        (tmp_path / f"{name}.wav").write_bytes(b"x" * 2000)
    os.utime(tmp_path / "older.wav", (time.time() - 60, time.time() - 60))
    os.utime(tmp_path / "old.wav", (time.time() - 30, time.time() - 30))
    recording = recorder.open_call("new", FORMAT)  # the oldest goes to make room
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new.json", "new.jsonl", "new.wav", "old.wav"]
    for _ in range(200):  # far more than 3000 bytes of audio: the file stops growing
        recording.agent_frame(np.full(FORMAT.frame_samples * 2, 100, np.int16), recording._t0, 0.0, False)
    recording.close()
    assert (tmp_path / "new.wav").stat().st_size <= 3000
    os.utime(tmp_path / "old.wav", (time.time() - 7200, time.time() - 7200))
    recorder.prune()
    assert not (tmp_path / "old.wav").exists()


def test_a_call_id_from_the_wire_makes_a_safe_file_name(tmp_path):
    recording = Recorder(tmp_path / "calls", max_bytes=2**20, max_age_s=3600).open_call("a8f@10.0.0.1/../x", FORMAT)
    recording.close()
    names = sorted(p.name for p in (tmp_path / "calls").iterdir())
    # in the folder, nowhere else (the sidecar .json says whose call it was: recording_store.py)
    assert names == ["a8f_10.0.0.1_.._x.json", "a8f_10.0.0.1_.._x.jsonl", "a8f_10.0.0.1_.._x.wav"]


def test_every_call_event_is_one_json_line_naming_the_call(tmp_path):
    import json

    from duplex.server import call_log

    call_log.configure(str(tmp_path / "calls.jsonl"), "warning")
    try:
        tap = call_log.CallLogTap("sess_1", "sip", "call-7@host")
        tap.event(ev.TurnMetrics(response_id="resp_1", ttfa_ms=420.0), "req_9")
        tap.close()
        call_log.refused("webrtc", Refusal.DRAINING.value)
    finally:
        call_log.configure(None, "warning")
    lines = [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]
    assert [line["event"] for line in lines] == ["call.opened", "duplex.metrics", "call.closed", "call.refused"]
    metrics = lines[1]
    assert {k: metrics[k] for k in ("call_id", "session_id", "request_id", "door")} == {
        "call_id": "call-7@host", "session_id": "sess_1", "request_id": "req_9", "door": "sip"}
    assert metrics["data"]["ttfa_ms"] == 420.0 and "ts" in metrics
    assert lines[3]["reason"] == "draining"
