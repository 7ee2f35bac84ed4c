"""What a GPU host needs to run the omni stages and the pipeline bench: torch, transformers and
the runtime's own small packages, not the media stack (PyAV, aiortc, the web server), which
that host does not have (docs/guides/gpu.md, scripts/gpu_check.sh)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ABSENT = ["av", "aiortc", "aioice", "fastapi", "uvicorn", "webrtcvad", "openai"]
MODULES = ["duplex.runtime.coordinator", "duplex.runtime.stage_host", "duplex.models.registry",
           "duplex.models.qwen3_omni.stages", "duplex_tools.bench.pipeline", "duplex_tools.qwen3_omni.fused"]


def test_the_runtime_the_omni_family_and_the_bench_import_without_the_media_stack():
    script = (f"import sys\nfor name in {ABSENT!r}:\n    sys.modules[name] = None  # importing it raises\n"
              f"import importlib\nfor module in {MODULES!r}:\n    importlib.import_module(module)\nprint('ok')")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]
