"""The learned turn-taking decisions' hooks in the session's judges: ``Listening`` reads an
overlap's words through ``hearing`` (``barge_in.judge: learned``), falling back to the word
lists where it says nothing; the end-of-turn judge reads a pause by the shipped model with
``semantic.judge: learned`` and by the threshold and word lists with ``rules``."""

from __future__ import annotations

import numpy as np
import pytest

from duplex.config.session import BargeInConfig, SemanticTurnConfig
from duplex.runtime.contract import Transcript
from duplex.session.endpoint import EndOfTurnJudge, TurnJudgement
from duplex.session.overlap import Listening, OverlapJudge, OverlapKind
from duplex.session.overlap_words import Said
from duplex.session.turn_model import SoundTrace, periodicity, read_pause, shipped_models

FRAME_MS = 20
CONFIG = BargeInConfig()


def _overlap(listening: Listening[object], voiced_frames: int, words: str) -> OverlapKind:
    """A sound of ``voiced_frames`` voiced frames (under ``interrupt_ms``), then silence until the
    words are final; the words arrive then; the verdict's kind."""
    judge = OverlapJudge(CONFIG, onset_ms=0, now_ms=60, voiced_ms=60, word_ms=80)
    listening.begin(judge, object(), words=True)
    for _ in range(voiced_frames):
        assert listening.push(FRAME_MS, True) is None
    for _ in range(CONFIG.words_final_ms // FRAME_MS):
        assert listening.push(FRAME_MS, False) is None
    settled = listening.heard(Transcript(words, final=True))
    assert settled is not None
    return settled[0].kind


def test_the_hearing_reads_the_words_where_it_says_something_and_the_word_lists_elsewhere():
    # two words that are no backchannel take the floor by the word lists ...
    assert _overlap(Listening(), 15, "I am") is OverlapKind.INTERRUPTION
    # ... and are a backchannel where the learned hearing says so (it is given the words and voiced ms)
    heard: list[tuple[str, int]] = []

    def hearing(text: str, voiced_ms: int) -> Said | None:
        heard.append((text, voiced_ms))
        return Said.BACKCHANNEL

    assert _overlap(Listening(hearing), 15, "I am") is OverlapKind.BACKCHANNEL
    assert heard and heard[-1] == ("I am", 60 + 15 * FRAME_MS)
    assert _overlap(Listening(lambda text, ms: None), 15, "I am") is OverlapKind.INTERRUPTION  # None: the lists


def test_periodicity_tells_a_vowel_from_a_knock():
    t = np.arange(640) / 16000
    vowel = (8000 * np.sin(2 * np.pi * 140 * t) + 3000 * np.sin(2 * np.pi * 280 * t)).astype(np.int16)
    knock = (8000 * np.random.default_rng(1).normal(0, 1, 640) * np.exp(-t / 0.004)).astype(np.int16)
    assert periodicity(vowel) > 0.9 > 0.5 > periodicity(knock)
    trace = SoundTrace.of([(vowel[:320], True), (vowel[320:], True), (np.zeros(320, np.int16), False)])
    assert trace.voiced == [True, True, False] and trace.periodic[1] > 0.9 and trace.levels[2] == -120.0


def _judge(config: SemanticTurnConfig, probability: float, words: str) -> TurnJudgement:
    verdicts: list[TurnJudgement] = []

    class Model:
        def prepare(self) -> None:
            return None

        async def complete_probability(self, audio: np.ndarray) -> float:
            return probability

    def run_now(coroutine) -> None:  # the model answers at once: its coroutine ends on the first step
        with pytest.raises(StopIteration):
            coroutine.send(None)

    judge = EndOfTurnJudge(config, Model(), run_now, verdicts.append)
    judge.heard(words, final=True)
    judge.judge(1000, np.zeros(1600, np.float32))
    (verdict,) = verdicts
    return verdict


@pytest.mark.skipif(shipped_models() is None, reason="duplex/session/turn_model.json is not there")
@pytest.mark.parametrize(("probability", "words"), [(0.95, "I want a medium taro tea and"),
                                                    (0.2, "Could you tell me the price of the mango tea?"),
                                                    (0.9, "I would like a large milk tea."),
                                                    (0.05, "Yes, that is right.")])
def test_a_pause_is_read_by_the_shipped_model_when_learned_and_by_the_rules_otherwise(probability, words):
    learned = _judge(SemanticTurnConfig(judge="learned", unclosed_at=0.9), probability, words)
    assert learned.complete == read_pause(probability, words)
    rules = _judge(SemanticTurnConfig(judge="rules", unclosed_at=0.9), probability, words)
    hangs = words.endswith(" and")
    asked = words.endswith("?")
    assert rules.complete == ((probability >= 0.5 or asked) and not hangs)


async def test_a_session_with_the_learned_judge_reads_the_overlaps_words_with_its_frames(monkeypatch):
    from duplex.config.session import SessionConfig
    from duplex.session import listen
    from duplex.session.realtime import events as ev
    from tests.session_fakes import Call, words
    from tests.test_session_call import answering
    from tests.test_session_overlap_words import REPLY, probes

    read: list[tuple[int, str, int]] = []

    def stub(trace: SoundTrace, text: str, voiced_ms: int) -> Said:
        assert len(trace.levels) == len(trace.voiced) == len(trace.shapes)
        read.append((len(trace.voiced), text, voiced_ms))
        return Said.BACKCHANNEL

    monkeypatch.setattr(listen, "read_overlap", stub)
    for judge in ("rules", "learned"):
        call = Call(SessionConfig(overlap_probe_request=True, barge_in=BargeInConfig(judge=judge)))
        await answering(call, *REPLY, complete=False)
        await call.say(words("sorry"))  # a floor word: the rules interrupt
        await call.quiet(CONFIG.resume_ms + 4 * FRAME_MS)
        probe = probes(call)[0]
        probe.transcript("Sorry,", final=True)
        probe.complete()
        await call.settle()
        (judged,) = call.of_type(ev.OverlapJudged)
        if judge == "rules":
            assert judged.kind == "interruption" and not read
        else:  # the model's reading (here: a backchannel) decides, from the overlap's frames so far
            assert judged.kind == "backchannel" and call.of_type(ev.ResponseResumed)
            frames, text, voiced_ms = read[-1]
            assert text == "Sorry," and voiced_ms > 0 and frames * FRAME_MS > voiced_ms
