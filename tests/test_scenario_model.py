"""Scenario files, their audio, and the arithmetic of the measurements (no server here: the
end-to-end runs are in test_scenario_toy.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from duplex.cli import main
from duplex_tools.harness import write_wav
from duplex_tools.scenario.audio import loud_span, noise_burst, step_audio
from duplex_tools.scenario.frames import frame_quality
from duplex_tools.scenario.measure import measure
from duplex_tools.scenario.model import ScenarioError, find_scenarios, load_scenario
from duplex_tools.scenario.recording import Recording, StepRecord

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"
REQUIRED = {"plain-turn", "multi-turn", "barge-in-early", "barge-in-mid", "barge-in-late", "repeated-barge-ins",
            "noise-burst", "backchannel", "cough-during-reply", "long-pause-mid-sentence", "silence-timeout", "echo"}


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return path


def test_the_shipped_scenarios_load_and_cover_the_required_situations():
    scenarios = {s.name: s for s in find_scenarios([SCENARIOS])}
    assert set(scenarios) >= REQUIRED, REQUIRED - set(scenarios)
    barge_ins = [s for s in scenarios.values() if any(step.expect.interrupts for step in s.steps)]
    assert len(barge_ins) >= 5
    assert scenarios["echo"].echo_gain > 0
    assert scenarios["long-pause-mid-sentence"].session["turn_detection"]["silence_duration_ms"] == 1200
    assert {"plain-turn", "barge-in-early"} <= {s.name for s in find_scenarios([SCENARIOS], ["smoke"])}


@pytest.mark.parametrize("body, complaint", [
    ("steps: [{say: hi, pause: 1}]", "exactly one of say, wav, noise, pause"),
    ("steps: [{say: hi, expect: {max_stop_ms: 100}}]", "max_stop_ms needs interrupts: true"),
    ("steps: [{say: hi, expect: {max_ttfb_ms: 100}}]", "need reply: true"),
    ("steps: [{say: hi, at: {agent_done: true, after_s: 1}}]", "exactly one of agent_heard_s"),
    ("steps: [{say: hi, shout: true}]", "steps.0.shout"),
    ("steps: []", "steps"),
    ("steps: [{wav: missing.wav}]", "wav file not found"),
    ("- just a list", "top level must be a mapping"),
])
def test_a_bad_scenario_is_refused_with_the_file_and_the_key(tmp_path, body, complaint):
    path = write(tmp_path, "bad", body)
    with pytest.raises(ScenarioError) as error:
        load_scenario(path)
    assert str(path) in str(error.value) and complaint in str(error.value)


def test_the_cli_exits_2_on_a_bad_scenario(tmp_path, capsys):
    write(tmp_path, "bad", "steps: [{noise: 99}]")
    assert main(["scenario", "run", str(tmp_path), "--url", "http://127.0.0.1:9"]) == 2
    assert "noise" in capsys.readouterr().err


def test_wav_steps_play_the_file_resampled_to_48k(tmp_path):
    tone = 0.5 * np.sin(2 * np.pi * 440 * np.arange(16000) / 16000).astype(np.float32)
    write_wav(tmp_path / "tone.wav", tone, 16000)
    scenario = load_scenario(write(tmp_path, "wav", "steps: [{wav: tone.wav, level: 0.5}]"))
    audio = step_audio(scenario, scenario.steps[0])
    assert abs(len(audio) - 48000) < 100
    assert abs(np.max(np.abs(audio)) - 0.25) < 0.02
    assert loud_span(audio) == (0, 49)


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng is not installed")
def test_say_steps_are_spoken_with_espeak(tmp_path):
    scenario = load_scenario(write(tmp_path, "say", "steps: [{say: Hello there, words_per_minute: 200}]"))
    audio = step_audio(scenario, scenario.steps[0])
    assert 0.4 < len(audio) / 48000 < 2.0
    first, last = loud_span(audio)
    assert first <= 2 and last >= len(audio) // 960 - 3  # espeak-ng output is trimmed to its speech


def test_noise_bursts_have_the_asked_length_and_level():
    click = noise_burst(0.04, "white", 1.0)
    cough = noise_burst(0.2, "cough", 1.0)
    assert len(click) == 1920 and abs(np.sqrt(np.mean(click**2)) - 0.3) < 0.01
    assert np.abs(cough[:4800]).mean() > 3 * np.abs(cough[-4800:]).mean()  # it decays


def _recording() -> Recording:
    """A barge-in, as the client would log it: the agent talks from 2.0 s, the caller speaks
    at 3.0 s, the agent's audio goes on arriving until 3.14 s."""
    rec = Recording("synthetic", session_id="s", silence_ms=500, started_at=0.0)
    rec.sent = [(0.02 * i, 0.0) for i in range(300)]
    rec.heard = [(0.02 * i, 0.1 if 100 <= i < 157 or i >= 220 else 0.0, 960 * i) for i in range(300)]
    rec.steps = [StepRecord(0, "say", "question", 0.0, 1.5, onset=0.0, end=1.0),
                 StepRecord(1, "say", "stop", 2.98, 3.6, onset=3.0, end=3.5, playing_ids=["r1"], freed_after_ms=20.0)]
    rec.events = [(1.6, {"type": "response.created", "response": {"id": "a"}}),
                  (2.0, {"type": "output_audio_buffer.started", "response_id": "a"}),
                  (3.1, {"type": "response.done", "response": {"id": "a", "status": "cancelled"}}),
                  (3.1, {"type": "output_audio_buffer.cleared", "response_id": "a"}),
                  (4.1, {"type": "response.created", "response": {"id": "b"}}),
                  (4.4, {"type": "output_audio_buffer.started", "response_id": "b"})]
    rec.hangup_status, rec.idle_at_end, rec.finished_at = 204, True, 6.0
    return rec


def test_measurements_of_a_barge_in(tmp_path):
    scenario = load_scenario(write(tmp_path, "b", """
steps:
  - {say: question, expect: {reply: true, max_ttfb_ms: 1500}}
  - {say: stop, at: {agent_heard_s: 1}, expect: {interrupts: true, max_stop_ms: 100, reply: true}}
"""))
    result = measure(scenario, _recording())
    first, second = result.steps
    assert first.ttfb_ms == pytest.approx(1000.0) and first.reply_response == "a"
    assert first.reply_gap_ms == pytest.approx(0.0)  # its audio ran without a break until the cut
    assert second.cut_response == "a" and second.barge_in and second.agent_speaking_at_onset
    assert second.stop_ms == pytest.approx(140.0)  # the last loud frame arrived at 3.12 s and lasted 20 ms
    assert second.ttfb_ms == pytest.approx(900.0)  # "stop" ended at 3.5 s, reply b heard from 4.4 s
    assert result.false_interruptions == 0
    assert not result.passed and result.failures == ["step 2 max_stop_ms: 140 ms (limit 100)"]


def test_a_cut_by_noise_is_a_false_interruption(tmp_path):
    scenario = load_scenario(write(tmp_path, "n", """
steps:
  - {say: question, expect: {reply: true}}
  - {noise: 0.5, at: {agent_heard_s: 1}, expect: {interrupts: false}}
"""))
    result = measure(scenario, _recording())
    assert result.false_interruptions == 1 and result.take_overs == 1
    assert {f.split(":")[0] for f in result.failures} == {"false_interruptions", "step 2 keeps_talking"}


def test_frame_quality_counts_gaps_and_late_arrivals():
    rec = Recording("frames")
    pts = [960 * i for i in range(100) if i not in (10, 11, 50)]  # three frames never arrived
    rec.heard = [(0.02 * p / 960 + (0.1 if p == 960 * 70 else 0.0), 0.0, p) for p in pts]
    rec.sent = [(0.02 * i + (0.05 if i >= 30 else 0.0), 0.0) for i in range(100)]  # one 70 ms gap
    quality = frame_quality(rec, late_ms=60)
    assert (quality.heard, quality.lost, quality.late, quality.mic_stalls) == (97, 3, 1, 1)
    assert quality.max_lateness_ms == pytest.approx(100.0)


def test_the_next_replys_audio_heard_before_its_started_event_is_not_the_cut_ones(tmp_path):
    scenario = load_scenario(write(tmp_path, "early", """
steps:
  - {say: question, expect: {reply: true}}
  - {say: stop, at: {agent_heard_s: 1}, expect: {interrupts: true, max_stop_ms: 300, reply: true}}
"""))
    rec = _recording()
    # Reply b's first frames arrive at 4.3 s, before its output_audio_buffer.started (4.4 s).
    rec.heard = [(at, 0.1 if 4.3 <= at < 4.4 else rms, pts) for at, rms, pts in rec.heard]
    (second,) = measure(scenario, rec).steps[1:]
    assert second.stop_ms == pytest.approx(140.0)
