"""The smoke subset of the scenarios (a plain turn, an early barge-in) against the embedded
default pipeline (`configs/local.yaml`: Whisper, Gemma, Piper) in a real `duplex serve`.

The TTFB limit is lifted to what a loaded 2-core CI box manages: this checks that the real
models answer, stop when interrupted and let go of the aborted response; `duplex scenario run`
and `duplex bench load` give the timings."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from duplex_tools.harness import ServerProcess

pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which("espeak-ng") is None,
                                                   reason="espeak-ng is not installed")]
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def local_server():
    from duplex.models.local import assets

    assets.prepare_all()  # a no-op once the cache exists
    with ServerProcess(["--config", "local", "--port", "0", "--ice-loopback"], ready_timeout=600,
                       cwd=str(ROOT)) as proc:
        yield proc
    assert proc.stop() == 0, "".join(proc.output[-30:])


def test_the_smoke_scenarios_pass_on_the_local_pipeline(local_server, tmp_path):
    run = subprocess.run([sys.executable, "-m", "duplex.cli", "scenario", "run", "scenarios", "--tag", "smoke",
                          "--url", local_server.url, "--ttfb-limit-ms", "12000", "--no-plots",
                          "--out", str(tmp_path / "out"), "--json", str(tmp_path / "results.json")],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    print(run.stdout[-4000:])
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    results = {s["name"]: s for s in json.loads((tmp_path / "results.json").read_text())["scenarios"]}
    assert set(results) == {"plain-turn", "barge-in-early"}
    assert all(r["status"] == "pass" for r in results.values())
    cut = next(s for s in results["barge-in-early"]["steps"] if s["barge_in"])
    assert cut["stop_ms"] <= 300 and cut["freed_after_ms"] is not None
