"""The import graph between rooms, derived from the code: every import statement of duplex/ and of
the tools (as scripts/import_cycles.py counts them), folded into rooms. Fails (exit 1) on a cycle
between rooms or an arrow that points the wrong way; --png draws the graph.

    python scripts/import_graph.py --png docs/architecture/import-graph.png

Rooms: duplex's top folders (cli, server, edge, session, runtime, config, audio); the edge's
sub-rooms (one per folder: http, the doors, phone, media; its own modules are one room); the
session's three (the call's assembly, the Realtime wire layer session/realtime, the conversation
core); the model registry and each model family; the tools' cli, bench, scenario, qwen3_omni and
their shared modules. The order they must point in comes from .importlinter (the rooms' layers, the
edge's layers, the session core's modules): tools -> cli -> server -> edge -> session -> runtime ->
config -> audio, models plugged in between the server and the runtime, and inside the edge and the
session their own layers. An arrow is right when the design leads from its tail to its head."""

from __future__ import annotations

import argparse
import configparser
import sys
from collections import defaultdict
from pathlib import Path

from import_cycles import ROOT, cycles, imports_of, module_files

TOOLS = ["duplex_tools.cli", "duplex_tools.bench", "duplex_tools.scenario", "duplex_tools.qwen3_omni",
         "duplex_tools"]
SESSION = ["duplex.session", "duplex.session.realtime", "duplex.session.core"]
BOTTOM = ["duplex.runtime", "duplex.config", "duplex.audio", "duplex.lifecycle", "duplex.cpu_wait"]
DUPLEX_LABEL = {"duplex.edge": "edge (own modules)", "duplex.session": "session (the call)",
                "duplex.session.core": "session core", "duplex.models": "models (registry)",
                "duplex_tools": "tools (shared)"}


def contracts() -> configparser.ConfigParser:
    parser = configparser.ConfigParser()
    parser.read(ROOT / ".importlinter")
    return parser


def edge_layers(config: configparser.ConfigParser) -> list[list[str]]:
    """The edge contract's layers as rooms: a folder is a sub-room, a module belongs to duplex.edge."""
    edge = ROOT / "duplex" / "edge"
    layers: list[list[str]] = []
    for line in config["importlinter:contract:edge-rooms"]["layers"].split("\n"):
        names = [name.strip() for name in line.split("|") if name.strip()]
        rooms = [f"duplex.edge.{name}" if (edge / name).is_dir() else "duplex.edge" for name in names]
        if rooms and rooms[0] not in {room for layer in layers for room in layer}:
            layers.append(sorted(set(rooms)))
    return layers


def room_of(module: str, core: set[str]) -> str | None:
    parts = module.split(".")
    if parts[0] == "duplex_tools":
        name = ".".join(parts[:2])
        return name if name in TOOLS else "duplex_tools"
    if len(parts) == 1:
        return None  # duplex/__init__.py
    folder = ROOT.joinpath(*parts[:3])
    if parts[1] in ("edge", "models", "session") and len(parts) > 2 and folder.is_dir():
        return ".".join(parts[:3])
    if parts[1] == "session" and module in core:
        return "duplex.session.core"
    return ".".join(parts[:2])


def design(config: configparser.ConfigParser, families: list[str]) -> dict[str, set[str]]:
    """The arrows the design allows, one step each: an arrow is right when these lead from its tail
    to its head."""
    steps: dict[str, set[str]] = defaultdict(set)
    main = [name.strip() for name in config["importlinter:contract:layers"]["layers"].split("\n") if name.strip()]
    chain = [*TOOLS]
    for room in main:
        if room == "duplex.edge":
            chain += [layer[0] for layer in edge_layers(config)]
        elif room == "duplex.session":
            chain += SESSION
        else:
            chain.append(room)
    chain.append("duplex.audio")  # below every room
    for upper, lower in zip(chain, chain[1:]):
        steps[upper].add(lower)
    steps["duplex.config"].add("duplex.lifecycle")  # below every room too, beside the audio
    steps["duplex.config"].add("duplex.cpu_wait")  # the watchdogs' excuse, for stages and media workers alike
    # peers of a layer (the doors; the phone and plug-in seams) all sit on the chain's step; from the
    # lowest layer up, so a door's peers also get the steps its layer's first room gets from peers below
    for layer in reversed(edge_layers(config)):
        above = next(room for room, below in steps.items() if layer[0] in below)
        for room in layer:
            steps[above].add(room)
            steps[room] |= steps[layer[0]]
    steps["duplex.server"].add("duplex.models")
    for family in families:  # the registry names the families; a family sees only the runtime's contract
        steps["duplex.models"].add(family)
        steps[family].add("duplex.runtime")
    return steps


def reachable(steps: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = list(steps.get(start, ()))
    while todo:
        room = todo.pop()
        if room not in seen:
            seen.add(room)
            todo += steps.get(room, ())
    return seen


def room_graph() -> tuple[dict[str, set[str]], dict[tuple[str, str], list[str]]]:
    config = contracts()
    core = {name.strip() for name in
            config["importlinter:contract:session-core-knows-no-wire"]["source_modules"].split("\n") if name.strip()}
    mods = module_files()
    graph: dict[str, set[str]] = defaultdict(set)
    why: dict[tuple[str, str], list[str]] = defaultdict(list)
    for name, path in mods.items():
        tail = room_of(name, core)
        if tail is None:
            continue
        graph[tail]
        for target in sorted(imports_of(name, path, mods)):
            head = room_of(target, core)
            if head and head != tail:
                graph[tail].add(head)
                why[tail, head].append(f"{name} -> {target}")
    return dict(graph), dict(why)


def check(graph: dict[str, set[str]], why: dict[tuple[str, str], list[str]]) -> tuple[list[list[str]], set]:
    families = sorted(room for room in graph if room.startswith("duplex.models."))
    steps = design(contracts(), families)
    wrong = {(tail, head) for tail, heads in graph.items() for head in heads if head not in reachable(steps, tail)}
    return cycles(graph), wrong


def draw(path: Path, graph: dict[str, set[str]], wrong: set, found: list[list[str]]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    config = contracts()
    families = sorted(room for room in graph if room.startswith("duplex.models."))
    rows: list[list[str]] = [[room] for room in TOOLS[:3]] + [["duplex_tools.qwen3_omni", "duplex_tools"]]
    rows += [["duplex.cli"], ["duplex.server"], ["duplex.models"], *edge_layers(config)]
    rows += [[room] for room in SESSION] + [[room] for room in BOTTOM]
    rows[rows.index(["duplex.edge.http"])].append("duplex.models")
    rows.remove(["duplex.models"])
    rows[next(i for i, row in enumerate(rows) if "duplex.edge.phone" in row)] += families
    place: dict[str, tuple[float, float]] = {}
    for y, row in enumerate(rows):
        main = [room for room in row if not room.startswith("duplex.models")]
        side = [room for room in row if room.startswith("duplex.models")]
        for x, room in enumerate(main):
            place[room] = ((x - (len(main) - 1) / 2) * 2.6, -y)
        for x, room in enumerate(side):
            place[room] = (7.0 + (x % 3) * 2.2, -y - (x // 3) * 0.9)
    fig, ax = plt.subplots(figsize=(14, 15))
    for prefix, label in (("duplex.edge", "edge"), ("duplex.session", "session"), ("duplex_tools", "tools"),
                          ("duplex.models", "models")):
        xs, ys = zip(*(xy for room, xy in place.items() if room.startswith(prefix)))
        ax.add_patch(FancyBboxPatch((min(xs) - 1.2, min(ys) - 0.4), max(xs) - min(xs) + 2.4, max(ys) - min(ys) + 0.8,
                                    boxstyle="round,pad=0.05", fc="0.96", ec="0.6", ls="--", zorder=0))
        ax.text(min(xs) - 1.1, max(ys) + 0.25, label, fontsize=10, style="italic", color="0.35", zorder=0)
    for tail, heads in graph.items():
        for head in heads:
            bad = (tail, head) in wrong or any(tail in component and head in component for component in found)
            tools = tail.startswith("duplex_tools") and not head.startswith("duplex_tools")
            ax.add_patch(FancyArrowPatch(place[tail], place[head], arrowstyle="-|>", mutation_scale=10,
                                         connectionstyle="arc3,rad=0.12", shrinkA=14, shrinkB=14, zorder=1,
                                         color="red" if bad else ("#e8b27a" if tools else "0.5"),
                                         lw=2 if bad else 0.7, alpha=1 if bad else 0.8))
    for room, (x, y) in place.items():
        label = DUPLEX_LABEL.get(room, room.removeprefix("duplex_tools.").removeprefix("duplex."))
        color = "#fde2c8" if room.startswith("duplex_tools") else "#dbe7fb"
        color = "#e3f4dc" if room.startswith("duplex.models") else color
        ax.text(x, y, label, ha="center", va="center", fontsize=9, zorder=2,
                bbox={"boxstyle": "round", "fc": color, "ec": "0.3"})
    xs = [x for x, _ in place.values()]
    ax.set_xlim(min(xs) - 1.8, max(xs) + 1.8)
    ax.set_ylim(-len(rows) - 0.5, 0.8)
    ax.axis("off")
    verdict = "no cycle, no wrong-way arrow" if not wrong and not found else "red: cycles or wrong-way arrows"
    ax.set_title(f"Imports between rooms (tools and their arrows orange, models green); every arrow points down "
                 f"or to a model family.\n{verdict}. Made by: python scripts/import_graph.py --png {path.as_posix()}",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--png", type=Path, help="draw the graph here")
    args = parser.parse_args()
    graph, why = room_graph()
    found, wrong = check(graph, why)
    for component in found:
        print("cycle between rooms: " + " <-> ".join(component))
    for tail, head in sorted(wrong):
        print(f"wrong way: {tail} -> {head} ({'; '.join(why[tail, head][:3])})")
    if args.png:
        draw(args.png, graph, wrong, found)
    print(f"import graph: {len(graph)} rooms, {sum(len(h) for h in graph.values())} arrows, "
          f"{len(found)} cycles, {len(wrong)} wrong-way")
    return 1 if found or wrong else 0


if __name__ == "__main__":
    sys.exit(main())
