"""Tests that need a CUDA device: skipped, with the reason, on hosts without one (they run on a
lent GPU host through scripts/gpu_check.sh)."""

import pytest


@pytest.fixture(autouse=True)
def _needs_cuda():
    import torch

    if not torch.cuda.is_available():
        pytest.skip(f"needs a CUDA device: torch.cuda.is_available() is False here (torch {torch.__version__})")
