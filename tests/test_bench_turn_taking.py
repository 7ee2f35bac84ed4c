"""`duplex bench turn-taking`'s modes: the silence modes ask for ``server_vad`` by name (the bundled
voice pipelines' sessions start semantic), ``default`` asks for nothing and is named after what
the pipeline's sessions start with, and each mode's server-side parts add up over its blocks; a
background heard before each clip is asked only of the corpus in process."""

from __future__ import annotations

import pytest

from duplex.cli import main
from duplex_tools.bench.server_parts import add_parts, mean_parts_ms
from duplex_tools.bench.turn_taking import _default_name, modes, scenarios


def test_the_silence_modes_ask_for_silence_and_the_default_asks_for_nothing():
    chosen = modes(["default", "silence", "onset", "semantic"], 100, _default_name("local"))
    assert list(chosen) == ["default (semantic_vad)", "silence + listen", "silence + onset (first wave)",
                            "semantic + listen"]
    assert chosen["default (semantic_vad)"] == {}
    assert chosen["silence + listen"]["turn_detection"] == {"type": "server_vad"}
    assert chosen["silence + onset (first wave)"]["turn_detection"] == {"type": "server_vad"}
    assert chosen["semantic + listen"]["turn_detection"] == {"type": "semantic_vad"}
    assert _default_name("toy-voice") == "default (server_vad)"
    # the default mode's caller sends its offer alone, as a client that asks for nothing does
    assert {s.session is None for _, s in scenarios(chosen["default (semantic_vad)"], "piper")} == {True}
    assert {s.session["turn_detection"]["type"] for _, s in scenarios(chosen["silence + listen"], "piper")} \
        == {"server_vad"}


def test_a_modes_parts_add_up_over_its_blocks():
    # two blocks of one mode, with another mode's turns between them (counted in neither read pair)
    first = add_parts({}, {"asr_tail": (1.0, 2.0)}, {"asr_tail": (1.3, 4.0)})  # 2 turns, 0.3 s
    summed = add_parts(first, {"asr_tail": (2.0, 6.0)}, {"asr_tail": (2.5, 7.0), "playout": (0.01, 1.0)})
    assert summed is not None
    assert mean_parts_ms({}, summed) == {"asr_tail": round(1000 * 0.8 / 3, 1), "playout": 10.0}
    assert add_parts(summed, None, {"asr_tail": (3.0, 8.0)}) is None  # a server without metrics


@pytest.mark.parametrize(("args", "says"), [
    (["--corpus", "held-out", "--door", "webrtc", "--background-s", "8"], "in process only"),
    (["--corpus", "dev", "--background-s", "-1"], "seconds >= 0"),
    (["--background-s", "8"], "--corpus"),
])
def test_a_background_before_the_clip_is_asked_only_of_a_corpus_in_process(args, says):
    with pytest.raises(SystemExit, match=says):
        main(["bench", "turn-taking", *args])
