"""``duplex bench turn-taking --corpus PART``: the corpus' in-process mode (no server): every clip
of PART through today's rules and the learned decisions, side by side; ``--train``: the learned
decisions trained from the dev part (or ``--train-on``) and written to ``--model``; ``--folds
sentence``: the pause reading judged on sentences it was trained without (``folds.py``)."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from duplex.session.turn_model import MODEL_PATH, TurnModels
from duplex_tools.report import write_json
from duplex_tools.turn_corpus import spec

DEFAULT_CACHE = Path.home() / ".cache" / "duplex" / "turn_corpus"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("corpus (in process, no server)")
    group.add_argument("--corpus", choices=spec.SPLITS,
                       help="judge this part of the synthetic corpus in process: today's rules and the learned "
                            "decisions side by side (dev, held-out; espeak, piper: by synthesiser; all)")
    group.add_argument("--train", action="store_true",
                       help="train the learned decisions from --train-on and write them to --model")
    group.add_argument("--train-on", default="dev", choices=spec.SPLITS, help="the part trained on (default dev)")
    group.add_argument("--folds", choices=("sentence",),
                       help="judge each sentence of --corpus by a pause reading trained on --train-on without it "
                            "(beside one trained on every sentence and today's rules)")
    group.add_argument("--model", type=Path, default=MODEL_PATH, help=f"the learned decisions (default {MODEL_PATH})")
    group.add_argument("--full", action="store_true",
                       help="every speaker under every condition (default: clean and two others per speaker "
                            "and variant, in rotation: every cell, half the compute)")
    group.add_argument("--background-s", type=float, default=0.0, metavar="S",
                       help="the session heard each clip's background noise for S seconds before the clip, as in "
                            "a call where the noise was there all along (default 0: it starts with the clip)")
    group.add_argument("--cache", type=Path, default=DEFAULT_CACHE,
                       help=f"generated audio and the models' answers (default {DEFAULT_CACHE})")


def run_corpus(args: argparse.Namespace) -> int:
    from duplex_tools.turn_corpus.evaluate import Settings, evaluate
    from duplex_tools.turn_corpus.report import heat_map, print_report
    from duplex_tools.turn_corpus.train import train, write

    command = "duplex bench " + " ".join(shlex.quote(a) for a in sys.argv[2:])
    if args.train:
        print(f"training on the {args.train_on} part ...", file=sys.stderr, flush=True)
        _, examples = evaluate(args.cache, args.train_on, None, args.full)
        write(train(examples), args.model)
        print(f"wrote {args.model} ({len(examples.overlap)} overlap, {len(examples.pause)} pause and "
              f"{len(examples.sound)} sound examples)")
    if args.corpus is None:
        return 0
    if args.folds:
        return _run_folds(args, command)
    models = TurnModels.load(args.model) if Path(args.model).is_file() else None
    settings = Settings(background_s=args.background_s)
    outcomes, _ = evaluate(args.cache, args.corpus, models, args.full, settings)
    report = print_report(outcomes, args.corpus)
    report["command"], report["part"], report["background_s"] = command, args.corpus, args.background_s
    write_json(args.json_path, report)
    if args.plot:
        heat_map(outcomes, Path(args.plot), command)
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0


def _run_folds(args: argparse.Namespace, command: str) -> int:
    from duplex_tools.turn_corpus.evaluate import evaluate
    from duplex_tools.turn_corpus.folds import print_folds, sentence_folds

    turns = ("pause", "smooth")
    print(f"reading the {args.train_on} part's pauses ...", file=sys.stderr, flush=True)
    _, training = evaluate(args.cache, args.train_on, None, args.full, categories=turns)
    print(f"judging the {args.corpus} part's ...", file=sys.stderr, flush=True)
    _, judged = evaluate(args.cache, args.corpus, None, args.full, categories=turns)
    report = print_folds(sentence_folds(training.pauses, judged.pauses))
    report |= {"command": command, "part": args.corpus, "trained_on": args.train_on}
    write_json(args.json_path, report)
    return 0
