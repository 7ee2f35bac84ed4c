"""Openers voiced ahead (``PiperSynth(ready=...)``, the tts stage's ``OPENERS``) on the real Piper
voice: a reply that opens with one gets its first audio without a synthesis, and the audio and the
text each chunk voices are exactly what they were without it (a deterministic voice here)."""

from __future__ import annotations

import numpy as np
import pytest

from duplex.config.pipeline import StageConfig
from duplex.models.local import assets
from duplex.models.local.stages import StreamingTTS, build_tts
from duplex.models.local.tts import OPENERS, PiperSynth
from duplex.runtime.contract import AgentAudio, AgentText, WorkItem
from tests.local_helpers import Ctx

pytestmark = pytest.mark.timeout(300)
REPLY = ["Sure", ",", " one", " mango", " tea", ".", " Sure", ",", " why", " not", "?"]


class CountingVoice:
    """The Piper voice, counting the texts it is asked to voice."""

    def __init__(self, voice) -> None:
        self._voice, self.voiced = voice, []

    def synthesize(self, text, config):
        self.voiced.append(text)
        return self._voice.synthesize(text, config)


def _deterministic(ready: tuple[str, ...] = ()) -> PiperSynth:
    return PiperSynth(*assets.piper_voice_paths(), noise_scale=0.0, noise_w_scale=0.0, ready=ready)


def _speak(tts: StreamingTTS) -> list[AgentAudio]:
    state: dict = {}
    out = []
    for delta in REPLY:
        out += tts([WorkItem("r", "thinker", AgentText(delta), eos=False)], [state])[0]
    return out + tts([WorkItem("r", "thinker", None, eos=True)], [state])[0]


def test_a_ready_opener_is_not_synthesized_again_and_the_reply_is_unchanged():
    plain, ready = _deterministic(), _deterministic(ready=("Sure,",))
    counting = CountingVoice(ready.voice)
    ready.voice = counting
    before, after = _speak(StreamingTTS(plain)), _speak(StreamingTTS(ready))
    assert [a.text for a in after] == [a.text for a in before] == ["Sure,", " one mango tea.", " Sure, why not?"]
    assert all(np.array_equal(a.samples, b.samples) for a, b in zip(after, before))
    assert counting.voiced == ["one mango tea.", "Sure, why not?"]  # the opening "Sure," was voiced ahead
    after[0].samples[:] = 0  # a consumer writing into its chunk does not change the next reply's opener
    assert np.array_equal(ready.synthesize("Sure,"), before[0].samples)


def test_the_tts_stage_voices_the_openers_when_it_starts():
    tts: StreamingTTS = build_tts(Ctx(StageConfig(name="tts", builder="local.tts"), None))
    counting = CountingVoice(tts.synth.voice)
    tts.synth.voice = counting
    for opener in OPENERS:
        assert tts.synth.synthesize(opener).size
    assert counting.voiced == []
