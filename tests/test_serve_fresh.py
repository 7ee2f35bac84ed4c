"""The README's serve command as a newcomer meets it: `bash scripts/serve.sh` in a virtual
environment made only by what that script installs (no test extra, no tools package) serves the
default pipeline (local), loads its end-of-turn audio model, and a real WebRTC call placed from the
test environment gets a spoken reply. A module the serve path imports but no requirement of
serve.sh's install brings makes the server fail to start here.

The environment is .venv-serve (DUPLEX_VENV, kept between runs so pip finds everything already
there); it is made anew whenever pyproject.toml or the set-up scripts changed, so a requirement
dropped since cannot linger in it."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from duplex_tools.client import RealtimeClient
from duplex_tools.harness import ServerProcess
from duplex_tools.probes import ask
from tests.local_helpers import ORDER, speak

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800), pytest.mark.usefixtures("loopback_candidates")]
ROOT = Path(__file__).resolve().parents[1]
VENV = ".venv-serve"
INPUTS = ["pyproject.toml", "scripts/setup.sh", "scripts/serve.sh"]
MARKER = ".duplex-inputs"  # the hash of INPUTS the environment was made from


def _inputs_hash() -> str:
    return hashlib.sha256(b"".join((ROOT / name).read_bytes() for name in INPUTS)).hexdigest()


@pytest.fixture(scope="module", autouse=True)
def _no_outer_pythonpath():
    """An outer PYTHONPATH would put another checkout's duplex (or the tools) ahead of the environment
    under test in every process it starts: the environment alone must serve."""
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("PYTHONPATH", raising=False)
        yield


@pytest.fixture(scope="module")
def serve_venv() -> Path:
    """Made (or brought up to date) by serve.sh's own set-up step, before the server's clock runs."""
    venv = ROOT / VENV
    marker = venv / MARKER
    if marker.exists() and marker.read_text() != _inputs_hash():
        shutil.rmtree(venv)
    started = time.monotonic()
    subprocess.run(["bash", "scripts/setup.sh", "--local"], cwd=ROOT, env={**os.environ, "DUPLEX_VENV": VENV},
                   check=True, timeout=1500)
    print(f"\n{VENV}: set up in {time.monotonic() - started:.0f} s")
    marker.write_text(_inputs_hash())
    return venv


def test_the_serve_environment_holds_no_test_or_tools_package(serve_venv):
    for module in ("pytest", "duplex_tools", "playwright"):
        found = subprocess.run([str(serve_venv / "bin" / "python"), "-c", f"import {module}"], capture_output=True)
        assert found.returncode != 0, f"{VENV} has {module}: it is not what scripts/serve.sh installs"


def test_every_duplex_module_imports_in_the_serve_environment(serve_venv, tmp_path):
    """Every pipeline's modules (engine, omni-tiny, toy-voice too), not just the ones serving
    `local` loads: their top-level imports must all be installed by serve.sh."""
    script = ("import importlib, pkgutil, duplex\n"
              "names = [m.name for m in pkgutil.walk_packages(duplex.__path__, 'duplex.')]\n"
              "for name in names:\n    importlib.import_module(name)\n"
              "print(len(names))\n")
    run = subprocess.run([str(serve_venv / "bin" / "python"), "-c", script], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert int(run.stdout) > 100  # the walk found the package


@pytest.fixture(scope="module")
def server(serve_venv):
    # literally the README's command, with the environment named and serve's own options after it
    command = ["env", f"DUPLEX_VENV={VENV}", "bash", "scripts/serve.sh"]
    with ServerProcess(["--port", "0", "--ice-loopback", "--max-sessions", "1"], ready_timeout=900, cwd=str(ROOT),
                       command=command) as proc:
        yield proc
    assert proc.stop() == 0, "".join(proc.output[-30:])


def test_serve_runs_from_the_serve_environment_with_its_turn_model(server):
    assert server.pid is not None
    argv = Path(f"/proc/{server.pid}/cmdline").read_bytes().split(b"\0")
    assert any(f"/{VENV}/bin/".encode() in arg for arg in argv), argv
    # without the Smart Turn model the server still serves, but judges semantic turns by words only
    assert not [line for line in server.output if "words only" in line], "".join(server.output)


async def test_a_webrtc_call_to_the_default_pipeline_gets_a_spoken_reply(server):
    order = speak(ORDER, rate=48000)  # before the call: synthesis would stall the client's loop
    client = RealtimeClient(server.url)
    await client.connect()
    try:
        created = await ask(client, order, timeout=60)
        response_id = created["response"]["id"]
        started = await client.wait_event("output_audio_buffer.started", timeout=120, response_id=response_id)
        done = await client.wait_event("response.done", timeout=120)  # the call's only response
        assert done["response"]["id"] == response_id and done["response"]["status"] == "completed", done
        await client.wait_event("output_audio_buffer.stopped", timeout=120, response_id=response_id)
        heard = client.loud_frames(client.time_of(started) - 0.1)
        assert len(heard) * 0.02 >= 0.5, f"only {len(heard)} loud 20 ms frames of the reply were heard"
        assert float(np.abs(np.concatenate([h.pcm for h in heard])).max()) > 0.05
    finally:
        await client.hang_up()
