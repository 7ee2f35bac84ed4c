"""`duplex bench doors` end to end, once per door: the same spoken order over the WebSocket and
over WebRTC against a server it starts itself, each turn getting audio, the JSON written."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_bench_doors_measures_both_doors(tmp_path):
    out = tmp_path / "doors.json"
    run = subprocess.run([sys.executable, "-m", "duplex.cli", "bench", "doors", "--serve", "toy-voice",
                          "--turns", "1", "--warmup", "0", "--api-key", "sk-bench-doors-0123456789",
                          "--json", str(out)], capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    summary = json.loads(out.read_text())["summary"]
    assert set(summary) == {"websocket", "webrtc"}
    for door, row in summary.items():
        assert row["turns_with_audio"] == row["turns"] == 1, (door, row)
        assert row["p50"] > 0 and row["server_p50"] > 0, (door, row)
    assert "websocket" in run.stdout and "webrtc" in run.stdout  # the table
