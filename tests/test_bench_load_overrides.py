"""`duplex bench load` takes dotted overrides for the pipeline it serves (`--serve local
--asr.min_window_s 7`: the load bench page's before/after runs use them) and refuses them against a server
it does not start."""

from __future__ import annotations

from duplex.cli import main


def test_overrides_need_a_served_pipeline(capsys):
    code = main(["bench", "load", "--url", "http://127.0.0.1:9", "--sessions", "1", "--asr.min_window_s", "7"])
    assert code == 2
    assert "--asr.min_window_s 7" in capsys.readouterr().err



def test_versus_needs_a_served_pipeline(capsys):
    code = main(["bench", "load", "--url", "http://127.0.0.1:9", "--sessions", "1", "--versus", "--media-workers 2"])
    assert code == 2
    assert "--versus" in capsys.readouterr().err
