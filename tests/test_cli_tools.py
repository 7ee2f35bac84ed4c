"""`duplex bench` and `duplex scenario` come from the separate duplex-tools package: with it they
run; without it they say how to install it instead of failing with a traceback."""

import sys

import pytest

from duplex.cli import build_parser, main


@pytest.mark.parametrize("argv", [["bench", "relay", "--iterations", "5"], ["scenario", "run", "--help"]])
def test_without_the_tools_the_commands_say_how_to_install_them(argv, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "duplex_tools", None)  # as if duplex-tools were not installed
    assert main(argv) == 2
    assert "pip install -e tools" in capsys.readouterr().err


def test_with_the_tools_the_commands_are_theirs():
    parser = build_parser()
    assert parser.parse_args(["bench", "relay"]).func.__module__ == "duplex_tools.bench.relay"
    assert parser.parse_args(["scenario", "run", "--url", "http://x"]).func.__module__ == "duplex_tools.scenario.cli"
