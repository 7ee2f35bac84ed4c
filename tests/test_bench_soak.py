"""`duplex bench soak`: its verdicts on made-up sample series (memory that keeps growing fails,
memory that stays flat passes, fds or threads or a stage slot not given back fail), and one short
soak end to end against a server it starts (toy-voice), whose verdicts must come from real samples."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from duplex_tools.bench.soak_verdict import Bounds, passed, resource_rows, rss_slope_kib

ROOT = Path(__file__).resolve().parents[1]


def sample(phase: str, barge_ins: int, rss: float, fds: int = 120, threads: int = 30, shm: int = 1,
           held: int = 0) -> dict:
    return {"phase": phase, "barge_ins": barge_ins, "rss_mib": rss, "rss_by_process": {"edge": rss - 200.0},
            "fds": fds, "threads": threads, "shm_segments": shm, "held": {"voice": held},
            "held_detail": {"voice": {"live_requests": held}} if held else {}}


def series(rss_at, **final) -> list[dict]:
    """A soak's samples: idle before, warm-up, idle after warm-up, 50 samples over 900 barge-ins
    with RSS ``rss_at(barge_ins)``, then the final idle sample (fields overridable)."""
    samples = [sample("before", 0, 290.0), sample("warm-up", 50, 300.0), sample("warmed", 100, 300.0)]
    samples += [sample("run", 100 + 18 * i, rss_at(100 + 18 * i), fds=128, threads=60) for i in range(1, 51)]
    samples.append(sample("final", 1000, final.pop("rss", rss_at(1000)), **final))
    return samples


def verdicts(samples: list[dict]) -> dict[str, str]:
    return {r["resource"]: r["verdict"] for r in resource_rows(samples, Bounds(rss_mib=20.0, rss_pct=10.0))}


def test_flat_memory_and_everything_given_back_passes():
    samples = series(lambda n: 300.0 + (n // 18) % 3)  # wobbles by 2 MiB, never grows
    rows = resource_rows(samples)
    assert passed(rows), rows
    assert {r["resource"] for r in rows} == {"RSS total (MiB)", "RSS edge (MiB)", "fds", "threads", "shm_segments",
                                             "voice held"}
    total = next(r for r in rows if r["resource"] == "RSS total (MiB)")
    assert total["at_warmup"] == 300.0 and total["max_after"] == 302.0 and total["growth"] == 2.0
    assert abs(rss_slope_kib(samples)) < 1.0


def test_memory_growing_with_barge_ins_fails():
    samples = series(lambda n: 300.0 + 0.05 * (n - 100))  # 50 KiB per barge-in: 45 MiB over 900
    found = verdicts(samples)
    assert found["RSS total (MiB)"] == found["RSS edge (MiB)"] == "FAIL"
    assert found["fds"] == found["threads"] == found["voice held"] == "pass"
    assert not passed(resource_rows(samples))
    assert rss_slope_kib(samples) == pytest.approx(51.2, rel=0.01)


def test_growth_within_the_percent_bound_passes():
    # 25 MiB over a 300 MiB server is past the 20 MiB bound but within 10 %
    assert verdicts(series(lambda n: 300.0 + 25.0 * (n - 100) / 900))["RSS total (MiB)"] == "pass"


@pytest.mark.parametrize(("kind", "final", "resource"), [
    ("an fd", {"fds": 121}, "fds"), ("a thread", {"threads": 31}, "threads"),
    ("a shm segment", {"shm": 2}, "shm_segments"), ("a live request", {"held": 1}, "voice held")])
def test_anything_not_given_back_at_idle_fails(kind, final, resource):
    rows = resource_rows(series(lambda n: 300.0, **final))
    assert {r["resource"] for r in rows if r["verdict"] == "FAIL"} == {resource}, kind
    if resource == "voice held":
        assert "still held: {'live_requests': 1}" in next(r["rule"] for r in rows if r["resource"] == resource)


def test_without_idle_or_run_samples_there_is_no_pass():
    samples = series(lambda n: 300.0)
    for missing in ("warmed", "run", "final"):
        rows = resource_rows([s for s in samples if s["phase"] != missing])
        assert [r["resource"] for r in rows] == ["samples"] and not passed(rows), missing


def png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", head[16:24])


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng is not installed")
def test_a_short_soak_samples_the_server_and_judges_it(tmp_path):
    out = tmp_path / "soak.json"
    run = subprocess.run([sys.executable, "-m", "duplex.cli", "bench", "soak", "--serve", "toy-voice",
                          "--sessions", "2", "--barge-ins", "12", "--sample-s", "2", "--json", str(out),
                          "--plot", str(tmp_path / "soak.png")], cwd=ROOT, capture_output=True, text=True,
                         timeout=200)
    print(run.stdout[-4000:])
    report = json.loads(out.read_text())
    assert report["barge_ins"] >= 12 and report["barge_ins"] == report["server_barge_ins"]
    assert report["calls"] >= 2 and report["stop_ms"]["n"] == report["barge_ins"]
    samples = report["samples"]
    phases = [s["phase"] for s in samples]
    assert phases[0] == "before" and phases.count("warmed") == 1 and phases[-1] == "final"
    running = [s for s in samples if s["phase"] == "run"]
    assert len(running) > 1 and max(s["live_calls"] for s in running) >= 1
    assert max(sum(s["held"].values()) for s in samples) > 0  # the stages were seen holding work ...
    final = samples[-1]
    assert final["live_calls"] == 0 and sum(final["held"].values()) == 0  # ... and holding nothing at the end
    assert set(final["rss_by_process"]) >= {"edge", "ears", "mind", "voice"}
    assert final["fds"] > 0 and final["threads"] > 4 and final["shm_segments"] >= 1
    rows = {r["resource"]: r for r in report["resources"]}
    assert rows["RSS total (MiB)"]["at_warmup"] > 100 and rows["barge-ins made"]["verdict"] == "pass"
    for name in ("voice held", "ears held", "mind held", "shm_segments", "fds"):
        assert rows[name]["verdict"] == "pass", rows[name]
    assert report["passed"] == all(r["verdict"] == "pass" for r in rows.values())
    assert run.returncode == (0 if report["passed"] else 1), run.stderr[-2000:]
    assert png_size(tmp_path / "soak.png")[0] > 800
    assert "warmed (idle)" in run.stdout and "soak: " in run.stdout
