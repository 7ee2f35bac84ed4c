"""The scenario set and the load benchmark against a real `duplex serve --config toy-voice`
(real stage processes, a real aiortc client over loopback, speech made with espeak-ng), through
the real command line. Expectations are judged by the runner; these tests check that it ran
them, that a broken expectation fails the run, and what it wrote."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from duplex_tools.harness import ServerProcess

pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which("espeak-ng") is None,
                                                   reason="espeak-ng is not installed")]
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def server():
    with ServerProcess(["--config", "toy-voice", "--port", "0", "--ice-loopback",
                        "--max-sessions", "4"], cwd=str(ROOT)) as proc:
        yield proc
    assert proc.stop() == 0, "".join(proc.output[-30:])


def duplex(*args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "duplex.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", head[16:24])


def test_the_scenario_set_passes(server, tmp_path):
    out = tmp_path / "results"
    run = duplex("scenario", "run", "scenarios", "--url", server.url, "--parallel", "2", "--out", str(out),
                 "--json", str(tmp_path / "results.json"), timeout=420)
    print(run.stdout[-6000:])
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    report = json.loads((tmp_path / "results.json").read_text())
    results = {s["name"]: s for s in report["scenarios"]}
    assert len(results) >= 10
    assert report["run_checks"] == [{"name": "idle_after_all", "ok": True, "detail": "every stage empty, no call live"}]
    for name, result in results.items():
        assert result["status"] == "pass", (name, result["failures"])
        width, height = png_size(out / f"{name}.png")
        assert width > 800 and height > 300
        assert json.loads((out / f"{name}.json").read_text())["heard_rms"]
    # Backchannels and noises that sound like speech paused the reply, which then played on.
    for name in ("backchannel", "cough-during-reply"):
        talked_on = [s for s in results[name]["steps"] if s["resume_ms"] is not None]
        assert len(talked_on) == 2 and results[name]["take_overs"] == 0, name
    # Every barge-in was timed, and each aborted response was seen to leave every stage.
    for name in ("barge-in-early", "barge-in-mid", "barge-in-late", "repeated-barge-ins", "echo"):
        cuts = [s for s in results[name]["steps"] if s["barge_in"]]
        assert cuts and all(s["stop_ms"] is not None and s["freed_after_ms"] is not None for s in cuts), name
        assert all(any(c["name"] == "released" and c["ok"] for c in s["checks"]) for s in cuts), name
    assert len(results["repeated-barge-ins"]["stop_ms"]) == 3
    assert results["echo"]["echo_gated_frames"] >= 20
    assert results["long-pause-mid-sentence"]["take_overs"] == 0
    assert results["silence-timeout"]["ttfb_ms"][0] >= 800
    summary = (out / "summary.md").read_text()
    assert "| scenario" in summary and "![barge-in-mid timeline](barge-in-mid.png)" in summary


def test_a_broken_expectation_fails_the_run(server, tmp_path):
    (tmp_path / "impatient.yaml").write_text(
        "steps:\n  - say: Could you tell me what time it is\n    expect: {reply: true, max_ttfb_ms: 100}\n")
    (tmp_path / "noise-stops-agent.yaml").write_text(
        "steps:\n  - say: Could you tell me what time it is\n    expect: {reply: true}\n"
        "  - noise: 0.04\n    at: {agent_heard_s: 0.5}\n    expect: {interrupts: true}\n")
    # a reply shorter than the audio awaited fails its trigger when its audio ends, not at the timeout
    (tmp_path / "cut-past-the-end.yaml").write_text(
        "steps:\n  - say: Could you tell me what time it is\n    expect: {reply: true}\n"
        "  - say: Wait, stop\n    at: {agent_heard_s: 600, timeout_s: 900}\n    expect: {interrupts: true}\n")
    run = duplex("scenario", "run", str(tmp_path), "--url", server.url, "--parallel", "3", "--no-plots",
                 "--out", str(tmp_path / "out"), "--json", str(tmp_path / "results.json"), timeout=240)
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-2000:]
    results = {s["name"]: s for s in json.loads((tmp_path / "results.json").read_text())["scenarios"]}
    assert results["impatient"]["status"] == "FAIL"
    (failure,) = results["impatient"]["failures"]
    assert failure.startswith("step 1 max_ttfb_ms: ") and failure.endswith("ms (limit 100)")
    assert results["noise-stops-agent"]["failures"] == ["step 2 interrupts: the agent was not cut"]
    ran = [f for f in results["cut-past-the-end"]["failures"] if f.startswith("ran: ")]
    assert ran and "the reply ended after" in ran[0], results["cut-past-the-end"]["failures"]
    assert "FAIL" in run.stdout


def test_the_load_benchmark_measures_each_level(server, tmp_path):
    # level 1 runs its caller in this process, level 2 its two callers in two processes
    run = duplex("bench", "load", "--url", server.url, "--sessions", "1,2", "--stagger-s", "0.5", "--client-procs", "2",
                 "--json", str(tmp_path / "load.json"), "--plot", str(tmp_path / "load.png"), timeout=300)
    print(run.stdout[-3000:])
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    report = json.loads((tmp_path / "load.json").read_text())
    assert [level["sessions"] for level in report["levels"]] == [1, 2]
    for level in report["levels"]:
        assert level["calls_ok"] == level["calls"] == level["sessions"]
        assert level["ttfb_ms"]["n"] == 2 * level["sessions"] and level["stop_ms"]["n"] == level["sessions"]
        assert 0 < level["ttfb_ms"]["p50"] <= level["ttfb_ms"]["p95"] <= level["ttfb_ms"]["p99"]
        assert level["server_cpu_cores"] > 0 and level["client_cpu_cores"] > 0
        assert level["frames_heard"] > 300 * level["sessions"]
        assert level["left_behind"] == {} and level["failed_checks"] == {}
        parts = level["server_parts_ms"]  # the server's own breakdown of the level's turns
        assert set(parts) >= {"end_of_turn", "asr_tail", "first_token", "playout"} and parts["end_of_turn"] > 0
    assert png_size(tmp_path / "load.png")[0] > 800
    assert "TTFB p95" in run.stdout and "knee" in run.stdout


def test_the_load_benchmark_says_which_expectations_failed(server, tmp_path):
    (tmp_path / "impatient.yaml").write_text(
        "steps:\n  - say: Could you tell me what time it is\n    expect: {reply: true, max_ttfb_ms: 100}\n")
    run = duplex("bench", "load", "--url", server.url, "--sessions", "1",
                 "--scenario", str(tmp_path / "impatient.yaml"), "--json", str(tmp_path / "load.json"), "--plot", "",
                 timeout=300)
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-2000:]
    (level,) = json.loads((tmp_path / "load.json").read_text())["levels"]
    assert level["calls_failed"] == 1
    assert list(level["failed_checks"]) == ["step 1 max_ttfb_ms"]
    assert level["failed_checks"]["step 1 max_ttfb_ms"]["times"] == 1
    assert "failed checks: step 1 max_ttfb_ms x1" in run.stdout
