"""The layer contracts hold, and they are not decoration: a deliberate violation of each kind
fails them. The checks run on a copy of the package so the tree under test is untouched."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

pytestmark = pytest.mark.skipif(not LINT_IMPORTS.exists(), reason="import-linter is installed by setup.sh --test")


def _lint(tree: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=tree, env=env, capture_output=True,
                          text=True, timeout=120)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "duplex", tmp_path / "duplex", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / ".importlinter", tmp_path / ".importlinter")
    return tmp_path


def test_the_tree_keeps_its_contracts(tree: Path) -> None:
    result = _lint(tree)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "broken" not in result.stdout.lower().replace("0 broken", "")


@pytest.mark.parametrize(("module", "source", "contract"), [
    ("duplex/runtime/_violation.py", "import duplex.models.registry\n",
     "Only the server room knows the model families"),
    ("duplex/session/_violation.py", "from duplex.edge import webrtc\n",
     "Rooms: cli -> server -> edge -> session -> runtime -> config"),
    ("duplex/models/toy/_violation.py", "from duplex.runtime.coordinator import Coordinator\n",
     "Model families import only the runtime's public contract"),
    ("duplex/edge/_violation.py", "from duplex.runtime import coordinator\n",
     "The edge knows transports and the session, never the runtime itself"),
    ("duplex/edge/webrtc/_violation.py", "from duplex.runtime.contract import CallerAudio\n",
     "The edge knows transports and the session, never the runtime itself"),
    ("duplex/edge/sip/_violation.py", "from duplex.edge.twilio import stream\n",
     "Edge rooms: the front over the doors, doors apart, shared parts below"),
    ("duplex/edge/media/_violation.py", "from duplex.edge.phone import bridge\n",
     "Edge rooms: the front over the doors, doors apart, shared parts below"),
    ("duplex/edge/media/_violation.py", "from duplex.session.realtime import events\n",
     "The shared media and rate limits know no session and no runtime"),
    ("duplex/session/turns.py", "from duplex.session.realtime import events\n",
     "The conversation core knows no Realtime wire event"),
    ("duplex/edge/door/__init__.py", "",
     "Edge rooms: the front over the doors, doors apart, shared parts below"),
])
def test_a_violation_breaks_its_contract(tree: Path, module: str, source: str, contract: str) -> None:
    (tree / module).parent.mkdir(exist_ok=True)
    (tree / module).write_text(source)
    result = _lint(tree)
    assert result.returncode != 0
    broken = [line for line in result.stdout.splitlines() if "BROKEN" in line]
    assert any(contract in line for line in broken), result.stdout


@pytest.mark.parametrize("package", ["duplex/config", "tools/duplex_tools/bench"])
def test_an_import_cycle_is_found(tree: Path, package: str) -> None:
    shutil.copytree(ROOT / "scripts", tree / "scripts")
    shutil.copytree(ROOT / "tools" / "duplex_tools", tree / "tools" / "duplex_tools",
                    ignore=shutil.ignore_patterns("__pycache__"))
    clean = subprocess.run([sys.executable, str(tree / "scripts" / "import_cycles.py")], capture_output=True,
                           text=True, timeout=60)
    assert clean.returncode == 0, clean.stdout
    dotted = package.removeprefix("tools/").replace("/", ".")
    (tree / package / "_a.py").write_text(f"def f():\n    from {dotted} import _b\n")
    (tree / package / "_b.py").write_text(f"from {dotted} import _a\n")
    cyclic = subprocess.run([sys.executable, str(tree / "scripts" / "import_cycles.py")], capture_output=True,
                            text=True, timeout=60)
    assert cyclic.returncode == 1
    assert f"{dotted}._a <-> {dotted}._b" in cyclic.stdout
