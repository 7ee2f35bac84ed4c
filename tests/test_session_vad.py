"""Turn detection on real audio: espeak speech, noise bursts, silence (16 kHz, 20 ms frames)."""

from __future__ import annotations

import numpy as np
import pytest
import webrtcvad

from duplex.config.session import VadConfig
from duplex.session.turns import SpeechStarted, SpeechStopped, TurnDetector
from duplex.session.vad import FrameClassifier
from duplex_tools.harness import espeak
from duplex_tools.turn_corpus.render import active_rms, room_noise

RATE = 16000
FRAME = 320


@pytest.fixture(scope="module")
def speech() -> np.ndarray:
    return espeak("Could you tell me what time it is", rate=RATE)


def run(audio: np.ndarray, config: VadConfig | None = None) -> tuple[list, str]:
    config = config or VadConfig()
    classifier, detector = FrameClassifier(config), TurnDetector(config)
    pcm = (np.clip(audio, -1, 1) * 32767).astype(np.int16)
    events, marks = [], ""
    for i in range(len(pcm) // FRAME):
        voiced = classifier.is_voiced(pcm[i * FRAME:(i + 1) * FRAME])
        marks += "1" if voiced else "0"
        event = detector.push(i * 20, voiced)
        if event is not None:
            events.append(event)
    return events, marks


def pad(audio: np.ndarray, before_s: float, after_s: float) -> np.ndarray:
    return np.concatenate([np.zeros(int(before_s * RATE), np.float32), audio,
                           np.zeros(int(after_s * RATE), np.float32)])


def test_speech_gives_one_turn_with_onset_and_end_where_the_speech_is(speech):
    events, _ = run(pad(speech, 1.0, 1.0))
    assert [type(e) for e in events] == [SpeechStarted, SpeechStopped]
    duration_ms = 1000 * len(speech) / RATE
    assert abs(events[0].onset_ms - 1000) <= 60
    assert abs(events[1].end_ms - (1000 + duration_ms)) <= 120


def test_end_of_turn_waits_for_the_configured_silence(speech):
    short_pause = np.concatenate([speech, np.zeros(int(0.3 * RATE), np.float32), speech])
    events, _ = run(pad(short_pause, 0.5, 1.0), VadConfig(silence_ms=500))
    assert [type(e) for e in events] == [SpeechStarted, SpeechStopped]  # a 300 ms pause does not end it
    events, _ = run(pad(short_pause, 0.5, 1.0), VadConfig(silence_ms=200))
    assert [type(e) for e in events] == [SpeechStarted, SpeechStopped] * 2


@pytest.mark.parametrize("burst_ms", [20, 40])
def test_noise_bursts_shorter_than_min_speech_start_no_turn(burst_ms):
    noise = np.random.default_rng(burst_ms).normal(0, 0.3, RATE * burst_ms // 1000).astype(np.float32)
    for offset in (0, 80, 160):  # aligned and straddling frame boundaries
        events, marks = run(pad(noise, 0.5 + offset / RATE, 1.0))
        assert events == [], marks


def test_long_noise_counts_as_speech_so_the_short_burst_result_is_the_min_duration():
    noise = np.random.default_rng(1).normal(0, 0.3, RATE // 4).astype(np.float32)
    events, _ = run(pad(noise, 0.5, 1.0))
    assert isinstance(events[0], SpeechStarted)


def test_webrtcvad_hangover_after_a_click_is_not_speech():
    click = np.random.default_rng(2).normal(0, 0.5, 960).astype(np.float32)
    _, marks = run(pad(click, 0.5, 1.0))
    voiced_after = marks[25 + 4:]
    assert "1" not in voiced_after, marks  # webrtcvad alone keeps saying speech here


def test_quiet_background_hiss_is_never_voiced():
    hiss = np.random.default_rng(3).normal(0, 0.002, RATE * 2).astype(np.float32)
    events, marks = run(hiss)
    assert events == [] and "1" not in marks


def test_a_caller_10_db_over_a_noise_there_all_along_is_heard():
    """Once the noise floor has risen to a steady noise, speech 10 dB over it still reads as speech
    (at least half the frames it has in the clear; at a 12 dB margin a third) in one turn where it
    is, and the noise alone makes no turn."""
    level = 10 ** (-24 / 20)
    said = espeak("Wait, I need to change my order", rate=RATE)
    voice = said / active_rms(said) * level
    before_s = 8.0  # the floor rises to the noise within this (3 dB/s from the quietest level)
    noise = room_noise(np.random.default_rng(4), int((before_s + 2.0) * RATE) + len(voice))
    audio = (noise / noise.std() * level / 10 ** (10 / 20)).astype(np.float32)
    start = int(before_s * RATE)
    audio[start:start + len(voice)] += voice
    events, marks = run(audio)
    _, clean_marks = run(voice)
    first, last = start // FRAME, (start + len(voice)) // FRAME
    assert marks[first:last].count("1") >= clean_marks.count("1") // 2, (marks[first:last], clean_marks)
    later = [e for e in events if getattr(e, "onset_ms", 0) >= 2000 or getattr(e, "end_ms", 0) >= 2000]
    assert [type(e) for e in later] == [SpeechStarted, SpeechStopped], later  # the noise alone made no turn
    assert abs(later[0].onset_ms - before_s * 1000) <= 100


def music(seconds: float, level_dbfs: float) -> np.ndarray:
    """A tune (harmonic notes of a quarter second, each decaying) at ``level_dbfs`` RMS: a noise
    webrtcvad keeps calling speech, unlike a steady hiss it adapts to within a few frames."""
    note = RATE // 4
    pitches = np.random.default_rng(5).choice([110, 131, 147, 165, 196, 220, 247], size=int(seconds * 4))
    f0 = np.repeat(pitches, note).astype(np.float64)
    phase = 2 * np.pi * np.cumsum(f0) / RATE
    envelope = np.tile(np.minimum(1, np.arange(note) / 400) * np.exp(-3 * np.arange(note) / RATE), len(pitches))
    tone = sum(np.sin(k * phase) / k for k in range(1, 12)) * envelope
    return (tone / np.sqrt(np.mean(tone ** 2)) * 10 ** (level_dbfs / 20)).astype(np.float32)


@pytest.mark.parametrize("quiet_dbfs", [-90.0, None])
def test_a_noise_after_a_very_quiet_moment_is_gated_once_the_floor_rises_to_it(quiet_dbfs):
    """A very quiet moment (a still room's faint hiss at -90 dBFS; digital silence: a hole in the
    stream, a muted line) drops the floor no lower than the level gate's own bar (min_level_dbfs -
    floor_margin_db, -57 dBFS), so a noise that starts after it is gated within seconds: rising
    3 dB/s, the floor reaches a -40 dBFS tune's quietest frames (its notes' ends) in about 3.5 s,
    and its notes' bodies no longer clear it by 7 dB; from -90 or -120 dBFS that takes 14 or 25 s."""
    quiet_s, tune_s = 2.0, 10.0
    quiet = np.zeros(int(quiet_s * RATE), np.float32) if quiet_dbfs is None else \
        np.random.default_rng(6).normal(0, 10 ** (quiet_dbfs / 20), int(quiet_s * RATE)).astype(np.float32)
    audio = np.concatenate([quiet, music(tune_s, -40.0)])
    _, marks = run(audio)
    pcm = (np.clip(audio, -1, 1) * 32767).astype(np.int16)
    vad = webrtcvad.Vad(VadConfig().aggressiveness)
    speechlike = "".join("1" if vad.is_speech(pcm[i * FRAME:(i + 1) * FRAME].tobytes(), RATE) else "0"
                         for i in range(len(pcm) // FRAME))
    start, settled = int(quiet_s * 50), int((quiet_s + 5.0) * 50)  # 50 frames a second
    assert marks[start:start + 50].count("1") >= 10  # its first second passes: webrtcvad alone decides
    assert speechlike[settled:].count("1") >= 100, speechlike  # webrtcvad still calls it speech later ...
    assert marks[settled:].count("1") <= speechlike[settled:].count("1") // 4, marks[settled:]  # ... the gate not


def test_config_rejects_bad_frame_sizes():
    with pytest.raises(ValueError, match="10, 20 or 30"):
        VadConfig(frame_ms=25)
    with pytest.raises(ValueError, match="start_window_ms"):
        VadConfig(min_speech_ms=200, start_window_ms=100)
    with pytest.raises(ValueError, match="resume_speech_ms"):
        VadConfig(resume_speech_ms=200, start_window_ms=120)
