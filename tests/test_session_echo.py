"""Echo gating: the agent's own voice coming back at a reduced level is not the caller."""

from __future__ import annotations

import numpy as np
import pytest

from duplex.config.session import EchoConfig, VadConfig
from duplex.models.toy_voice.synth import speak
from duplex.session.echo import EchoGate
from duplex.session.turns import SpeechStarted, TurnDetector
from duplex.session.vad import FrameClassifier
from duplex_tools.harness import espeak

RATE = 16000
FRAME = 320
DELAY_S = 0.137


@pytest.fixture(scope="module")
def agent() -> np.ndarray:
    words = ["this", "is", "the", "toy", "voice", "answering", "your", "question", "at", "some", "length", "so", "you",
             "can", "hear", "it"]
    voice = np.concatenate([speak(w, i) for i, w in enumerate(words)])
    return np.concatenate([np.zeros(RATE // 2, np.float32), voice, np.zeros(RATE, np.float32)])


@pytest.fixture(scope="module")
def user() -> np.ndarray:
    return espeak("Wait, stop please", rate=RATE)


def microphone(agent: np.ndarray, gain: float, user: np.ndarray | None = None, user_at_s: float = 0.0) -> np.ndarray:
    delay = int(DELAY_S * RATE)
    mic = gain * np.concatenate([np.zeros(delay, np.float32), agent])[: len(agent)]
    mic = mic + np.random.default_rng(0).normal(0, 0.001, len(mic)).astype(np.float32)
    if user is not None:
        start = int(user_at_s * RATE)
        mic[start:start + len(user)] += user[: len(mic) - start]
    return mic


def listen(agent: np.ndarray, mic: np.ndarray, echo: EchoConfig | None = None):
    """Feed output and input frame by frame on one clock; return (speech starts, gate)."""
    gate, vad = EchoGate(echo or EchoConfig()), FrameClassifier(VadConfig())
    detector = TurnDetector(VadConfig())
    starts = []
    for i in range(len(agent) // FRAME):
        now = 100.0 + (i + 1) * FRAME / RATE
        gate.record_output((agent[i * FRAME:(i + 1) * FRAME] * 32767).astype(np.int16), now)
        frame = (np.clip(mic[i * FRAME:(i + 1) * FRAME], -1, 1) * 32767).astype(np.int16)
        is_echo = gate.is_echo(frame, now + 0.003)  # input arrives a little after the output left
        event = detector.push(i * 20, vad.is_voiced(frame) and not is_echo)
        if isinstance(event, SpeechStarted):
            starts.append(event.onset_ms)
    return starts, gate


@pytest.mark.parametrize("gain", [0.1, 0.3, 0.6])
def test_echo_alone_starts_no_turn(agent, gain):
    starts, gate = listen(agent, microphone(agent, gain))
    assert starts == []
    assert gate.gated_frames > 50
    assert abs(gate.delay_ms - 1000 * DELAY_S - 3) < 3  # the path's delay (+ the 3 ms arrival offset)


def test_without_the_gate_the_same_echo_would_interrupt(agent):
    starts, _ = listen(agent, microphone(agent, 0.3), EchoConfig(enabled=False))
    assert starts, "the echo is loud enough for the VAD: the gate is what keeps it out"


def test_the_caller_talking_over_the_echo_is_heard_at_once(agent, user):
    user_at_s = 1.5
    starts, _ = listen(agent, microphone(agent, 0.3, user, user_at_s))
    assert starts, "barge-in over echo was missed"
    onset_ms = 1000 * (user_at_s + np.flatnonzero(np.abs(user) > 0.05)[0] / RATE)
    assert starts[0] - onset_ms < 60, (starts, onset_ms)


def test_with_the_agent_silent_nothing_is_gated(user):
    silence = np.zeros(3 * RATE, np.float32)
    starts, gate = listen(silence, microphone(silence, 0.0, user, 0.5))
    assert starts and gate.gated_frames == 0


def microphone_with_a_delay_change(agent: np.ndarray, gain: float, at_s: float, change_ms: int) -> np.ndarray:
    """The echo path's delay changes by ``change_ms`` at ``at_s`` (a client's jitter buffer grows
    or shrinks, frames are lost); a longer delay leaves a hole of that length in the echo."""
    before, after = int(DELAY_S * RATE), int((DELAY_S + change_ms / 1000) * RATE)
    at = int(at_s * RATE)
    mic = np.concatenate([np.zeros(before, np.float32), agent])[:at]
    later = np.concatenate([np.zeros(after, np.float32), agent])[at:len(agent)]
    if change_ms > 0:
        later[:after - before] = 0
    mic = gain * np.concatenate([mic, later])
    return mic + np.random.default_rng(0).normal(0, 0.001, len(mic)).astype(np.float32)


@pytest.mark.parametrize("change_ms", [40, 100, 300, -40, -100])
def test_a_jump_in_the_echo_delay_mid_reply_starts_no_turn(agent, change_ms):
    """Every place in the reply (every 100 ms over its voiced part) where the path could change."""
    for at_s in np.arange(0.8, 3.6, 0.1):
        starts, gate = listen(agent, microphone_with_a_delay_change(agent, 0.3, float(at_s), change_ms))
        assert starts == [], f"the delay changed by {change_ms} ms at {at_s:.1f} s and the echo started a turn"
    assert abs(gate.delay_ms - (1000 * DELAY_S + change_ms) - 3) < 3  # it follows the new delay
