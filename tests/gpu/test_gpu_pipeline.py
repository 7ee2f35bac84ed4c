"""The omni stages on a GPU: the talker's and the thinker's graph-captured steps equal their eager
steps, and the real-size parts build on the device in seconds. Skipped where CUDA is missing.

Tolerances: the tiny checkpoint in float32 (logits spread far from ties) must give the same
codes graph vs eager and feedback within 1e-4; at real size in bf16 the codes of random weights
sit close to ties, so the test reports the agreement and the step times, and asserts only that
every bucket was captured and replays without error.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tests.omni_graph_helpers import drive, reset

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (a GPU machine)")

DEVICE = "cuda:0"


def _talker_pair(module, config, capacity: int, max_len: int):
    from duplex.models.qwen3_omni.talker import TalkerRunner

    make = lambda graphs: TalkerRunner(module, config, memory_bytes=None, max_len=max_len,
                                       max_slots=capacity, device=DEVICE, graphs=graphs, ignore_eos=True)
    return make(False), make([1, 2, 4, 8])


def test_graph_replay_equals_eager_on_the_tiny_talker(tmp_path):
    from duplex.models.qwen3_omni.loading import load_talker
    from duplex.models.qwen3_omni.tiny import init_tiny

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model_dir = init_tiny(tmp_path / "omni-tiny")
    module, config = load_talker(model_dir, DEVICE)
    eager, graphed = _talker_pair(module, config, capacity=8, max_len=256)
    assert graphed.graphs is not None, graphed.graph_error
    assert graphed.graphs.sizes == [1, 2, 4, 8]
    for rows in (1, 3, 8):  # bucket exact, padded (3 -> 4), full
        reset(eager, graphed)
        frames_e, feedback_e, _ = drive(eager, rows, steps=12)
        frames_g, feedback_g, _ = drive(graphed, rows, steps=12)
        np.testing.assert_array_equal(frames_g, frames_e)
        torch.testing.assert_close(feedback_g, feedback_e, atol=1e-4, rtol=1e-4)


def test_real_size_talker_graphs_capture_and_time_the_step(record_property):
    from duplex.models.qwen3_omni.real_size import build_part, real_config

    config = real_config()
    module, build_s = build_part("talker", config, DEVICE, torch.bfloat16, seed=3)
    eager, graphed = _talker_pair(module, config, capacity=16, max_len=512)
    assert graphed.graphs is not None, graphed.graph_error
    report = {"talker_build_s": round(build_s, 2), "capture_s": round(graphed.graphs.capture_s, 2), "steps": {}}
    for rows in (1, 8, 16):
        reset(eager, graphed)
        frames_e, _, times_e = drive(eager, rows, steps=10)
        frames_g, _, times_g = drive(graphed, rows, steps=10)
        report["steps"][rows] = {"eager_ms_p50": round(float(np.median(times_e)) * 1e3, 2),
                                 "graph_ms_p50": round(float(np.median(times_g)) * 1e3, 2),
                                 "codes_equal_fraction": round(float((frames_e == frames_g).mean()), 3)}
    print("REAL_SIZE_TALKER_STEP " + json.dumps(report))
    record_property("real_size_talker", json.dumps(report))
    del eager, graphed, module
    torch.cuda.empty_cache()


def test_real_size_parts_build_on_the_device_in_seconds(record_property):
    """Each part at Qwen3-Omni-30B-A3B's shapes, random bf16 weights made on the GPU (nothing read
    or written on disk), one part at a time as the stages hold them."""
    from duplex.models.qwen3_omni.real_size import build_part, real_config

    config = real_config()
    report = {}
    for kind in ("encoder", "thinker", "talker", "code2wav"):
        torch.cuda.empty_cache()
        module, seconds = build_part(kind, config, DEVICE, torch.bfloat16, seed=1)
        params = list(module.parameters())
        assert all(p.device.type == "cuda" and p.dtype == torch.bfloat16 for p in params)
        report[kind] = {"seconds": round(seconds, 2), "params_b": round(sum(p.numel() for p in params) / 1e9, 2),
                        "allocated_gib": round(torch.cuda.memory_allocated(DEVICE) / 2**30, 1)}
        assert seconds < 60
        del module, params
    torch.cuda.empty_cache()
    print("REAL_SIZE_BUILD " + json.dumps(report))
    record_property("real_size_build", json.dumps(report))


def test_thinker_graph_replay_equals_eager_on_the_tiny_thinker(tmp_path):
    from duplex.models.qwen3_omni.tiny import init_tiny
    from tests.omni_graph_helpers import assert_same_thinking, thinker_pair

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    eager, graphed, encoder = thinker_pair(init_tiny(tmp_path / "omni-tiny"), DEVICE, graphs=[1, 2, 4])
    assert graphed.graphs is not None, graphed.graph_error
    assert graphed.graphs.sizes == [1, 2, 4] and len(graphed.graphs.prefills) == 6
    assert_same_thinking(eager, graphed, encoder)
