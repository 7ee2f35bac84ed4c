"""Streaming text-to-speech with Piper: speak each phrase as soon as the thinker finishes it.

The thinker streams text deltas; waiting for the whole reply would add its full decode time to
the time to first audio. ``PhraseSplitter`` (``runtime/phrases.py``, shared with every TTS stage)
cuts the stream at sentence ends (and at clause breaks once a phrase is long enough to sound
natural) and Piper synthesizes each phrase.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from duplex.runtime.contract import PhraseSplitter  # noqa: F401 (the cuts: shared with every TTS stage)

# Replies often open with one of these words as their first phrase (the persona's examples teach
# "Sure, ..."; the first phrase ends at a comma after one word): voiced once when the stage starts,
# such a reply's first audio costs no synthesis (~0.15 s of a core on a 2-core laptop).
OPENERS = ("Sure,", "Yes,", "Okay,", "No,", "Sorry,", "Great,", "Hi,", "Hello,", "Of course,")


class PiperSynth:
    """A Piper voice on onnxruntime with an explicit thread count."""

    def __init__(self, model_path: Path, config_path: Path, threads: int = 1, volume: float = 0.8,
                 length_scale: float | None = None, noise_scale: float | None = None,
                 noise_w_scale: float | None = None, ready: tuple[str, ...] = ()) -> None:
        """``noise_scale=0, noise_w_scale=0`` make the voice deterministic (flatter, too);
        ``ready``: phrases voiced now, whose audio ``synthesize`` then gives at once."""
        import onnxruntime
        from piper import PiperVoice, SynthesisConfig
        from piper.config import PiperConfig

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        session = onnxruntime.InferenceSession(str(model_path), sess_options=options,
                                               providers=["CPUExecutionProvider"])
        config = PiperConfig.from_dict(json.loads(Path(config_path).read_text(encoding="utf-8")))
        self.voice = PiperVoice(config=config, session=session)
        self.sample_rate = config.sample_rate
        self.syn_config = SynthesisConfig(volume=volume, length_scale=length_scale, noise_scale=noise_scale,
                                          noise_w_scale=noise_w_scale)
        self._ready = {phrase: self._voice(phrase) for phrase in ready}

    def synthesize(self, text: str) -> np.ndarray:
        """Float32 mono audio at ``sample_rate`` for ``text`` (all its sentences, joined)."""
        ready = self._ready.get(text)
        return ready.copy() if ready is not None else self._voice(text)

    def _voice(self, text: str) -> np.ndarray:
        chunks = [chunk.audio_float_array for chunk in self.voice.synthesize(text, self.syn_config)]
        if not chunks:
            return np.zeros(0, dtype=np.float32)
        return np.concatenate(chunks).astype(np.float32, copy=False)
