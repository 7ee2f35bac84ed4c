"""The fused baseline: the same four models and runners in one process and one loop, one request
at a time. Its loop steps whatever is closest to audio first (code2wav, then the talker, then the
thinker), so its time to first audio at concurrency 1 is the critical path's pure compute.

It builds its parts from the same stage args as the staged pipeline (``parts.load``: checkpoint or
real shapes with random weights), on one device, and its talker gets the same CUDA graphs there
(bucket 1: one request at a time), the thinker's decode too, so the comparison stays fair."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from duplex.models.qwen3_omni.code2wav import StreamingCode2Wav
from duplex.models.qwen3_omni.encoder import StreamingAudioEncoder
from duplex.models.qwen3_omni.loading import special_tokens
from duplex.models.qwen3_omni.parts import load
from duplex.models.qwen3_omni.payloads import AudioEmbeds, CodecChunk
from duplex.models.qwen3_omni.talker import TalkerRunner
from duplex.models.qwen3_omni.thinker import ThinkerRunner
from duplex.runtime.contract import TurnRequest, WorkItem


@dataclass
class FusedTurn:
    first_audio_s: float  # from the call to the first audio chunk
    total_s: float
    tokens: list[int] = field(default_factory=list)
    audio_samples: int = 0
    started: float = 0.0  # time.monotonic() at the call
    # Each computation's span, in the step-trace format (``duplex.runtime.steptrace``), so the
    # bench reads the critical path's compute the same way for the fused loop and the stages.
    spans: list[dict] = field(default_factory=list)
    audio: list = field(default_factory=list)  # the VocodedAudio chunks, when run_turn was asked to keep them

    @property
    def codes(self) -> np.ndarray:
        return np.concatenate([a.codes for a in self.audio], axis=1)

    @property
    def waveform(self) -> np.ndarray:
        return np.concatenate([a.samples for a in self.audio])


class FusedOmni:
    def __init__(self, parts: dict | str, *, system_ids: list[int], first_chunk_frames: int = 2,
                 chunk_frames: int = 6, device: str = "cpu", thinker_max_len: int = 1024, talker_max_len: int = 2048,
                 ignore_eos: bool = False, graphs: list[int] | bool | None = None) -> None:
        args = {"model_dir": parts} if isinstance(parts, str) else parts
        tower, _ = load("encoder", args, device)
        lm, config = load("thinker", args, device)
        talker, _ = load("talker", args, device)
        self.device = device
        self.encoder = StreamingAudioEncoder(tower, device)
        self.thinker = ThinkerRunner(lm, config, special_tokens(config), memory_bytes=None, max_len=thinker_max_len,
                                     max_slots=1, system_ids=system_ids, device=device, ignore_eos=ignore_eos,
                                     graphs=graphs)
        self.talker = TalkerRunner(talker, config, memory_bytes=None, max_len=talker_max_len, max_slots=1,
                                   first_chunk_frames=first_chunk_frames, chunk_frames=chunk_frames, device=device,
                                   graphs=graphs, ignore_eos=ignore_eos)
        self.vocoder = StreamingCode2Wav(load("code2wav", args, device)[0], device=device)

    def _step(self, runner, stage: str, turn: FusedTurn, slot: int = 0):
        plan = runner.plan([slot])
        t0 = time.monotonic()
        raw = runner.compute(plan)
        turn.spans.append({"stage": stage, "rids": ["fused"], "t0": t0, "t1": time.monotonic()})
        return runner.resolve(plan, raw).get(slot)

    @torch.no_grad()
    def run_turn(self, audio: np.ndarray, params: TurnRequest, keep_audio: bool = False) -> FusedTurn:
        start = time.perf_counter()
        turn = FusedTurn(float("nan"), float("nan"), started=time.monotonic())
        self.thinker.open(0, "fused", params)
        self.talker.open(0, "fused", params)
        vocoder_state: dict = {}
        try:
            t0 = time.monotonic()
            embeds = self.encoder.encode_whole(audio)
            turn.spans.append({"stage": "encoder", "rids": ["fused"], "t0": t0, "t1": time.monotonic()})
            self.thinker.feed(0, "encoder", AudioEmbeds(embeds), True)
            thinker_done = talker_done = False
            while not talker_done:
                if self.talker.ready(0):
                    out = self._step(self.talker, "talker", turn)
                    talker_done = out.done
                    for chunk in out.emits + ([out.final] if out.done and out.final is not None else []):
                        self._vocode(chunk, vocoder_state, turn, start, keep_audio)
                elif not thinker_done:
                    out = self._step(self.thinker, "thinker", turn)
                    for data in out.emits + ([out.final] if out.done else []):
                        turn.tokens += data.token.token_ids
                        self.talker.feed(0, "thinker", data, False)
                    if out.done:
                        thinker_done = True
                        self.talker.feed(0, "thinker", None, True)
                else:
                    raise RuntimeError("fused loop stalled: the talker waits on a finished thinker")
        finally:
            self.thinker.close(0)
            self.talker.close(0)
        turn.total_s = time.perf_counter() - start
        return turn

    def _vocode(self, chunk: CodecChunk, state: dict, turn: FusedTurn, start: float, keep: bool) -> None:
        t0 = time.monotonic()
        (produced,) = self.vocoder([WorkItem("fused", "talker", chunk, False)], [state])
        turn.spans.append({"stage": "code2wav", "rids": ["fused"], "t0": t0, "t1": time.monotonic()})
        for piece in produced:
            if turn.audio_samples == 0:
                turn.first_audio_s = time.perf_counter() - start
            turn.audio_samples += len(piece.samples)
            if keep:
                turn.audio.append(piece)
