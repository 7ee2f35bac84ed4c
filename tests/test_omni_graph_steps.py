"""The fixed-shape steps the CUDA graphs capture, run eagerly on the CPU, equal the runners' eager
steps: the talker's frame step and prefill tail (the same codes and feedback for a bucket filled
exactly, one padded with spare rows, more rows than the largest bucket) and the thinker's decode
and prefill (the same tokens and talker prefix). The graph replay itself needs a GPU
(tests/gpu/test_gpu_pipeline.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from duplex.models.qwen3_omni.graphs import buckets_for
from duplex.models.qwen3_omni.loading import load_talker
from duplex.models.qwen3_omni.talker import TalkerRunner
from duplex.models.qwen3_omni.talker_graph import TalkerGraphs
from duplex.models.qwen3_omni.tiny import init_tiny
from tests.omni_graph_helpers import assert_same_thinking, drive, reset, thinker_pair

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return init_tiny(tmp_path_factory.getbasetemp() / "omni-tiny-static")


@pytest.fixture(scope="module")
def talker(model_dir):
    return load_talker(model_dir)


def test_buckets_are_off_on_the_cpu_and_capped_by_the_slots():
    assert buckets_for(None, "cpu", 16) == []
    assert buckets_for(None, "cuda:0", 16) == [1, 2, 4, 8, 16]
    assert buckets_for([1, 2, 4, 8, 16], "cuda:0", 6) == [1, 2, 4, 6]
    assert buckets_for(False, "cuda:0", 16) == []


@pytest.mark.parametrize("rows", [1, 3, 6])
def test_the_static_step_equals_the_eager_step(talker, rows):
    module, config = talker
    make = lambda: TalkerRunner(module, config, memory_bytes=None, max_len=128, max_slots=6)
    eager, static = make(), make()
    assert eager.graphs is None  # the CPU default
    static.graphs = TalkerGraphs(static, [1, 2, 4], capture_now=False)
    reset(eager, static)
    frames_e, feedback_e, _ = drive(eager, rows, steps=8)
    frames_s, feedback_s, _ = drive(static, rows, steps=8)
    np.testing.assert_array_equal(frames_s, frames_e)
    torch.testing.assert_close(feedback_s, feedback_e, atol=1e-5, rtol=1e-5)
    spare = static.capacity
    assert not static.seen[:spare][rows:].any()  # padding rows touched only the spare slot


def test_the_thinkers_static_steps_equal_its_eager_steps(model_dir):
    """The thinker's fixed-shape prefill and decode (what its CUDA graphs capture) give the eager
    tokens and the same hidden states for the talker."""
    from duplex.models.qwen3_omni.thinker_graph import ThinkerGraphs

    eager, static, encoder = thinker_pair(model_dir, "cpu", graphs=False)
    static.graphs = ThinkerGraphs(static, [1, 2, 4], capture_now=False)
    assert_same_thinking(eager, static, encoder)


def _live_tensor_bytes() -> int:
    import gc

    gc.collect()
    storages = {}
    for obj in gc.get_objects():
        if type(obj) is torch.Tensor or type(obj) is torch.nn.Parameter:
            storages[obj.untyped_storage().data_ptr()] = obj.untyped_storage().nbytes()
    return sum(storages.values())


def test_the_captured_steps_keep_no_activations_alive(model_dir, talker):
    """The graphs are captured while the stage builds, outside any no_grad: the steps must not
    record autograd graphs (which kept every activation of every capture alive, out of memory
    at real size)."""
    from duplex.models.qwen3_omni.loading import load_thinker, special_tokens
    from duplex.models.qwen3_omni.thinker import ThinkerRunner
    from duplex.models.qwen3_omni.thinker_graph import ThinkerGraphs

    lm, config = load_thinker(model_dir)
    lm.requires_grad_(True)  # as a module fresh from transformers
    thinker = ThinkerRunner(lm, config, special_tokens(config), memory_bytes=None, max_len=128, max_slots=4)
    graphs = ThinkerGraphs(thinker, [1, 4], capture_now=False)
    module, tconfig = talker
    module.requires_grad_(True)
    talker_runner = TalkerRunner(module, tconfig, memory_bytes=None, max_len=128, max_slots=4)
    talker_graphs = TalkerGraphs(talker_runner, [1, 4], capture_now=False)
    before = _live_tensor_bytes()
    outputs = [graphs.step(b) for b in graphs.buckets.values()]
    outputs += [graphs.prefill_step(p) for p in graphs.prefills.values()]
    outputs += [talker_graphs.step(b) for b in talker_graphs.buckets.values()]
    outputs += [talker_graphs.tail(b) for b in talker_graphs.buckets.values()]
    thinker.kv.unbind_static()
    talker_runner.kv.unbind_static()
    assert not any(t.requires_grad for out in outputs for t in (out if isinstance(out, tuple) else (out,)))
    kept = _live_tensor_bytes() - before
    produced = sum(t.untyped_storage().nbytes() for out in outputs for t in (out if isinstance(out, tuple) else (out,)))
    assert kept <= produced  # only the outputs themselves
    module.requires_grad_(False)
