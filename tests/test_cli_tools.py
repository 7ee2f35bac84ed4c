"""`duplex bench` and `duplex scenario` come from the separate duplex-tools package, found through
its entry points (group ``duplex.commands``): with it they run; without it they say how to install
it instead of failing with a traceback. The product imports no tools module."""

import ast
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from duplex.cli import build_parser, main


@pytest.mark.parametrize("argv", [["bench", "relay", "--iterations", "5"], ["scenario", "run", "--help"]])
def test_without_the_tools_the_commands_say_how_to_install_them(argv, monkeypatch, capsys):
    # as if duplex-tools were not installed: its submodules too, which an earlier test may have imported
    # (an import finds "duplex_tools.cli" in sys.modules without looking at its parent)
    for name in [name for name in sys.modules if name == "duplex_tools" or name.startswith("duplex_tools.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "duplex_tools", None)
    assert main(argv) == 2
    assert "pip install -e tools" in capsys.readouterr().err


def test_with_the_tools_the_commands_are_theirs():
    parser = build_parser()
    assert parser.parse_args(["bench", "relay"]).func.__module__ == "duplex_tools.bench.relay"
    assert parser.parse_args(["scenario", "run", "--url", "http://x"]).func.__module__ == "duplex_tools.scenario.cli"


def test_the_tools_declare_their_commands_as_entry_points():
    declared = {point.name: point.value for point in entry_points(group="duplex.commands")}
    assert declared == {"bench": "duplex_tools.cli:add_bench", "scenario": "duplex_tools.cli:add_scenario"}


def test_the_product_imports_no_tools_module():
    package = Path(__file__).resolve().parents[1] / "duplex"
    found = []
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{path.relative_to(package)}: {name}" for name in names if name.startswith("duplex_tools")]
    assert found == []
