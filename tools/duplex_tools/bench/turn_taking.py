"""`duplex bench turn-taking`: turn-taking in the shape of Full-Duplex-Bench v1, per category,
several ways side by side against one server, in one run: semantic end of turn
(``turn_detection: semantic_vad``) with barge-in that listens, the silence rule (``server_vad``)
with barge-in that listens, and the first wave's silence rule with "any onset interrupts"
(``onset``); ``default`` is what a client that asks for nothing gets (the pipeline's defaults).
Every mode is played in each round, one after another, so a machine busier at one time weighs on
every mode alike.

Categories, each a scenario made here and played over WebRTC (Piper or espeak-ng speech, noise
made at run time) ``--rounds`` times per mode:

- ``pause``: the caller pauses 1.2 s mid-sentence (plainly, or after "um,"); a take-over is a
  reply in that pause (Piper reads the whole sentence, cut at the pause: ``Step.goes_on``);
- ``backchannel``: "uh-huh", "yeah", "okay", "mm-hmm" while the agent talks; a take-over is
  the agent yielding (its reply cut);
- ``noise``: a cough and a knock-like burst while the agent talks; same take-over;
- ``interruption``: a real interruption; the agent must yield and answer it.

``--corpus PART`` judges the synthetic corpus of many voices instead, in process
(``duplex_tools.turn_corpus``); ``--train`` trains the learned decisions from it; with ``--door
webrtc`` a stratified sample of it is played end to end, call by call (``turn_door.py``).

Latencies: end of speech -> first agent audio (every answered question), onset -> agent silent
(interruptions), interruption -> its answer, and a false onset's end -> the agent heard again.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from duplex.config.loader import load_pipeline
from duplex.edge.webrtc.rtc_options import use_loopback_candidates
from duplex_tools.bench.server_parts import Totals, add_parts, mean_parts_ms, read_parts
from duplex_tools.bench.turn_door_cli import add_arguments as add_door_arguments
from duplex_tools.bench.turn_door_cli import run_door
from duplex_tools.harness import ServerProcess
from duplex_tools.report import percentile, table, write_json
from duplex_tools.scenario.measure import ScenarioResult, measure
from duplex_tools.scenario.model import PIPER, Scenario
from duplex_tools.scenario.runner import run_scenario
from duplex_tools.turn_corpus.bench import add_arguments, run_corpus

Settings = dict[str, Any]  # a mode's session settings (JSON, as session.update sends them)
SILENCE = {"type": "server_vad"}  # asked for by name: the bundled pipelines' sessions default to semantic_vad
MODES = {"semantic + listen": {"turn_detection": {"type": "semantic_vad"}, "barge_in": {"mode": "listen"}},
         "silence + listen": {"turn_detection": SILENCE, "barge_in": {"mode": "listen"}},
         "silence + onset (first wave)": {"turn_detection": SILENCE, "barge_in": {"mode": "onset"}}}
MODE_KEYS = {"semantic": "semantic + listen", "silence": "silence + listen", "onset": "silence + onset (first wave)"}
DEFAULT = "default"  # --modes key: no session settings sent, the pipeline's own defaults
EARLY = "semantic-early"  # --modes key: semantic turns that speculate at --speculate-ms, before the judgement
MENU_QUESTION = "Could you tell me a little about your menu today?"
QUESTION = {"say": MENU_QUESTION, "expect": {"reply": True}}
# the ``question`` category (on request): questions alone, for end of speech -> first audio
QUESTIONS = (MENU_QUESTION, "What toppings do you have?", "How much is a regular mango tea?")
CATEGORIES = ("pause", "backchannel", "noise", "interruption", "question")
# a pause mid-sentence: plainly, and trailing off in a filler (as people pause to think)
PAUSES = (("I would like to order a large", "mango tea with pearls please."),
          ("I would like to order a large, um,", "mango tea with pearls please."))
OVERLAP_AT = {"agent_heard_s": 1.0}
BACKCHANNELS = ("uh-huh", "yeah", "okay", "mm-hmm")
NOISES = ({"noise": 0.3, "noise_kind": "cough"}, {"noise": 0.15, "noise_kind": "white"})
INTERRUPTIONS = ("Sorry, can I ask something else instead", "Wait, actually I want a different drink")


def _scenario(name: str, steps: list[dict], session: Settings, voice: str) -> Scenario:
    steps = [{**step, "voice": voice} if "say" in step else step for step in steps]
    return Scenario.model_validate({"name": name, "steps": steps, "session": session or None,  # {}: send none
                                    "expect": {"max_false_interruptions": None}})


def scenarios(session: Settings, voice: str) -> list[tuple[str, Scenario]]:
    """(category, scenario) for one mode; every "say" in ``voice``."""
    # Piper reads the sentence whole and it is cut at the pause (goes_on): read alone, "I would
    # like to order a large" ends falling, as a finished sentence does (Smart Turn: 0.94 complete;
    # cut from the whole sentence 0.11, and Whisper writes it "... a large...").
    goes_on = {"goes_on": True} if voice == PIPER else {}
    made = [("pause", _scenario("pause", [{"say": first, **goes_on, "expect": {"reply": False}}, {"pause": 1.2},
                                          {"say": rest, "expect": {"reply": True}}], session, voice))
            for first, rest in PAUSES]
    for word in BACKCHANNELS:
        made.append(("backchannel", _scenario(f"backchannel {word}", [
            QUESTION, {"say": word, "at": OVERLAP_AT, "expect": {"interrupts": False}}], session, voice)))
    for noise in NOISES:
        made.append(("noise", _scenario(f"noise {noise['noise_kind']}", [
            QUESTION, {**noise, "at": OVERLAP_AT, "expect": {"interrupts": False}}], session, voice)))
    for text in INTERRUPTIONS:
        made.append(("interruption", _scenario("interruption", [
            QUESTION, {"say": text, "at": OVERLAP_AT, "expect": {"interrupts": True, "reply": True}}], session, voice)))
    for text in QUESTIONS:
        made.append(("question", _scenario("question", [{"say": text, "expect": {"reply": True}}], session, voice)))
    return made


def modes(keys: list[str], speculate_ms: int, default_name: str = DEFAULT) -> dict[str, Settings]:
    """The modes ``--modes`` names, by their report names, in the order given (``default_name``:
    the report's name for the pipeline's defaults)."""
    chosen: dict[str, Settings] = {}
    for key in keys:
        if key == DEFAULT:
            chosen[default_name] = {}
        elif key == EARLY:
            detection = {"type": "semantic_vad", "speculate_ms": speculate_ms}
            chosen[f"semantic, speculate at {speculate_ms} ms + listen"] = {"turn_detection": detection,
                                                                             "barge_in": {"mode": "listen"}}
        elif key in MODE_KEYS:
            chosen[MODE_KEYS[key]] = MODES[MODE_KEYS[key]]
        else:
            raise SystemExit(f"--modes: unknown mode {key!r} (known: {', '.join([*MODE_KEYS, EARLY, DEFAULT])})")
    return chosen


@dataclass
class Category:
    trials: int = 0
    take_overs: int = 0
    failed: int = 0
    ttfb_ms: list[float] = field(default_factory=list)  # end of speech -> first agent audio
    stop_ms: list[float] = field(default_factory=list)  # interruption onset -> agent silent
    answer_ms: list[float] = field(default_factory=list)  # interruption's end -> its answer heard
    resume_ms: list[float] = field(default_factory=list)  # a false onset's end -> agent heard again

    def add(self, category: str, result: ScenarioResult) -> None:
        if result.error:
            self.failed += 1
            return
        first, last = result.steps[0], result.steps[-1]
        self.trials += 1
        if first.ttfb_ms is not None and category != "pause":
            self.ttfb_ms.append(first.ttfb_ms)
        if category == "question":
            self.take_overs += first.ttfb_ms is not None  # here a take-over is the answer
        elif category == "pause":
            self.take_overs += bool(first.took_over)
            if last.ttfb_ms is not None:
                self.ttfb_ms.append(last.ttfb_ms)
        elif category == "interruption":
            answered = last.cut_response is not None and last.ttfb_ms is not None
            self.take_overs += answered  # here a take-over is what should happen
            if last.stop_ms is not None:
                self.stop_ms.append(last.stop_ms)
            if last.ttfb_ms is not None:
                self.answer_ms.append(last.ttfb_ms)
        else:
            self.take_overs += bool(last.took_over)
            if last.resume_ms is not None:
                self.resume_ms.append(last.resume_ms)

    def summary(self) -> dict:
        def spread(values: list[float]) -> dict:
            return {"n": len(values), "p50": percentile(values, 50), "p95": percentile(values, 95)}
        return {"trials": self.trials, "failed": self.failed, "take_overs": self.take_overs,
                "rate": self.take_overs / self.trials if self.trials else None,
                "ttfb_ms": spread(self.ttfb_ms), "stop_ms": spread(self.stop_ms),
                "answer_ms": spread(self.answer_ms), "resume_ms": spread(self.resume_ms)}


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("turn-taking", help="take-over rates and latencies per turn-taking category, "
                                                "barge-in that listens vs any onset interrupts")
    parser.add_argument("--config", help="pipeline to serve (default: toy-voice; with --corpus --door: local, "
                                          "the real one)")
    parser.add_argument("--rounds", type=int, default=3, help="times each scenario is played per mode")
    parser.add_argument("--voice", default=PIPER, help="the caller's voice: piper (default; the local "
                        "pipeline's Piper voice) or an espeak-ng voice such as en-us")
    parser.add_argument("--modes", default="semantic,silence,onset",
                        help=f"modes side by side, comma-separated: semantic, silence, onset, {EARLY} "
                             f"(semantic turns speculating at --speculate-ms), {DEFAULT} (no session settings "
                             "sent: the pipeline's own); default semantic,silence,onset")
    parser.add_argument("--speculate-ms", type=int, default=100,
                        help=f"the {EARLY} mode's speculation pause (default 100; the judgement stays at 200)")
    parser.add_argument("--categories", default="pause,backchannel,noise,interruption",
                        help=f"categories to play, comma-separated, of {', '.join(CATEGORIES)} "
                             "(question: three questions alone, for the time to first audio)")
    parser.add_argument("--json", dest="json_path", help="write results here")
    parser.add_argument("--plot", help="write a PNG of the take-over rates and latencies here (with --corpus: "
                                       "a heat map of take-overs by variant x condition)")
    add_arguments(parser)
    add_door_arguments(parser)
    parser.set_defaults(func=run, takes_overrides=False)


def _default_name(config: str) -> str:
    """The report's name of the ``default`` mode: the turn detection the pipeline's sessions start with."""
    detection = load_pipeline(config).session.turn_detection
    return f"{DEFAULT} ({detection})"


def _categories(value: str) -> list[str]:
    chosen = [c for c in value.split(",") if c]
    unknown = [c for c in chosen if c not in CATEGORIES]
    if unknown or not chosen:
        raise SystemExit(f"--categories: unknown {unknown or value!r} (known: {', '.join(CATEGORIES)})")
    return chosen


async def _measure(url: str, rounds: int, voice: str, chosen_modes: dict[str, Settings], categories_played: list[str],
                   parts: dict[str, dict[str, float] | None]) -> dict[str, dict[str, Category]]:
    """Each mode's categories, the modes taking turns round by round; ``parts`` gets each mode's
    server-side mean per part of time to first audio."""
    results: dict[str, dict[str, Category]] = {mode: {} for mode in chosen_modes}
    totals: dict[str, Totals | None] = {mode: {} for mode in chosen_modes}  # the parts' sums over a mode's turns
    for round_ in range(rounds):
        for mode, session in chosen_modes.items():
            before = await read_parts(url)
            made = [(c, scenario) for c, scenario in scenarios(session, voice) if c in categories_played]
            for n, (category, scenario) in enumerate(made, 1):
                recording = await run_scenario(scenario, url, exclusive=True)
                result = measure(scenario, recording)
                results[mode].setdefault(category, Category()).add(category, result)
                failed = f": failed: {result.error}" if result.error else ""
                print(f"  {mode}: round {round_ + 1}/{rounds}, scenario {n}/{len(made)} ({scenario.name}){failed}",
                      file=sys.stderr, flush=True)
            totals[mode] = add_parts(totals[mode], before, await read_parts(url))
    for mode, summed in totals.items():
        parts[mode] = mean_parts_ms({}, summed) if summed is not None else None
    return results


def run(args: argparse.Namespace, overrides: list[str]) -> int:
    if args.background_s < 0 or (args.background_s and args.corpus is None):
        raise SystemExit("--background-s takes seconds >= 0 and judges a --corpus part in process")
    if args.door is not None and args.background_s:
        raise SystemExit("--background-s is in process only: a door plays each clip as it was rendered")
    if args.door is not None:
        return run_door(args)
    if args.corpus is not None or args.train:
        return run_corpus(args)
    args.config = args.config or "toy-voice"
    chosen_modes = modes([m for m in args.modes.split(",") if m], args.speculate_ms, _default_name(args.config))
    categories_played = _categories(args.categories)
    use_loopback_candidates(True)
    print(f"starting `duplex serve --config {args.config}` ...", file=sys.stderr, flush=True)
    with ServerProcess(["--config", args.config, "--port", "0", "--ice-loopback"]) as server:
        assert server.url is not None  # set once the server is ready, before the block runs
        parts: dict[str, dict[str, float] | None] = {}
        measured = asyncio.run(_measure(server.url, args.rounds, args.voice, chosen_modes, categories_played, parts))
        if any(cat.failed for cats in measured.values() for cat in cats.values()):
            print("a scenario failed; the server's last lines:\n" + "".join(server.output[-40:]), file=sys.stderr)
    report = {"config": args.config, "rounds": args.rounds, "voice": args.voice,
              "modes": {mode: {c: cat.summary() for c, cat in cats.items()} for mode, cats in measured.items()},
              "server_parts_ms": parts}  # per mode: the server's mean per part of time to first audio
    rows = []
    for mode, cats in report["modes"].items():
        for category, s in cats.items():
            rows.append([mode, category, f"{s['take_overs']}/{s['trials']}", s["failed"], s["ttfb_ms"]["p50"],
                         s["stop_ms"]["p95"], s["answer_ms"]["p50"], s["resume_ms"]["p50"], s["resume_ms"]["p95"]])
    print(table(["mode", "category", "take-overs", "failed", "ttfb p50 ms", "stop p95 ms", "answer p50 ms",
                 "resume p50 ms", "resume p95 ms"], rows))
    print("take-over: pause/backchannel/noise = the agent took the floor (lower is better); question = answered; "
          "interruption = it yielded and answered (higher is better)")
    for mode, means in parts.items():
        if means:
            print(f"{mode}: the server's mean time to first audio by part (ms): "
                  + ", ".join(f"{part} {ms:.0f}" for part, ms in means.items()))
    write_json(args.json_path, report)
    if args.plot:
        from duplex_tools.bench.turn_taking_plot import plot
        plot(report, Path(args.plot))
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0
