"""The import graph between rooms (scripts/import_graph.py) holds, and a wrong-way arrow or a cycle
between rooms fails it: planted in a copy of the tree, so the tree under test is untouched."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "duplex", tmp_path / "duplex", ignore=ignore)
    shutil.copytree(ROOT / "tools" / "duplex_tools", tmp_path / "tools" / "duplex_tools", ignore=ignore)
    shutil.copytree(ROOT / "scripts", tmp_path / "scripts", ignore=ignore)
    shutil.copy(ROOT / ".importlinter", tmp_path / ".importlinter")
    return tmp_path


def _graph(tree: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(tree / "scripts" / "import_graph.py")], capture_output=True,
                          text=True, timeout=60)


def test_the_rooms_point_one_way(tree: Path) -> None:
    result = _graph(tree)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 cycles, 0 wrong-way" in result.stdout


@pytest.mark.parametrize(("module", "source", "said"), [
    ("duplex/session/realtime/_violation.py", "def f():\n    from duplex.session.manager import SessionManager\n",
     "wrong way: duplex.session.realtime -> duplex.session "),
    ("tools/duplex_tools/scenario/_violation.py", "from duplex_tools.bench import load\n",
     "cycle between rooms: duplex_tools.bench <-> duplex_tools.scenario"),
    ("duplex/edge/media/_violation.py", "from duplex.edge.sip import sdp\n",
     "wrong way: duplex.edge.media -> duplex.edge.sip "),
    ("duplex/models/toy/_violation.py", "from duplex.models.local import stages\n",
     "wrong way: duplex.models.toy -> duplex.models.local "),
])
def test_a_wrong_arrow_fails(tree: Path, module: str, source: str, said: str) -> None:
    (tree / module).write_text(source)
    result = _graph(tree)
    assert result.returncode == 1
    assert said in result.stdout, result.stdout
