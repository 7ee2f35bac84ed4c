"""The wheel is the product: built from the source, installed (not editable) into a fresh folder,
`duplex serve --config toy-voice` serves the demo page and the named pipeline from a working
directory that has no checkout in it. The bundled configs and the demo page must be inside the
wheel (package data); nothing may be found through the checkout."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import httpx
import pytest

from duplex_tools.harness import ServerProcess

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DATA = ["duplex/configs/toy-voice.yaml", "duplex/configs/local.yaml", "duplex/web/index.html",
                "duplex/web/app.js", "duplex/web/style.css"]


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
def installed(wheel, tmp_path_factory) -> Path:
    target = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                   check=True, timeout=300)
    return target


def test_the_wheel_carries_the_configs_and_the_demo_page(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    assert [name for name in PACKAGE_DATA if name not in names] == []


def test_the_installed_wheel_serves_the_demo_page_from_any_directory(installed, tmp_path, monkeypatch):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.setenv("PYTHONPATH", str(installed))  # the dependencies still come from this venv
    where = subprocess.run([sys.executable, "-c", "import duplex; print(duplex.__file__)"], cwd=elsewhere,
                           capture_output=True, text=True, check=True).stdout.strip()
    assert Path(where).is_relative_to(installed), f"the server would run the checkout's duplex: {where}"
    with ServerProcess(["--config", "toy-voice", "--port", "0"], cwd=str(elsewhere)) as server:
        page = httpx.get(server.url + "/", timeout=10)
        assert page.status_code == 200
        assert page.text == (installed / "duplex" / "web" / "index.html").read_text()
        script = httpx.get(server.url + "/web/app.js", timeout=10)
        assert script.status_code == 200 and "oai-events" in script.text
        stats = httpx.get(server.url + "/duplex/stats", timeout=10)
        assert stats.status_code == 200
        assert stats.json()["pipeline"] == "toy-voice"
