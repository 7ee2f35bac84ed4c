"""Stages on GPUs, the parts that run without one: a missing CUDA device fails the start naming
the stage and the device; budgets on a card are checked against its free memory (numbers given
here; tests/gpu/ reads a real card); stats report device memory only for stages on a GPU."""

import asyncio

import pytest
import torch

from duplex.config import ConfigError, pipeline_from_dict
from duplex.config.placement import check_device_budgets
from duplex.models.registry import BUILDERS
from duplex.runtime.coordinator import Coordinator
from duplex.runtime.devices import check_devices, device_memory, device_problem

GiB = 2**30


def pipeline(**devices_and_memory):
    """Stages a -> b; ``a_device``, ``b_memory`` ... set their placement."""
    stages = []
    for name, nxt in (("a", ["b"]), ("b", [])):
        stages.append({"name": name, "builder": "toy.upper", "next": nxt, "terminal": not nxt,
                       "device": devices_and_memory.get(f"{name}_device", "cpu"),
                       "memory": devices_and_memory.get(f"{name}_memory", 0.01)})
    return pipeline_from_dict({"name": "gpu", "stages": stages})


def test_a_missing_or_out_of_range_cuda_device_is_named_with_its_stage():
    assert device_problem("talker", "cpu", False, 0) is None
    assert device_problem("talker", "cuda:0", True, 1) is None
    assert device_problem("talker", "cuda:1", False, 0, " (torch 2.13: built without CUDA)") == (
        "stage 'talker' is placed on cuda:1, but CUDA is not available on this host (torch 2.13: built without CUDA)")
    assert device_problem("talker", "cuda:1", True, 1) == (
        "stage 'talker' is placed on cuda:1, but this host has 1 CUDA device (cuda:0)")
    assert "has 2 CUDA devices (cuda:0..cuda:1)" in device_problem("vocoder", "cuda:2", True, 2)


def test_bare_cuda_means_the_first_card_and_other_names_are_refused():
    assert pipeline(a_device="cuda").stage("a").device == "cuda:0"
    with pytest.raises(ConfigError, match="use cpu, cuda or cuda:N"):
        pipeline(a_device="gpu0")


def test_gpu_budgets_over_the_cards_free_memory_are_refused_naming_the_stages():
    cfg = pipeline(a_device="cuda:0", a_memory=0.5, b_device="cuda:0", b_memory="30GiB")
    check_device_budgets(cfg, "cuda:0", free=100 * GiB, total=140 * GiB)  # 70 + 30 GiB fit in 100 free
    with pytest.raises(ConfigError) as err:
        check_device_budgets(cfg, "cuda:0", free=90 * GiB, total=140 * GiB)
    assert str(err.value) == (
        "placement: device cuda:0 has 90.0 GiB free of 140.0 GiB, but the budgets of its stages sum to "
        "100.0 GiB (a=70.0 GiB, b=30.0 GiB); lower their memory or free the card")


def test_check_devices_reads_free_memory_per_card_only_when_cuda_is_there():
    cfg = pipeline()
    check_devices(cfg, free_total=lambda indices: pytest.fail("asked a card for a cpu-only pipeline"))
    if torch.cuda.is_available():
        pytest.skip("this host has CUDA: tests/gpu/ covers it")
    with pytest.raises(ConfigError, match="stage 'b' is placed on cuda:0, but CUDA is not available"):
        check_devices(pipeline(b_device="cuda:0"), free_total=lambda indices: pytest.fail("no CUDA to ask"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the error path of a host without CUDA")
def test_a_pipeline_with_a_stage_on_cuda_fails_at_start_on_a_host_without_it():
    async def start() -> None:
        async with Coordinator(pipeline(a_device="cuda:0"), BUILDERS):
            pytest.fail("started a stage on a GPU this host lacks")

    with pytest.raises(ConfigError, match=r"placement: stage 'a' is placed on cuda:0, but CUDA is not available"):
        asyncio.run(start())


def test_device_memory_is_reported_only_for_stages_on_a_gpu():
    assert device_memory("cpu") is None
    if not torch.cuda.is_available():
        assert device_memory("cuda:0") is None  # and asking made no CUDA context


@pytest.mark.skipif(torch.cuda.is_available(), reason="the error path of a host without CUDA")
def test_a_stage_process_checks_its_device_before_building_anything():
    from duplex.runtime.stage_host import HostSpec, StageHost

    def never(ctx):
        pytest.fail("built a stage on a GPU this host lacks")

    spec = HostSpec(run_id="t", process="a", pipeline=pipeline(a_device="cuda:0").model_dump(), addresses={})
    with pytest.raises(RuntimeError, match="stage 'a' is placed on cuda:0, but CUDA is not available"):
        StageHost(spec, {"toy.upper": never})


def test_stage_stats_carry_device_memory_over_the_control_plane():
    from duplex.runtime import messages as m

    stats = m.StageStats(query_id=1, stage="talker", pid=2, live_requests=0, resources={},
                         device_memory=m.DeviceMemory(device="cuda:0", allocated=3 << 20, reserved=8 << 20))
    back = m.decode(m.encode(stats))
    assert isinstance(back, m.StageStats) and back.device_memory == stats.device_memory
    assert m.decode(m.encode(m.StageStats(query_id=1, stage="asr", pid=2, live_requests=0,
                                          resources={}))).device_memory is None


def test_a_fraction_of_a_gpu_reaches_the_builder_in_bytes_of_the_card():
    from duplex.config.placement import stage_budget_bytes
    from duplex.runtime.devices import budget_bytes

    def card(device: str) -> int:  # what get_device_properties would say
        return 140 * GiB

    cfg = pipeline(a_device="cuda:0", a_memory=0.25, b_device="cuda:0", b_memory="3GiB")
    assert budget_bytes(cfg, cfg.stage("a"), card) == 35 * GiB
    assert budget_bytes(cfg, cfg.stage("b"), card) == 3 * GiB
    on_cpu = pipeline()
    assert budget_bytes(on_cpu, on_cpu.stage("a"), card) == stage_budget_bytes(on_cpu, on_cpu.stage("a"))
