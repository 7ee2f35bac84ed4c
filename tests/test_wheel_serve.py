"""The wheel is the product: built from the source and installed (not editable) into a fresh
virtual environment with only its own dependencies (torch's CPU wheel first, no extras, no test
packages, no system site-packages), its `duplex serve --config toy-voice` runs from a working
directory that has no checkout in it, serves the demo page, and answers a real WebRTC call with
audio. The bundled configs, the demo page and the Smart Turn model must be inside the wheel
(package data); nothing may be found through the checkout or the test environment, so a module
the server imports that the wheel does not require makes it fail here."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import httpx
import pytest

from duplex_tools.client import RealtimeClient
from duplex_tools.harness import ServerProcess, espeak
from duplex_tools.probes import ask

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200), pytest.mark.usefixtures("loopback_candidates")]
ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DATA = ["duplex/configs/toy-voice.yaml", "duplex/configs/local.yaml", "duplex/web/index.html",
                "duplex/web/app.js", "duplex/web/style.css", "duplex/models/smart_turn/data/smart-turn-v3.2-cpu.onnx",
                "duplex/models/smart_turn/data/LICENSE"]


@pytest.fixture(scope="module", autouse=True)
def _no_outer_pythonpath():
    """An outer PYTHONPATH would put another checkout's duplex (or the tools) ahead of the environment
    under test in every process it starts: the environment alone must serve."""
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("PYTHONPATH", raising=False)
        yield


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """Built from a copy of the sources, so no earlier build folder of the checkout leaks in."""
    source = tmp_path_factory.mktemp("source")
    shutil.copytree(ROOT / "duplex", source / "duplex", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(out), str(source)], check=True, timeout=300)
    [built] = out.glob("duplex-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel):
    """A venv of its own (~1.2 GB with torch), removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="duplex-wheel-venv-") as folder:
        python = Path(folder) / "bin" / "python"
        started = time.monotonic()
        subprocess.run([sys.executable, "-m", "venv", folder], check=True, timeout=120)
        for spec in ("torch==2.13.0", str(wheel)):  # torch first: the CPU wheel, not a CUDA build
            subprocess.run([str(python), "-m", "pip", "install", "-q", spec], check=True, timeout=900)
        print(f"\nthe wheel's venv: set up in {time.monotonic() - started:.0f} s")
        yield Path(folder)


def test_the_wheel_carries_the_configs_the_demo_page_and_the_turn_model(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    assert [name for name in PACKAGE_DATA if name not in names] == []


def test_the_venv_has_the_wheel_and_nothing_from_the_tests(venv, tmp_path):
    python = str(venv / "bin" / "python")
    where = subprocess.run([python, "-c", "import duplex; print(duplex.__file__)"], cwd=tmp_path,
                           capture_output=True, text=True, check=True).stdout.strip()
    assert Path(where).is_relative_to(venv), f"the server would run another duplex: {where}"
    for module in ("pytest", "duplex_tools", "faster_whisper"):  # test extra, tools, local extra
        found = subprocess.run([python, "-c", f"import {module}"], capture_output=True)
        assert found.returncode != 0, f"the wheel's venv has {module}, which the wheel does not require"


@pytest.fixture(scope="module")
def server(venv, tmp_path_factory):
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    with ServerProcess(["--config", "toy-voice", "--port", "0", "--ice-loopback", "--max-sessions", "1"],
                       cwd=str(elsewhere), command=[str(venv / "bin" / "duplex"), "serve"]) as proc:
        yield proc
    assert proc.stop() == 0, "".join(proc.output[-30:])


def test_the_installed_wheel_serves_the_demo_page_from_any_directory(server, venv):
    [site] = (venv / "lib").glob("python3*/site-packages")
    page = httpx.get(server.url + "/", timeout=10)
    assert page.status_code == 200
    assert page.text == (site / "duplex" / "web" / "index.html").read_text()
    script = httpx.get(server.url + "/web/app.js", timeout=10)
    assert script.status_code == 200 and "oai-events" in script.text
    stats = httpx.get(server.url + "/duplex/stats", timeout=10)
    assert stats.status_code == 200
    assert stats.json()["pipeline"] == "toy-voice"


async def test_the_installed_wheel_answers_a_webrtc_call_with_audio(server):
    question = espeak("Could you tell me what time it is")
    client = RealtimeClient(server.url)
    await client.connect()
    try:
        response_id = (await ask(client, question))["response"]["id"]
        await client.wait_event("output_audio_buffer.started", timeout=20, response_id=response_id)
        done = await client.wait_event("response.done", timeout=30)
        assert done["response"]["id"] == response_id and done["response"]["status"] == "completed", done
        await client.wait_event("output_audio_buffer.stopped", timeout=30, response_id=response_id)
        heard_s = len(client.loud_frames(since=0)) * 0.02
        assert heard_s > 1.0, f"only {heard_s:.2f} s of agent audio arrived"
    finally:
        await client.hang_up()
