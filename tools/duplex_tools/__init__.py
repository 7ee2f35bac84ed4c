"""Tools around the duplex server (not part of it): the Realtime WebRTC test client, the harness
that runs a real server, probes, benchmarks, the scenario runner and the qwen3_omni baselines."""

from pathlib import Path

# The checkout's scripted conversations: the tools are installed from the checkout (editable), so
# the scenarios beside them are the default of `duplex scenario run` and `duplex bench load`.
SCENARIOS_DIR = Path(__file__).resolve().parents[2] / "scenarios"
