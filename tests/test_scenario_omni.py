"""The barge-in scenarios over WebRTC against a real `duplex serve --config omni-tiny` (four stage
processes: encoder -> thinker -> talker -> code2wav on the tiny checkpoint, whose vocoder speaks
an audible tone), through the real command line. The runner judges the expectations (the agent
falls silent within 400 ms of the caller talking over it, the cut response leaves every stage,
the interruption is answered); this test checks it ran them all and what it measured.

All four barge-in scenarios can hold on omni-tiny: the tiny talker's end-of-speech is silenced,
so a reply ends by length (up to 250 frames, 20 s), and even the late barge-in (4 s heard) finds
the agent still talking."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from duplex.models.qwen3_omni.tiny import init_tiny
from duplex_tools.harness import ServerProcess

pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which("espeak-ng") is None,
                                                   reason="espeak-ng is not installed")]
ROOT = Path(__file__).resolve().parents[1]
STAGES = ("encoder", "thinker", "talker", "code2wav")
SCENARIOS = ("barge-in-early", "barge-in-mid", "barge-in-late", "repeated-barge-ins")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model_dir = tmp_path_factory.getbasetemp() / "omni-tiny"  # the checkpoint the other omni tests share
    if not (model_dir / "model.safetensors").exists():
        init_tiny(model_dir)
    overrides = [arg for stage in STAGES for arg in (f"--{stage}.args.model_dir", str(model_dir))]
    with ServerProcess(["--config", "omni-tiny", "--port", "0", "--ice-loopback", "--max-sessions", "4",
                        *overrides], ready_timeout=180.0, cwd=str(ROOT)) as proc:
        yield proc
    assert proc.stop() == 0, "".join(proc.output[-30:])


def test_the_barge_in_scenarios_pass_on_the_omni_pipeline(server, tmp_path):
    out = tmp_path / "results"
    paths = [str(ROOT / "scenarios" / f"{name}.yaml") for name in SCENARIOS]
    run = subprocess.run([sys.executable, "-m", "duplex.cli", "scenario", "run", *paths, "--url", server.url,
                          "--no-plots", "--out", str(out), "--json", str(tmp_path / "results.json")],
                         cwd=ROOT, capture_output=True, text=True, timeout=480)
    print(run.stdout[-4000:])
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    report = json.loads((tmp_path / "results.json").read_text())
    results = {s["name"]: s for s in report["scenarios"]}
    assert sorted(results) == sorted(SCENARIOS)
    for name, result in results.items():
        assert result["status"] == "pass", (name, result["failures"])
        assert any(c["name"] == "idle_at_end" and c["ok"] for c in result["checks"]), name
        # Every barge-in cut a reply the caller was hearing, was timed, and its response left every stage.
        cuts = [s for s in result["steps"] if s["barge_in"]]
        assert cuts and all(s["agent_speaking_at_onset"] for s in cuts), name
        assert all(s["stop_ms"] is not None and s["freed_after_ms"] is not None for s in cuts), name
        assert all(any(c["name"] == "released" and c["ok"] for c in s["checks"]) for s in cuts), name
        # The agent was heard as speech, not as the random vocoder's near-silence.
        heard = np.array([rms for _, rms in json.loads((out / f"{name}.json").read_text())["heard_rms"]])
        assert heard.max() > 10 ** (-30 / 20), (name, heard.max())
    assert len(results["repeated-barge-ins"]["stop_ms"]) == 3
    assert report["totals"]["false_interruptions"] == 0
