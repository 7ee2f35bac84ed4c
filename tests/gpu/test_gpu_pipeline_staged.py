"""The staged omni pipeline on a GPU equals the fused baseline on it: every stage process on
cuda:0 (tensors between them over the relay's CUDA medium, the talker's decode steps replayed
from CUDA graphs at batch 4), the fused loop on the same device (its own graphs, bucket 1), the
tiny checkpoint in float32. Same tokens and codes for four concurrent turns; waveforms within a
relative error of 1e-3 (convolutions may pick other kernels for other batch shapes)."""

from __future__ import annotations

import asyncio

import numpy as np
import torch
import yaml

DEVICE = "cuda:0"
SYSTEM = [11, 12, 13, 14]


def _config(model_dir):
    from duplex.config import pipeline_from_dict
    from duplex.config.loader import resolve_config_path

    raw = yaml.safe_load(resolve_config_path("omni-tiny").read_text())
    for stage in raw["stages"]:
        stage["args"]["model_dir"] = str(model_dir)
        stage["device"] = DEVICE
    return pipeline_from_dict(raw)


async def _staged(cfg, audios, request):
    from duplex.models.registry import BUILDERS
    from duplex.runtime.contract import CallerAudio
    from duplex.runtime.coordinator import Coordinator
    from duplex.runtime.requests import RequestStatus

    async with Coordinator(cfg, BUILDERS) as coord:
        handles = [coord.submit(request) for _ in audios]
        for handle, audio in zip(handles, audios):
            coord.feed(handle.request_id, CallerAudio(audio), eos=True)
        results = await asyncio.wait_for(asyncio.gather(*(h.collect() for h in handles)), 120)
        turns = []
        for chunks, finished in results:
            assert finished.status is RequestStatus.COMPLETED, finished.error
            tokens = [t for c in chunks if c.stage == "thinker" and c.data for t in c.data.token_ids]
            audio = [c.data for c in chunks if c.stage == "code2wav" and c.data is not None]
            turns.append((tokens, np.concatenate([a.codes for a in audio], axis=1),
                          np.concatenate([a.samples for a in audio])))
        stats = await coord.wait_idle(timeout=10)
        assert all(view.held == 0 for view in stats.values())
        return turns


def test_staged_on_the_gpu_equals_fused_on_the_gpu(tmp_path):
    from duplex.models.qwen3_omni.tiny import init_tiny
    from duplex.runtime.contract import TurnRequest
    from duplex_tools.qwen3_omni.fused import FusedOmni

    model_dir = init_tiny(tmp_path / "omni-tiny")
    request = TurnRequest(session_id="gpu", max_new_tokens=8, options={"talker_max_new_tokens": 16})
    audios = [(0.1 * np.random.default_rng(40 + i).standard_normal(16000 + 4000 * i)).astype(np.float32)
              for i in range(4)]
    staged = asyncio.run(_staged(_config(model_dir), audios, request))
    fused = FusedOmni(str(model_dir), system_ids=SYSTEM, device=DEVICE, thinker_max_len=512, talker_max_len=1024)
    assert fused.talker.graphs is not None, fused.talker.graph_error
    for audio, (tokens, codes, wav) in zip(audios, staged):
        turn = fused.run_turn(audio, request, keep_audio=True)
        assert tokens == turn.tokens
        assert np.array_equal(codes, turn.codes)
        assert wav.shape == turn.waveform.shape
        assert np.linalg.norm(wav - turn.waveform) / max(np.linalg.norm(turn.waveform), 1e-12) <= 1e-3
    del fused
    torch.cuda.empty_cache()
