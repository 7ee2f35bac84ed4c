"""Streaming code2wav for the ``simple`` scheduler, batched by decode length.

code2wav is causal: a call on frames [a, b) yields samples [1920 a, 1920 b - 555) exactly as the
full decode would, provided enough frames of left context precede ``a`` for its sliding-window
attention and its convolutions (``left_context_frames``). Each call drops the last 555 samples
(the causal transposed convolutions' tail). So a chunk [s, e) is decoded with up to
``left_context_frames`` frames before it, and the samples [1920 s - 555, 1920 e - 555) are kept:
the 555 held back by the previous call are recomputed here. Concatenated chunks equal the full
decode.

Inputs are the talker's ``CodecChunk``s (``codes`` (16, n) int, ``start`` its first frame). A chunk's decode
length (context + n) follows from its start alone, so ``batch_key`` can group requests whose
calls have the same length into one batched forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from duplex.models.qwen3_omni.payloads import CodecChunk, VocodedAudio

SAMPLE_RATE = 24000


@dataclass
class _Stream:
    """A request's place in its stream: the frames kept as the next chunk's left context, and the
    frame that chunk must start at."""

    history: torch.Tensor | None = None  # (groups, <= context) codes; None before the first chunk
    next_frame: int = 0


def _stream(state: dict) -> _Stream:
    """The request's ``_Stream``, kept in the scheduler's per-request dict."""
    return state.setdefault("stream", _Stream())


_Job = tuple[int, torch.Tensor, int, CodecChunk]  # (row, codes with their left context, context, chunk)


def left_context_for(config) -> int:
    """Frames of context that make a chunk's output exact: each attention layer sees
    ``sliding_window`` frames back, plus a few frames for the causal convolutions."""
    return int(config.num_hidden_layers * config.sliding_window + 4)


class StreamingCode2Wav:
    def __init__(self, code2wav, *, left_context_frames: int | None = None, device: str = "cpu") -> None:
        self.code2wav, self.device = code2wav, device
        config = code2wav.config
        self.num_groups = config.num_quantizers
        self.upsample = int(code2wav.total_upsample)
        self.context = left_context_for(config) if left_context_frames is None else left_context_frames
        self.holdback = self._measure_holdback()

    @torch.no_grad()
    def _measure_holdback(self) -> int:
        """Samples each call drops at its end (555 for the real code2wav), measured once."""
        codes = torch.zeros(1, self.num_groups, 2, dtype=torch.long, device=self.device)
        return 2 * self.upsample - int(self.code2wav(codes).shape[-1])

    # -- the simple scheduler's contract ---------------------------------------------------------
    def batch_key(self, item) -> Any:
        data = item.data
        if not isinstance(data, CodecChunk):
            return None
        return min(self.context, data.start) + int(np.shape(data.codes)[-1])

    @torch.no_grad()
    def __call__(self, items: list, states: list[dict]) -> list[list[Any]]:
        jobs: list[_Job] = []
        outputs: list[list[Any]] = [[] for _ in items]
        for index, (item, state) in enumerate(zip(items, states)):
            data = item.data
            if data is None:
                continue  # the talker's eos with nothing left to speak
            stream = _stream(state)
            codes = self._check(data, stream)
            context = min(self.context, data.start)
            if context == 0:
                window = codes
            else:
                assert stream.history is not None  # a chunk past frame 0 follows one (_check)
                window = torch.cat([stream.history[:, -context:], codes], dim=1)
            stream.history = window[:, -self.context:] if self.context else window[:, :0]
            stream.next_frame = data.start + codes.shape[1]
            jobs.append((index, window, context, data))
        for index, audio, data in self._decode(jobs):
            outputs[index] = [VocodedAudio(audio, SAMPLE_RATE, codes=np.asarray(data.codes), start=data.start)]
        return outputs

    def _check(self, data: Any, stream: _Stream) -> torch.Tensor:
        if not isinstance(data, CodecChunk):
            raise TypeError(f"code2wav input needs a CodecChunk, got {type(data).__name__}")
        codes = torch.as_tensor(np.asarray(data.codes), dtype=torch.long)
        if codes.ndim != 2 or codes.shape[0] != self.num_groups or codes.shape[1] == 0:
            raise ValueError(f"codes must be ({self.num_groups}, n>0), got {tuple(codes.shape)}")
        if int(codes.min()) < 0 or int(codes.max()) >= self.code2wav.config.codebook_size:
            raise ValueError("codes outside the codebook")
        if data.start != stream.next_frame:
            raise ValueError(f"chunk starts at frame {data.start}, expected {stream.next_frame}")
        return codes

    def _decode(self, jobs: list[_Job]) -> list[tuple[int, np.ndarray, CodecChunk]]:
        if not jobs:
            return []
        lengths = {window.shape[1] for _, window, _, _ in jobs}
        if len(lengths) != 1:  # batch_key keeps batches alike; a mixed batch decodes row by row
            return [result for job in jobs for result in self._decode([job])]
        wav = self.code2wav(torch.stack([window for _, window, _, _ in jobs]).to(self.device))
        results = []
        for row, (index, _, context, data) in enumerate(jobs):
            # Keep from the samples the previous call held back; the first chunk keeps all it has.
            begin = context * self.upsample - (self.holdback if context else 0)
            results.append((index, wav[row, 0, begin:].float().cpu().numpy(), data))
        return results

    def decode_full(self, codes: torch.Tensor) -> np.ndarray:
        """One call on every frame: the reference the streamed chunks must match."""
        with torch.no_grad():
            return self.code2wav(codes[None].to(self.device))[0, 0].float().cpu().numpy()
