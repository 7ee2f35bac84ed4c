"""The Smart Turn v3.2 ONNX model, run on a worker thread so the event loop never waits on it.

The weights ship inside duplex (``data/``: the file of the ``pipecat-ai`` wheel, BSD-2, its licence
beside it), so every install has them; none of pipecat's code is used. Input: Whisper log-mel
features (80 x 800) of the last 8 s of 16 kHz audio, zeros before a shorter clip; output: the
probability that the speaker's turn is complete.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

RATE = 16_000
WINDOW_S = 8
_FILE = "smart-turn-v3.2-cpu.onnx"


class SmartTurnUnavailable(RuntimeError):
    """The model file or onnxruntime is not installed."""


def smart_turn_path() -> Path:
    path = Path(__file__).with_name("data") / _FILE  # package data, beside this module
    if not path.is_file():
        raise SmartTurnUnavailable(f"this duplex was installed without its package data: no {path}")
    return path


class SmartTurn:
    """One model per server; calls from every session queue on its single worker thread (a call
    takes ~0.1 s of one core), so a burst of turns cannot take more than one core."""

    def __init__(self, path: Path | None = None) -> None:
        try:
            import onnxruntime
        except ImportError as exc:
            raise SmartTurnUnavailable("semantic end of turn needs onnxruntime (scripts/setup.sh --local)") from exc
        from transformers import WhisperFeatureExtractor

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = 1
        self._session = onnxruntime.InferenceSession(str(path or smart_turn_path()), options,
                                                     providers=["CPUExecutionProvider"])
        self._input = self._session.get_inputs()[0].name
        self._features = WhisperFeatureExtractor(chunk_length=WINDOW_S)
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="smart-turn")

    def predict(self, audio: np.ndarray) -> float:
        """P(turn complete) for float32 16 kHz mono ``audio`` (its last 8 s count); blocks."""
        window = np.asarray(audio, np.float32)[-WINDOW_S * RATE:]
        window = np.pad(window, (WINDOW_S * RATE - window.size, 0))
        features = self._features(window, sampling_rate=RATE, return_tensors="np", padding="max_length",
                                  max_length=WINDOW_S * RATE, truncation=True, do_normalize=True)
        batch = features.input_features.astype(np.float32)
        (probability,) = self._session.run(None, {self._input: batch})
        return float(np.asarray(probability).reshape(-1)[0])

    async def complete_probability(self, audio: np.ndarray) -> float:
        return await asyncio.get_running_loop().run_in_executor(self._worker, self.predict, audio)

    def close(self) -> None:
        self._worker.shutdown(wait=False, cancel_futures=True)
