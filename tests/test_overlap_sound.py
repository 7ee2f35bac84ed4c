"""The learned reading of an overlap's sound (``barge_in.sound: learned``): the judge asks it once,
when the voiced time reaches ``interrupt_ms``, and a sound it hears as a backchannel or a noise is
held for its words (an interruption then comes from the words or ``max_overlap_ms``); the
acoustic features it reads tell a voice from a keyboard and music; a session asks it with the
overlap's frames. All on stream time (no clock)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from duplex.config.session import BargeInConfig, SessionConfig
from duplex.runtime.contract import Transcript
from duplex.session.overlap import RECHECK_MS, Listening, OverlapJudge, OverlapKind
from duplex.session.overlap_sound import SOUND_FEATURES, SoundTrace, sound_features
from duplex.session.turn_model import MODEL_PATH, TurnModels

FRAME_MS = 20
CONFIG = BargeInConfig()
RATE = 16_000


def _judge(reading: list[bool] | None, config: BargeInConfig = CONFIG) -> tuple[OverlapJudge, list[int]]:
    """A judge whose sound reading answers ``reading`` in turn (its last answer from then on; None:
    no reading); the span of the sound at each reading."""
    asked: list[int] = []
    judge = OverlapJudge(config, onset_ms=1000, now_ms=1080, voiced_ms=80)

    def read() -> bool:
        asked.append(judge.span_ms)
        return reading[min(len(asked), len(reading)) - 1]

    if reading is not None:
        judge.hold_for_words(read)
    return judge, asked


def _run(judge: OverlapJudge, frames: str):
    for n, frame in enumerate(frames, 1):
        verdict = judge.push(FRAME_MS, frame == "v")
        if verdict is not None:
            return verdict, n
    return None, len(frames)


def test_a_sound_heard_as_no_interruption_is_held_past_interrupt_ms_and_read_again_until_max_held_ms():
    judge, asked = _judge([True])
    verdict, _ = _run(judge, "v" * 400)
    # read when the voiced time would interrupt (at a span of interrupt_ms), then every RECHECK_MS
    assert asked == list(range(CONFIG.interrupt_ms, CONFIG.held_limit_ms + 1, RECHECK_MS))
    assert verdict.interrupts and verdict.held and verdict.span_ms == CONFIG.held_limit_ms == 2 * CONFIG.max_overlap_ms
    judge, asked = _judge([True, True, False])  # read again as a caller taking the floor: cut then
    verdict, _ = _run(judge, "v" * 400)
    assert verdict.interrupts and verdict.held and verdict.span_ms == CONFIG.interrupt_ms + 2 * RECHECK_MS
    judge, asked = _judge([False])  # heard as a caller taking the floor: cut at interrupt_ms, as without it
    verdict, _ = _run(judge, "v" * 400)
    assert asked == [CONFIG.interrupt_ms] and verdict.interrupts and not verdict.held
    assert verdict.voiced_ms == CONFIG.interrupt_ms
    plain, asked = _judge(None)
    assert _run(plain, "v" * 400)[0].voiced_ms == CONFIG.interrupt_ms and not asked


def test_a_sparse_sound_is_read_when_it_reaches_max_overlap_ms_and_held():
    sparse = "v...." * 200  # a keyboard: never interrupt_ms voiced, never resume_ms quiet
    verdict, _ = _run(_judge(None)[0], sparse)
    assert verdict.interrupts and verdict.span_ms == CONFIG.max_overlap_ms and not verdict.held
    judge, asked = _judge([True])
    verdict, _ = _run(judge, sparse)
    assert asked[0] == CONFIG.max_overlap_ms and verdict.held and verdict.span_ms == CONFIG.held_limit_ms
    assert BargeInConfig(max_held_ms=2000).held_limit_ms == 2000
    with pytest.raises(ValueError, match="max_held_ms"):
        BargeInConfig(max_held_ms=1000)


def test_a_held_sound_that_ends_is_judged_as_a_sound_that_ended():
    judge, _ = _judge([True])
    verdict, _ = _run(judge, "v" * 40 + "." * 40)  # 880 ms voiced, then quiet: "mm-hmm, mm-hmm"
    assert verdict.kind is OverlapKind.BACKCHANNEL and verdict.held and verdict.voiced_ms == 880


def _listen(words: bool, holds: bool, text: str) -> tuple[OverlapKind, bool, int]:
    """A 900 ms sound (past interrupt_ms), then silence until its words are final; the words
    arrive then. The verdict's kind, whether it was held, and the times the reading was asked."""
    asked: list[bool] = []

    def reading() -> bool:
        asked.append(holds)
        return holds

    listening: Listening[object] = Listening(sound=reading)
    listening.begin(OverlapJudge(CONFIG, onset_ms=0, now_ms=60, voiced_ms=60, word_ms=80), object(), words=words)
    for _ in range(42):
        settled = listening.push(FRAME_MS, True)
        if settled is not None:
            return settled[0].kind, settled[0].held, len(asked)
    for _ in range(CONFIG.words_final_ms // FRAME_MS):
        assert listening.push(FRAME_MS, False) is None
    settled = listening.heard(Transcript(text, final=True))
    assert settled is not None
    return settled[0].kind, settled[0].held, len(asked)


def test_held_for_its_words_a_doubled_backchannel_resumes_and_words_that_take_the_floor_cut():
    # read at spans of 600, 800 and 1000 ms (the sound ended at 900: its words are awaited)
    assert _listen(True, True, "Mm-hmm, mm-hmm.") == (OverlapKind.BACKCHANNEL, True, 3)
    assert _listen(True, True, "Hold on a second.") == (OverlapKind.INTERRUPTION, True, 3)
    assert _listen(True, False, "Mm-hmm, mm-hmm.") == (OverlapKind.INTERRUPTION, False, 1)  # not held: cut
    # no words coming: nothing to wait for, the reading is not asked and the voiced time decides
    assert _listen(False, True, "Mm-hmm, mm-hmm.") == (OverlapKind.INTERRUPTION, False, 0)


def _frames(signal: np.ndarray, voiced: np.ndarray) -> list[tuple[np.ndarray, bool]]:
    pcm = np.clip(signal, -32768, 32767).astype(np.int16)
    return [(pcm[i * 320:(i + 1) * 320], bool(voiced[i])) for i in range(len(pcm) // 320)]


def _features(signal: np.ndarray, voiced: np.ndarray) -> dict[str, float]:
    return dict(zip(SOUND_FEATURES, sound_features(SoundTrace.of(_frames(signal, voiced))).tolist()))


def test_the_features_tell_a_gliding_voice_from_a_held_chord_and_a_keyboard():
    t = np.arange(RATE) / RATE
    rng = np.random.default_rng(7)
    pitch = 110 + 80 * t  # a voice's pitch moves
    voice = 6000 * np.sin(2 * np.pi * np.cumsum(pitch) / RATE) * (1 + 0.5 * np.sin(2 * np.pi * 4 * t))
    chord = 4000 * (np.sin(2 * np.pi * 220 * t) + np.sin(2 * np.pi * 330 * t))  # music holds its pitch
    keys = np.zeros(RATE)
    for at in range(0, RATE - 800, 1600):  # a key every 100 ms: a short click of noise
        keys[at:at + 480] = 8000 * rng.normal(0, 1, 480) * np.exp(-np.arange(480) / 80)
    every = np.ones(50, bool)
    voice_f, chord_f = _features(voice, every), _features(chord, every)
    keys_f = _features(keys, np.array([i % 5 < 2 for i in range(50)]))
    assert voice_f["pitched_share"] > 0.9 and chord_f["pitched_share"] > 0.9
    assert chord_f["pitch_spread"] < 0.02 < voice_f["pitch_spread"]
    assert keys_f["flatness_mean"] > 3 * voice_f["flatness_mean"] and keys_f["pitched_share"] < 0.5
    assert keys_f["bursts_per_s"] >= 9 and voice_f["bursts_per_s"] <= 1
    assert _features(np.zeros(RATE), np.zeros(50, bool)) == dict.fromkeys(SOUND_FEATURES, 0.0)


def _vowels(formants: list[tuple[float, float]], seconds_each: float) -> np.ndarray:
    """A voice at 120 Hz through two resonances per stretch: a vowel each (one stretch: a hum)."""
    n = int(RATE * seconds_each)
    t = np.arange(n) / RATE
    pieces = []
    for first, second in formants:
        harmonics = np.arange(1, 30) * 120.0
        gain = 1 / (1 + ((harmonics - first) / 80) ** 2) + 0.5 / (1 + ((harmonics - second) / 120) ** 2)
        pieces.append(sum(g * np.sin(2 * np.pi * h * t) for h, g in zip(harmonics, gain)))
    signal = np.concatenate(pieces)
    return 8000 * signal / np.abs(signal).max()


def test_the_spectral_shape_moves_with_articulation_and_holds_still_in_a_hum():
    speech = _vowels([(300, 2300), (700, 1200), (500, 1800), (350, 900), (650, 1100)] * 2, 0.1)  # vowels
    hum = _vowels([(250, 2200)], 1.0)  # "mmm": one shape throughout
    every = np.ones(50, bool)
    speech_f, hum_f = _features(speech, every), _features(hum, every)
    assert speech_f["shape_flux"] > 2 * hum_f["shape_flux"]
    assert speech_f["shape_spread"] > 2 * hum_f["shape_spread"]


def test_a_model_file_without_the_sound_reading_loads_and_holds_nothing(tmp_path: Path):
    if not MODEL_PATH.is_file():
        pytest.skip("duplex/session/turn_model.json is not there")
    data = json.loads(MODEL_PATH.read_text())
    assert "sound" in data and tuple(data["sound"]["features"]) == SOUND_FEATURES  # the shipped one has it
    older = {k: v for k, v in data.items() if k not in ("sound", "hold_at")}
    (tmp_path / "older.json").write_text(json.dumps(older))
    models = TurnModels.load(tmp_path / "older.json")
    trace = SoundTrace.of([(np.full(320, 3000, np.int16), True)] * 40)
    assert models.sound is None and not models.sound_holds(trace)
    data["sound"]["features"] = data["sound"]["features"][:-1]
    (tmp_path / "other.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="retrain"):
        TurnModels.load(tmp_path / "other.json")


async def test_a_session_asks_the_sound_reading_with_the_overlaps_frames_only_when_learned(monkeypatch):
    """The reading is given the overlap's frames from its onset's prefix on, at interrupt_ms
    voiced; holding, the reply stays paused past interrupt_ms and the final words resume it."""
    from duplex.session import listen
    from duplex.session.realtime import events as ev
    from tests.session_fakes import Call, words
    from tests.test_session_call import answering
    from tests.test_session_overlap_words import REPLY, probes

    asked: list[int] = []

    def stub(trace: SoundTrace) -> bool:
        assert len(trace.levels) == len(trace.voiced) == len(trace.shapes)
        asked.append(sum(trace.voiced) * FRAME_MS)
        return True

    monkeypatch.setattr(listen, "read_sound", stub)
    for sound in ("voiced", "learned"):
        call = Call(SessionConfig(overlap_probe_request=True, barge_in=BargeInConfig(sound=sound)))
        await answering(call, *REPLY, complete=False)
        first = call.runtime.last
        await call.say(words("mm hmm mm hmm"))  # 920 ms: well over interrupt_ms voiced
        await call.quiet(CONFIG.words_final_ms + 2 * FRAME_MS)
        if sound == "voiced":
            assert first.aborted and not asked
            continue
        assert not first.aborted and asked and asked[0] >= CONFIG.interrupt_ms
        probe = probes(call)[0]
        probe.transcript("Mm-hmm, mm-hmm.", final=True)
        probe.complete()
        await call.settle()
        (judged,) = call.of_type(ev.OverlapJudged)
        assert judged.kind == "backchannel" and call.of_type(ev.ResponseResumed) and not first.aborted


def test_a_growing_sound_is_traced_as_a_whole_reading_would_each_frame_read_once(monkeypatch):
    """A session reads an overlap's sound again as it grows (``TraceBuilder``): the trace is the
    one a reading of all its frames gives, bit for bit, though each frame is read once; frames
    that part from those read (the next overlap) are read from where they part."""
    from duplex.session import overlap_sound

    rng = np.random.default_rng(7)
    t = np.arange(16_000 * 2) / 16_000
    vowel = 6000 * np.sin(2 * np.pi * (140 + 30 * t) * t) + rng.normal(0, 300, len(t))
    frames = _frames(vowel, np.arange(len(t) // 320) % 7 != 0)
    reads: list[np.ndarray] = []
    read_frame = overlap_sound._read_frame

    def counted(previous: np.ndarray, frame: np.ndarray):
        reads.append(frame)
        return read_frame(previous, frame)

    def same(a: SoundTrace, b: SoundTrace) -> bool:
        return a.voiced == b.voiced and all(np.array_equal(getattr(a, name), getattr(b, name))
                                            for name in ("levels", "periodic", "pitch", "flat", "centroid", "shapes"))

    whole = [SoundTrace.of(frames[:n]) for n in (30, 60, len(frames))]
    monkeypatch.setattr(overlap_sound, "_read_frame", counted)
    builder = overlap_sound.TraceBuilder()
    assert [same(builder.trace(frames[:n]), trace) for n, trace in zip((30, 60, len(frames)), whole)] == [True] * 3
    assert len(reads) == len(frames)
    later = [(frame.copy(), voiced) for frame, voiced in frames[40:70]]  # the next overlap: other frames
    reads.clear()
    assert same(builder.trace(later), SoundTrace.of(later)) and len(reads) == 2 * len(later)  # its own reading too
