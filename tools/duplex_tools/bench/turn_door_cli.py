"""``duplex bench turn-taking --corpus PART --door webrtc``: a stratified sample of the corpus'
clips played end to end, call by call, through a real door against a real server
(``turn_door.py``): the sample chosen and rendered, the server started (or ``--url``'s used),
the calls played, the report printed and written."""

from __future__ import annotations

import argparse
import asyncio
import shlex
import sys
from pathlib import Path

from duplex.edge.webrtc.rtc_options import use_loopback_candidates
from duplex_tools.bench import turn_door as door
from duplex_tools.bench import turn_door_report as door_report
from duplex_tools.bench import turn_door_sip as door_sip
from duplex_tools.harness import ServerProcess
from duplex_tools.report import write_json
from duplex_tools.turn_corpus import spec
from duplex_tools.turn_corpus.render import render

DEFAULT_CONFIG = "local"  # what `duplex serve` runs with no flags: the real pipeline
READY_TIMEOUT_S = 300.0  # local loads Whisper, Gemma and Piper first: slow on 2 busy cores


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("corpus end to end (with --corpus PART)")
    group.add_argument("--door", choices=("webrtc", "sip"),
                       help="play a stratified sample of --corpus PART end to end through this door, one call per "
                            "clip, against a real `duplex serve --config CONFIG` (default local) or --url; sip: "
                            "SIPp places each call, G.711 both ways (a phone cannot ask for silence-ended turns: "
                            "complete turns are played again on a second server whose sessions end turns on "
                            "silence)")
    group.add_argument("--calls-per-cell", type=int, default=2,
                       help="--door: calls per (variant, condition class: clean, noisy, room, phone); default 2")
    group.add_argument("--limit", type=int, help="--door: at most this many calls (spread over the cells)")
    group.add_argument("--seed", type=int, default=0, help="--door: the sample's seed (speakers, conditions)")
    group.add_argument("--url", help="--door: play against this running server (it must be ours alone) "
                                     "instead of starting one")
    group.add_argument("--sip-address", metavar="HOST:PORT",
                       help="--door sip with --url: where that server's SIP edge listens")


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _categories(value: str) -> tuple[str, ...]:
    chosen = tuple(c for c in value.split(",") if c)
    unknown = [c for c in chosen if c not in door.CATEGORIES]
    if unknown or not chosen:
        raise SystemExit(f"--categories with --door: unknown {unknown or value!r} "
                         f"(known: {', '.join(door.CATEGORIES)})")
    return chosen


def _play(args: argparse.Namespace, url: str, clips: list[spec.Clip], sip: tuple[str, int] | None,
          turns: str = door.DEFAULT_TURNS) -> list[door.DoorCall]:
    if args.door == "sip":
        assert sip is not None
        return asyncio.run(door_sip.play(sip, url, clips, args.cache, args.voice, _say, turns))
    return asyncio.run(door.play(url, clips, args.cache, args.voice, _say))


def _serve_and_play(args: argparse.Namespace, config: str, clips: list[spec.Clip], flags: list[str],
                    turns: str = door.DEFAULT_TURNS) -> list[door.DoorCall]:
    """Start ``duplex serve --config CONFIG`` (with ``flags``) and play ``clips`` against it."""
    _say(f"starting `duplex serve --config {config}{''.join(' ' + f for f in flags)}` ...")
    serve = ["--config", config, "--port", "0", "--ice-loopback", *flags]
    serve += ["--sip", "127.0.0.1:0"] if args.door == "sip" else []
    with ServerProcess(serve, ready_timeout=READY_TIMEOUT_S) as server:
        assert server.url is not None  # set once the server is ready, before the block runs
        sip = door_sip.sip_edge_of(server.output) if args.door == "sip" else None
        if args.door == "sip" and sip is None:
            raise SystemExit("the server did not say where its SIP edge listens:\n" + "".join(server.output[-20:]))
        calls = _play(args, server.url, clips, sip, turns)
        if any(c.void not in (None, door.NOT_SPEAKING) for c in calls):
            _say("a call failed; the server's last lines:\n" + "".join(server.output[-40:]))
    return calls


def _address(value: str, what: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit():
        raise SystemExit(f"{what}: expected HOST:PORT, got {value!r}")
    return host, int(port)


def run_door(args: argparse.Namespace) -> int:
    if args.corpus is None:
        raise SystemExit("--door needs --corpus PART")
    command = "duplex bench " + " ".join(shlex.quote(a) for a in sys.argv[2:])
    if args.calls_per_cell < 1:
        raise SystemExit("--calls-per-cell must be at least 1")
    categories = _categories(args.categories)
    if args.door == "sip" and args.url and not args.sip_address:
        raise SystemExit("--door sip with --url needs --sip-address HOST:PORT (the server's SIP edge)")
    clips = door.sample(args.corpus, args.calls_per_cell, args.seed, categories)
    clips = clips[:args.limit] if args.limit is not None else clips
    complete = [c for c in clips if c.category == "smooth"]
    played = len(door.ways_of(clips)) if args.door == "webrtc" or not args.url else len(clips)
    _say(f"{len(clips)} clips from the {args.corpus} part, {played} calls; rendering their audio ...")
    for clip in clips:  # before the server starts: the calls then play back to back
        render(args.cache, clip)
    use_loopback_candidates(True)
    config = args.config or DEFAULT_CONFIG
    if args.url:
        sip = _address(args.sip_address, "--sip-address") if args.door == "sip" else None
        way, calls = f"{args.door} ({args.url})", _play(args, args.url, clips, sip)
        if complete and args.door == "sip":
            _say("--url: complete turns are played with the server's own turn detection only")
    else:
        way, calls = f"{args.door} ({config})", _serve_and_play(args, config, clips, [])
        # the baseline a phone cannot ask for: a server that ends turns on silence (not after a Ctrl-C)
        if complete and args.door == "sip" and len(calls) == len(clips):
            calls += _serve_and_play(args, config, complete, door_sip.SILENCE_OVERRIDE, door.SILENCE_TURNS)
    report = door_report.print_report(calls, way, args.corpus, phone=args.door == "sip")
    report.update({"command": command, "part": args.corpus, "door": args.door, "way": way, "seed": args.seed,
                   "calls_per_cell": args.calls_per_cell, "calls": [door_report.call_json(c) for c in calls]})
    write_json(args.json_path, report)
    if args.plot:
        door_report.heat_map(calls, way, Path(args.plot), command)
        _say(f"wrote {args.plot}")
    return 0
