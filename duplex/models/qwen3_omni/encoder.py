"""Chunked streaming audio encoder: the thinker's audio tower run while the user speaks.

The tower splits the log-mel into 1 s chunks (``2 * n_window`` frames) that go through the conv
stem independently, then runs its transformer layers inside fixed windows of
``n_window_infer // (2 * n_window)`` chunks. Both boundaries are exact cut points, so the stem runs
on each chunk as soon as it is complete and the transformer on each window as soon as its chunks
are: at the end of speech only the last window remains.

Whisper's floor (utterance maximum - 8) is known only at the end. Chunks still held are
recomputed if the floor moved past their values, so the output equals a one-shot encode of the
utterance whenever no window was shipped before a louder part arrived; ``floor_moved`` counts
the windows shipped with an older floor (documented difference, nonzero only then).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from duplex.models.qwen3_omni.mel import StreamingLogMel, mel_filters, normalize
from duplex.models.qwen3_omni.payloads import AudioEmbeds
from duplex.runtime.contract import CallerAudio


@dataclass
class _Chunk:
    mel_start: int
    mel_len: int
    floor: float
    tokens: torch.Tensor | None = None  # stem output (n, d_model), with positions added


@dataclass
class EncoderState:
    mel: StreamingLogMel
    chunks: list[_Chunk] = field(default_factory=list)
    shipped_windows: int = 0
    floor_moved: int = 0


def _stemmed(chunk: _Chunk) -> torch.Tensor:
    assert chunk.tokens is not None  # encode_ready runs the stems of every chunk before its windows
    return chunk.tokens


def _stem_length(frames: int) -> int:
    for _ in range(3):
        frames = (frames - 1) // 2 + 1
    return frames


class StreamingAudioEncoder:
    """Batch computation for the ``simple`` scheduler: ``CallerAudio`` in, ``AudioEmbeds`` out."""

    def __init__(self, tower, device: str = "cpu") -> None:
        self.tower = tower
        self.device = device
        config = tower.config
        self.chunk_frames = 2 * config.n_window
        self.chunks_per_window = max(1, config.n_window_infer // self.chunk_frames)
        self.filters = mel_filters(config.num_mel_bins)

    def new_state(self) -> EncoderState:
        return EncoderState(StreamingLogMel(self.filters))

    # -- the simple scheduler's contract ---------------------------------------------------------
    def batch_key(self, item) -> Any:
        return None

    @torch.no_grad()
    def __call__(self, items: list, states: list[dict]) -> list[list[Any]]:
        encoder_states = [s.setdefault("encoder", self.new_state()) for s in states]
        for item, state in zip(items, encoder_states):
            if not isinstance(item.data, CallerAudio) and (item.data is not None or not item.eos):
                raise ValueError(f"encoder input needs CallerAudio, got {type(item.data).__name__}")
            audio = item.data.samples if item.data is not None else None
            self._push(state, np.zeros(0, np.float32) if audio is None else audio, item.eos)
        windows = self.encode_ready(encoder_states, [item.eos for item in items])
        return [[AudioEmbeds(w, floor_moved=s.floor_moved)] if w is not None else []
                for w, s in zip(windows, encoder_states)]

    # -- streaming steps -------------------------------------------------------------------------
    def _push(self, state: EncoderState, audio: np.ndarray, final: bool) -> None:
        state.mel.push(audio, final=final)
        total = state.mel.num_frames
        while True:
            start = sum(c.mel_len for c in state.chunks)
            remaining = total - start
            if remaining >= self.chunk_frames or (final and remaining > 0):
                state.chunks.append(_Chunk(start, min(remaining, self.chunk_frames), state.mel.floor()))
            else:
                return

    def encode_ready(self, states: list[EncoderState], finals: list[bool]) -> list[torch.Tensor | None]:
        """Run the stems and windows that are ready, batched across requests; one tensor per state
        (the newly completed windows' embeddings) or None."""
        for state, final in zip(states, finals):
            if final:
                self._refresh_floor(state)
        self._run_stems(states)
        ready: list[list[_Chunk]] = []
        for state, final in zip(states, finals):
            ready.append(self._take_windows(state, final))
        flat = [chunks for per_state in ready for chunks in self._split_windows(per_state)]
        outputs = self._run_windows(flat) if flat else []
        results: list[torch.Tensor | None] = []
        for per_state in ready:
            count = len(self._split_windows(per_state))
            mine, outputs = outputs[:count], outputs[count:]
            results.append(torch.cat(mine, dim=0) if mine else None)
        return results

    def _refresh_floor(self, state: EncoderState) -> None:
        floor = state.mel.floor()
        held = state.shipped_windows * self.chunks_per_window
        for window in self._split_windows(state.chunks[:held]):
            state.floor_moved += any(self._floor_changes(state, c, floor) for c in window)
        for chunk in state.chunks[held:]:
            if chunk.tokens is not None and self._floor_changes(state, chunk, floor):
                chunk.tokens = None
            chunk.floor = floor

    @staticmethod
    def _floor_changes(state: EncoderState, chunk: _Chunk, floor: float) -> bool:
        if chunk.floor == floor:
            return False
        return float(state.mel.frames(chunk.mel_start, chunk.mel_start + chunk.mel_len).min()) < floor

    def _run_stems(self, states: list[EncoderState]) -> None:
        todo = [(s, c) for s in states for c in s.chunks if c.tokens is None]
        if not todo:
            return
        # Like the tower, pad a short last chunk to a full chunk when the utterance has a full one.
        groups: dict[int, list[tuple[EncoderState, _Chunk]]] = {}
        for state, chunk in todo:
            has_full = state.chunks[0].mel_len == self.chunk_frames
            groups.setdefault(self.chunk_frames if has_full else chunk.mel_len, []).append((state, chunk))
        for width, members in groups.items():
            mels = []
            for state, chunk in members:
                mel = normalize(state.mel.frames(chunk.mel_start, chunk.mel_start + chunk.mel_len), chunk.floor)
                mels.append(F.pad(mel, (0, width - chunk.mel_len)))
            stems = self._stem(torch.stack(mels).to(self.device))
            for (_, chunk), stem in zip(members, stems):
                chunk.tokens = stem[: _stem_length(chunk.mel_len)]

    def _stem(self, mels: torch.Tensor) -> torch.Tensor:
        tower = self.tower
        x = mels.unsqueeze(1).to(tower.conv2d1.weight.dtype)
        x = F.gelu(tower.conv2d3(F.gelu(tower.conv2d2(F.gelu(tower.conv2d1(x))))))
        b, c, f, t = x.shape
        x = tower.conv_out(x.permute(0, 3, 1, 2).contiguous().view(b, t, c * f))
        return x + tower.positional_embedding.positional_embedding[:t].unsqueeze(0).to(x.dtype)

    def _take_windows(self, state: EncoderState, final: bool) -> list[_Chunk]:
        first = state.shipped_windows * self.chunks_per_window
        pending = state.chunks[first:]
        full = len(pending) // self.chunks_per_window
        if final or full:
            take = pending if final else pending[: full * self.chunks_per_window]
            windows = (len(take) + self.chunks_per_window - 1) // self.chunks_per_window
            state.shipped_windows += windows
            return take
        return []

    def _split_windows(self, chunks: list[_Chunk]) -> list[list[_Chunk]]:
        n = self.chunks_per_window
        return [chunks[i : i + n] for i in range(0, len(chunks), n)]

    def _run_windows(self, windows: list[list[_Chunk]]) -> list[torch.Tensor]:
        tower = self.tower
        pieces = [torch.cat([_stemmed(c) for c in w], dim=0) for w in windows]
        lengths = [p.shape[0] for p in pieces]
        hidden = torch.cat(pieces, dim=0)
        cu_seqlens = torch.tensor([0, *np.cumsum(lengths)], dtype=torch.int32, device=hidden.device)
        for layer in tower.layers:
            hidden = layer(hidden, cu_seqlens, max_seqlen=max(lengths))[0]
        hidden = tower.proj2(tower.act(tower.proj1(tower.ln_post(hidden))))
        return list(hidden.split(lengths, dim=0))

    def encode_whole(self, audio: np.ndarray) -> torch.Tensor | None:
        """One-shot encode through the same code (for the fused baseline and tests); None for
        no audio."""
        state = self.new_state()
        self._push(state, audio, True)
        return self.encode_ready([state], [True])[0]
