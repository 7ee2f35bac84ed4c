"""The numbers of the corpus played through a door (``turn_door.py``): take-over rates per
category (with counts and the calls that said nothing), latencies p50/p95, the breakdowns by
condition class, condition and variant (``report.summary``, the in-process report's own), and its
heat map; for complete turns, the server's own turn detection beside silence-ended turns."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from duplex_tools.bench.turn_door import CATEGORIES, CONDITION_CLASSES, DEFAULT_TURNS, SILENCE_TURNS, DoorCall
from duplex_tools.report import percentile, table
from duplex_tools.turn_corpus import report as corpus_report
from duplex_tools.turn_corpus.evaluate import Outcome

LATENCY = {"pause": "end of speech -> answer", "interruption": "onset -> agent silent",
           "smooth": "end of speech -> answer"}


def outcomes(calls: list[DoorCall], way: str) -> list[Outcome]:
    """The calls that said something, as the in-process evaluation's outcomes (one way: the door,
    with the server's own turn detection; silence-ended turns are only the complete turns' baseline)."""
    return [Outcome(c.clip, way, c.takeover, c.latency_ms) for c in calls
            if c.takeover is not None and c.turns == DEFAULT_TURNS]


def _spread(values: list[float]) -> dict[str, float | int | None]:
    return {"n": len(values), "p50": percentile(values, 50) if values else None,
            "p95": percentile(values, 95) if values else None}


def summary(calls: list[DoorCall], way: str) -> dict[str, Any]:
    judged = outcomes(calls, way)
    out = corpus_report.summary(judged)
    out["categories"] = {}
    for category in CATEGORIES:
        of = [c for c in calls if c.clip.category == category and c.turns == DEFAULT_TURNS]
        if not of:
            continue
        counted = [c for c in of if c.takeover is not None]
        hits = sum(bool(c.takeover) for c in counted)
        out["categories"][category] = {
            "rate": hits / len(counted) if counted else None, "take_overs": hits, "calls": len(of),
            "void": len(of) - len(counted), "latency_ms": _spread([c.latency_ms for c in counted
                                                                   if c.latency_ms is not None]),
            "answer_ms": _spread([c.answer_ms for c in counted if c.answer_ms is not None]),
            "by_class": {k: _rate([c for c in counted if CONDITION_CLASSES[c.clip.condition] == k])
                         for k in dict.fromkeys(CONDITION_CLASSES.values())}}
    out["left_state_behind"] = sum(not c.left_nothing for c in calls)
    if any(c.turns == SILENCE_TURNS for c in calls):
        out["turns_versus_silence"] = versus_silence(calls)
    return out


def versus_silence(calls: list[DoorCall]) -> dict[str, Any]:
    """Complete turns, end of speech -> answer heard, with the server's own turn detection and
    with silence, overall and by variant; ``paired_ms``: own minus silence, clip by clip (both
    calls answered), so that which clips a side lost does not move the difference."""
    played = [c for c in calls if c.clip.category == "smooth"]
    answered = {(c.clip.key, c.turns): c.answer_ms for c in played if c.takeover and c.answer_ms is not None}
    keys = list(dict.fromkeys(c.clip.key for c in played))
    both = [k for k in keys if (k, DEFAULT_TURNS) in answered and (k, SILENCE_TURNS) in answered]
    out: dict[str, Any] = {"answer_ms": {}, "answered": {}, "by_variant": {}}
    for turns in (DEFAULT_TURNS, SILENCE_TURNS):
        out["answer_ms"][turns] = _spread([ms for (_, t), ms in answered.items() if t == turns])
        out["answered"][turns] = f"{sum((k, turns) in answered for k in keys)}/{len(keys)}"
    for variant in dict.fromkeys(c.clip.variant for c in played):
        mine = {c.clip.key for c in played if c.clip.variant == variant}
        out["by_variant"][variant] = {turns: _spread([ms for (k, t), ms in answered.items()
                                                      if k in mine and t == turns])["p50"]
                                      for turns in (DEFAULT_TURNS, SILENCE_TURNS)}
    out["paired_ms"] = _spread([answered[(k, DEFAULT_TURNS)] - answered[(k, SILENCE_TURNS)] for k in both])
    return out


def _rate(calls: list[DoorCall]) -> float | None:
    return sum(bool(c.takeover) for c in calls) / len(calls) if calls else None


def _shown(value: float | None, form: str = "{:.0f}") -> str:
    return "-" if value is None else form.format(value)


def print_report(calls: list[DoorCall], way: str, part: str, phone: bool = False) -> dict[str, Any]:
    """``phone``: the calls came over a phone line (the phone's targets apply)."""
    report = summary(calls, way)
    rows = []
    for category, s in report["categories"].items():
        latency, answer = s["latency_ms"], s["answer_ms"]
        rate = "-" if s["rate"] is None else f"{s['rate']:.3f} ({s['take_overs']}/{s['calls'] - s['void']})"
        rows.append([category, rate, s["void"], *(_shown(r, "{:.2f}") for r in s["by_class"].values()),
                     *(_shown(latency[q]) for q in ("p50", "p95")), LATENCY.get(category, ""),
                     *(_shown(answer[q]) for q in ("p50", "p95")), corpus_report.MEANING[category][2 if phone else 1]])
    classes = list(dict.fromkeys(CONDITION_CLASSES.values()))
    print(f"corpus part: {part}, through {way} ({corpus_report.FLOOR_NOTE})")
    print(table(["category", "take-over rate", "void", *classes, "latency p50 ms", "p95", "latency",
                 "answer p50 ms", "p95", "target"], rows))
    print("take-over: " + "; ".join(f"{c}: {corpus_report.MEANING[c][0]}" for c in report["categories"]))
    print("void: the call said nothing (it failed, or the agent was not speaking when the clip began); "
          "answer: end of the caller's speech -> the agent's answer heard")
    worst = sorted([key, rate] for key, rate in report["by_variant"].get(way, {}).items()
                   if key.split("|")[0] in ("backchannel", "noise", "pause") and rate > 0.3)
    if worst:
        print("variants above 0.3 (pause / backchannel / noise):")
        print(table(["variant", "rate"], worst))
    if "turns_versus_silence" in report:
        _print_versus(report["turns_versus_silence"])
    print(f"calls that left state behind in a stage or a session: {report['left_state_behind']}")
    return report


def _print_versus(versus: dict[str, Any]) -> None:
    own, silence = (versus["answer_ms"][t] for t in (DEFAULT_TURNS, SILENCE_TURNS))
    print("complete turns, end of speech -> answer heard: the server's own turn detection vs silence-ended "
          "turns (server_vad), each clip both ways")
    rows = [[variant, _shown(p50[DEFAULT_TURNS]), _shown(p50[SILENCE_TURNS])]
            for variant, p50 in versus["by_variant"].items()]
    rows.append(["all: p50 / p95", f"{_shown(own['p50'])} / {_shown(own['p95'])}",
                 f"{_shown(silence['p50'])} / {_shown(silence['p95'])}"])
    rows.append(["answered", versus["answered"][DEFAULT_TURNS], versus["answered"][SILENCE_TURNS]])
    print(table(["variant (p50 ms)", "own turns", "silence"], rows))
    paired = versus["paired_ms"]
    print(f"own minus silence, clip by clip: p50 {_shown(paired['p50'])} ms, p95 {_shown(paired['p95'])} ms "
          f"(n={paired['n']}; below 0: the caller waits less)")


def call_json(call: DoorCall) -> dict[str, Any]:
    clip = call.clip
    fields = {k: v for k, v in asdict(call).items() if k != "clip"}
    return {"category": clip.category, "variant": clip.variant, "condition": clip.condition,
            "speaker": clip.speaker.name, **fields}


def heat_map(calls: list[DoorCall], way: str, path: Path, command: str) -> None:
    played = tuple(dict.fromkeys(c.clip.category for c in calls))
    corpus_report.heat_map(outcomes(calls, way), path, command, tuple(c for c in CATEGORIES if c in played))
