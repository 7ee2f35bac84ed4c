"""The corpus played end to end through a door (``duplex bench turn-taking --corpus PART --door
webrtc``): a stratified, seeded sample, and corpus clips played by a real aiortc peer against a
real `duplex serve --config toy-voice` (its reply is the same fixed sentence on any CPU, long
enough to be interrupted; its turns end by silence; its barge-in listens), judged as the
in-process evaluation judges them."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from duplex_tools.bench import turn_door as door
from duplex_tools.bench import turn_door_report as door_report
from duplex_tools.bench import turn_door_sip as door_sip
from duplex_tools.harness import ServerProcess, server_stats
from duplex_tools.turn_corpus import spec
from duplex_tools.turn_corpus.render import render

ROOT = Path(__file__).resolve().parents[1]
SPEAKER = spec.SPEAKERS[0]  # an espeak-ng voice with no pitch shift: made without sox or Piper
assert SPEAKER.synth == "espeak" and not SPEAKER.shift_cents


def test_the_sample_is_stratified_seeded_and_spreads_under_a_limit():
    clips = door.sample("held-out", 2, seed=7)
    cells = Counter((c.category, c.variant, door.CONDITION_CLASSES[c.condition]) for c in clips)
    variants = sum(len(spec.variants(c)) for c in door.CATEGORIES)
    assert len(cells) == variants * 4 and set(cells.values()) == {2}  # every (variant, condition class) twice
    assert {c.speaker.part for c in clips} == {"held-out"}
    assert clips == door.sample("held-out", 2, seed=7) and clips != door.sample("held-out", 2, seed=8)
    first = clips[:len(cells)]  # every cell's first call before any cell's second
    assert len({(c.category, c.variant, door.CONDITION_CLASSES[c.condition]) for c in first}) == len(cells)
    # the two calls of a cell are different clips
    assert len(set(clips)) == len(clips)


def test_a_complete_turn_is_played_both_ways_alternating_and_compared_clip_by_clip(tmp_path: Path):
    turns = [spec.Clip("smooth", v, "clean", SPEAKER) for v in ("yes", "thanks", "price")]
    pause = spec.Clip("pause", "after a", "clean", SPEAKER)
    played = door.ways_of([turns[0], pause, turns[1], turns[2]])
    assert [(c.variant, t) for c, t in played] == [
        ("yes", "default"), ("yes", "silence"), ("after a", "default"),
        ("thanks", "silence"), ("thanks", "default"), ("price", "default"), ("price", "silence")]
    silence = door.scenario_of(turns[0], render(tmp_path, turns[0]), tmp_path / "s", turns="silence")
    own = door.scenario_of(turns[0], render(tmp_path, turns[0]), tmp_path / "o")
    assert silence.session == {"turn_detection": {"type": "server_vad"}} and own.session is None
    assert [s.expect.reply for s in own.steps] == [True]  # the turn alone, answered

    def call(clip, turns, answer_ms):
        return door.DoorCall(clip, answer_ms is not None, answer_ms=answer_ms, turns=turns)
    calls = [call(turns[0], "default", 300.0), call(turns[0], "silence", 700.0),
             call(turns[1], "default", 900.0), call(turns[1], "silence", 600.0),
             call(turns[2], "default", None), call(turns[2], "silence", 650.0)]  # one not answered
    versus = door_report.versus_silence(calls)
    assert versus["answered"] == {"default": "2/3", "silence": "3/3"}
    assert versus["paired_ms"]["n"] == 2 and versus["paired_ms"]["p50"] == pytest.approx(-50.0)  # -400, +300
    assert versus["by_variant"]["thanks"] == {"default": 900.0, "silence": 600.0}
    # the categories' rates count the server's own way only: the silence calls are the baseline
    report = door_report.summary(calls, "webrtc")
    assert report["categories"]["smooth"]["calls"] == 3 and report["categories"]["smooth"]["take_overs"] == 2


@pytest.fixture(scope="module")
def server():
    with ServerProcess(["--config", "toy-voice", "--port", "0", "--ice-loopback", "--sip", "127.0.0.1:0"],
                       cwd=str(ROOT)) as proc:
        proc.sip = door_sip.sip_edge_of(proc.output)
        assert proc.sip is not None, "".join(proc.output)
        yield proc
    assert proc.stop() == 0, "".join(proc.output[-30:])


def needs_a_server(test):
    marks = (pytest.mark.slow, pytest.mark.timeout(180), pytest.mark.usefixtures("loopback_candidates"),
             pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng is not installed"))
    for mark in marks:
        test = mark(test)
    return test


@needs_a_server
def test_corpus_clips_play_end_to_end_through_webrtc(server, tmp_path: Path):
    clips = [spec.Clip("interruption", "ask else", "clean", SPEAKER),
             spec.Clip("backchannel", "uh-huh", "clean", SPEAKER),
             spec.Clip("pause", "after a", "clean", SPEAKER),
             spec.Clip("smooth", "toppings", "clean", SPEAKER)]
    calls = asyncio.run(door.play(server.url, clips, tmp_path / "cache", voice="en-us"))
    stats = server_stats(server.url)
    judged = {c.clip.category: c for c in calls if c.turns == "default"}
    assert [c.void for c in calls] == [None] * 5, [c.void for c in calls]
    interruption = judged["interruption"]
    assert interruption.takeover is True  # the reply was cut ...
    assert interruption.stop_ms is not None and interruption.stop_ms < 1000  # ... and went silent at the client
    assert interruption.answer_ms is not None  # and the interruption was answered
    assert judged["backchannel"].takeover is False  # the reply played on through "uh-huh"
    # toy-voice's turns end after 500 ms of silence: the clip's 1.2 s pause ended the turn before
    # the caller went on (the door sees a take-over where the in-process silence rule does)
    assert judged["pause"].takeover is True and judged["pause"].answer_ms is not None
    # the complete turn was answered both ways, each answer heard after the caller's speech ended
    [own, silence] = [c for c in calls if c.clip.category == "smooth"]
    assert (own.turns, silence.turns) == ("default", "silence")
    assert own.takeover is True and silence.takeover is True
    assert own.answer_ms is not None and own.answer_ms > 0 and silence.answer_ms is not None and silence.answer_ms > 0
    assert all(c.left_nothing for c in calls)
    assert stats["sessions"]["live"] == 0  # every call hung up, no session leaked
    report = json.loads(json.dumps(door_report.summary(calls, "webrtc (toy-voice)")))
    assert list(report["categories"]) == ["pause", "backchannel", "interruption", "smooth"]
    assert report["turns_versus_silence"]["paired_ms"]["n"] == 1
    assert report["categories"]["interruption"]["rate"] == 1.0
    assert report["categories"]["backchannel"]["by_class"]["clean"] == 0.0
    assert report["left_state_behind"] == 0


@needs_a_server
def test_the_command_plays_its_sample_and_writes_its_report(server, tmp_path: Path):
    out = tmp_path / "door.json"
    run = subprocess.run([sys.executable, "-m", "duplex.cli", "bench", "turn-taking", "--corpus", "dev", "--door",
                          "webrtc", "--url", server.url, "--categories", "noise", "--limit", "1", "--voice", "en-us",
                          "--cache", str(tmp_path / "cache"), "--json", str(out), "--plot", str(tmp_path / "heat.png")],
                         cwd=ROOT, capture_output=True, text=True, timeout=150)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "call 1/1" in run.stderr and "take-over rate" in run.stdout
    report = json.loads(out.read_text())
    [call] = report["calls"]
    assert call["category"] == "noise" and call["speaker"] in {s.name for s in spec.speakers_of("dev")}
    assert call["void"] is None and call["left_nothing"] is True
    assert report["categories"]["noise"]["calls"] == 1 and report["left_state_behind"] == 0
    assert (tmp_path / "heat.png").read_bytes()[:4] == b"\x89PNG"


@needs_a_server
@pytest.mark.skipif(shutil.which("sipp") is None, reason="sipp (sip-tester) is not installed")
def test_corpus_clips_play_end_to_end_through_sip(server, tmp_path: Path):
    clips = [spec.Clip("interruption", "ask else", "clean", SPEAKER),
             spec.Clip("backchannel", "uh-huh", "clean", SPEAKER)]
    before = asyncio.run(door_sip.verdicts(server.url))
    calls = asyncio.run(door_sip.play(server.sip, server.url, clips, tmp_path / "cache", voice="en-us"))
    after = asyncio.run(door_sip.verdicts(server.url))
    assert [c.void for c in calls] == [None, None], [c.void for c in calls]
    interruption, backchannel = calls
    pause_clip = spec.Clip("pause", "after a", "clean", SPEAKER)
    [pause] = asyncio.run(door_sip.play(server.sip, server.url, [pause_clip], tmp_path / "cache", voice="en-us"))
    # toy-voice's turns end after 500 ms of silence: the 1.2 s pause ended the turn, and the phone
    # heard the agent before the caller went on
    assert pause.void is None and pause.takeover is True and pause.answer_ms is None and pause.left_nothing
    turn_clip = spec.Clip("smooth", "toppings", "clean", SPEAKER)
    [turn] = asyncio.run(door_sip.play(server.sip, server.url, [turn_clip], tmp_path / "cache", voice="en-us"))
    # a complete turn: answered, heard at the phone after the caller's speech ended
    assert turn.void is None and turn.takeover is True and turn.turns == "default" and turn.left_nothing
    assert turn.answer_ms is not None and turn.answer_ms > 0
    # the server counted what a phone cannot be told: one interruption, and the sounds it let go
    assert after.get("interruption", 0) - before.get("interruption", 0) == 1
    assert sum(after.values()) - sum(before.values()) >= 2
    assert interruption.takeover is True and backchannel.takeover is False
    # the agent's audio at the phone went quiet while the caller was still speaking
    clip = render(tmp_path / "cache", clips[0])
    assert interruption.stop_ms is not None and 0 < interruption.stop_ms < 1000 * (clip.end - clip.start) / door.RATE
    assert all(c.left_nothing for c in calls)
    stats = server_stats(server.url)
    assert stats["sessions"]["live"] == 0 and stats["edges"]["sip"]["calls"] == 0


@needs_a_server
@pytest.mark.skipif(shutil.which("sipp") is None, reason="sipp (sip-tester) is not installed")
def test_a_pause_shorter_than_the_turns_silence_is_held_on_the_phone_and_the_sentence_answered(tmp_path: Path):
    clip = spec.Clip("pause", "after a", "clean", SPEAKER)
    rendered = render(tmp_path / "cache", clip)
    pause_ms = 1000 * (door.resume_sample(rendered) - rendered.pause_at) / door.RATE
    silence_ms = int(pause_ms) + 800  # the pause does not end a turn; the sentence's end does
    with ServerProcess(["--config", "toy-voice", "--port", "0", "--sip", "127.0.0.1:0",
                        "--session.vad.silence_ms", str(silence_ms)], cwd=str(ROOT)) as proc:
        sip = door_sip.sip_edge_of(proc.output)
        assert sip is not None, "".join(proc.output)
        [call] = asyncio.run(door_sip.play(sip, proc.url, [clip], tmp_path / "cache", voice="en-us"))
    assert call.void is None and call.takeover is False, call
    # answered after the sentence's end, once its silence (longer than the pause) ended the turn
    assert call.answer_ms is not None and call.answer_ms > pause_ms, (call.answer_ms, pause_ms)
    assert call.left_nothing


@needs_a_server
@pytest.mark.skipif(shutil.which("sipp") is None, reason="sipp (sip-tester) is not installed")
def test_over_the_phone_a_complete_turn_is_played_again_on_a_server_that_ends_turns_on_silence(tmp_path: Path):
    out = tmp_path / "sip.json"
    run = subprocess.run([sys.executable, "-m", "duplex.cli", "bench", "turn-taking", "--corpus", "dev", "--door",
                          "sip", "--config", "toy-voice", "--categories", "smooth", "--limit", "1", "--voice", "en-us",
                          "--cache", str(tmp_path / "cache"), "--json", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=170)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "--session.turn_detection server_vad" in run.stderr  # the second server, started for the baseline
    report = json.loads(out.read_text())
    own, silence = report["calls"]
    assert (own["turns"], silence["turns"]) == ("default", "silence")
    assert own["speaker"] == silence["speaker"] and own["variant"] == silence["variant"]  # the same clip twice
    assert all(c["void"] is None and c["answer_ms"] > 0 and c["left_nothing"] for c in report["calls"])
    assert report["turns_versus_silence"]["paired_ms"]["n"] == 1


def test_the_door_refuses_an_unknown_category_and_a_phone_server_without_its_sip_address(tmp_path: Path):
    for extra, said in ((["--categories", "question"], "unknown ['question']"),
                        (["--url", "http://127.0.0.1:9"], "needs --sip-address")):
        run = subprocess.run([sys.executable, "-m", "duplex.cli", "bench", "turn-taking", "--corpus", "dev",
                              "--door", "sip", "--cache", str(tmp_path), *extra],
                             cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert run.returncode != 0 and said in run.stdout + run.stderr, run.stdout + run.stderr
