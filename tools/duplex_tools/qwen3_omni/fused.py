"""The fused baseline: the same four models and runners in one process and one loop, one request
at a time. Its loop steps whatever is closest to audio first (code2wav, then the talker, then the
thinker), so its time to first audio at concurrency 1 is the critical path's pure compute."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from duplex.models.qwen3_omni.code2wav import StreamingCode2Wav
from duplex.models.qwen3_omni.encoder import StreamingAudioEncoder
from duplex.models.qwen3_omni.loading import (
    load_audio_encoder,
    load_code2wav,
    load_talker,
    load_thinker,
    special_tokens,
)
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


class FusedOmni:
    def __init__(self, model_dir: str, *, system_ids: list[int], first_chunk_frames: int = 2,
                 chunk_frames: int = 6) -> None:
        tower, _ = load_audio_encoder(model_dir)
        lm, config = load_thinker(model_dir)
        talker, _ = load_talker(model_dir)
        self.encoder = StreamingAudioEncoder(tower)
        self.thinker = ThinkerRunner(lm, config, special_tokens(config), memory_bytes=None, max_len=1024, max_slots=1,
                                     system_ids=system_ids)
        self.talker = TalkerRunner(talker, config, memory_bytes=None, max_len=2048, max_slots=1,
                                   first_chunk_frames=first_chunk_frames, chunk_frames=chunk_frames)
        self.vocoder = StreamingCode2Wav(load_code2wav(model_dir)[0])

    def _step(self, runner, stage: str, turn: FusedTurn, slot: int = 0):
        plan = runner.plan([slot])
        t0 = time.monotonic()
        raw = runner.compute(plan)
        turn.spans.append({"stage": stage, "rids": ["fused"], "t0": t0, "t1": time.monotonic()})
        return runner.resolve(plan, raw).get(slot)

    @torch.no_grad()
    def run_turn(self, audio: np.ndarray, params: TurnRequest) -> FusedTurn:
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
                        self._vocode(chunk, vocoder_state, turn, start)
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

    def _vocode(self, chunk: CodecChunk, state: dict, turn: FusedTurn, start: float) -> None:
        t0 = time.monotonic()
        (produced,) = self.vocoder([WorkItem("fused", "talker", chunk, False)], [state])
        turn.spans.append({"stage": "code2wav", "rids": ["fused"], "t0": t0, "t1": time.monotonic()})
        for piece in produced:
            if turn.audio_samples == 0:
                turn.first_audio_s = time.perf_counter() - start
            turn.audio_samples += len(piece.samples)
