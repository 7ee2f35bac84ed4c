"""A toy text family: small real stages that transform and stream, for runtime tests and the
relay bench. Each builder returns a ``simple`` computation: fn(items, states) -> outputs per item."""

from __future__ import annotations

import time
from typing import Any, cast

import numpy as np

from duplex.runtime.contract import BuildContext, Payload, TurnRequest, WorkItem


class Blob(Payload, tag="toy.Blob"):
    """The relay bench's payload: ``nbytes`` of sevens, numbered, stamped with its send time."""

    blob: Any  # np.ndarray, uint8
    index: int
    t0: int  # time.monotonic_ns() when it was made


class HopReport(Payload, tag="toy.HopReport"):
    hop_ns: int
    nbytes: int
    intact: bool


def _text(data: Any) -> str:
    return data["text"] if isinstance(data, dict) else str(data)


def build_split(ctx: BuildContext):
    """Text in -> one chunk per word, streamed; the last word is the final output."""

    def split(items: list[WorkItem], states: list[dict]) -> list[list[Any]]:
        return [[{"text": word, "index": i} for i, word in enumerate(_text(item.data).split())]
                if item.data is not None else [] for item in items]

    return split


def build_upper(ctx: BuildContext):
    """Upper-cases each chunk; ``delay_ms`` stands for compute per row (so aborts can land mid-step)."""
    delay = float(ctx.args.get("delay_ms", 0)) / 1000

    def upper(items: list[WorkItem], states: list[dict]) -> list[list[Any]]:
        if delay:
            time.sleep(delay)
        out = []
        for item, state in zip(items, states):
            state["seen"] = state.get("seen", 0) + (item.data is not None)
            out.append([] if item.data is None else
                       [{**item.data, "text": _text(item.data).upper(), "batch": len(items)}])
        return out

    return upper


def build_count(ctx: BuildContext):
    """Counts the chunks of a request; emits the count once input ends."""

    def count(items: list[WorkItem], states: list[dict]) -> list[list[Any]]:
        out = []
        for item, state in zip(items, states):
            state["n"] = state.get("n", 0) + (item.data is not None)
            out.append([{"count": state["n"]}] if item.eos else [])
        return out

    return count


def build_join(ctx: BuildContext):
    """Fan-in: gets {source: final data} once every ``wait_for`` source has finished."""

    def join(items: list[WorkItem], states: list[dict]) -> list[list[Any]]:
        return [[{"joined": {src: data for src, data in sorted(item.data.items())}}] for item in items]

    return join


def build_blob_source(ctx: BuildContext):
    """Emits a ``Blob`` of the request's ``options['nbytes']`` bytes per input (relay bench);
    ``delay_ms`` stands for compute before it."""
    delay = float(ctx.args.get("delay_ms", 0)) / 1000

    def source(items: list[WorkItem], states: list[dict]) -> list[list[Any]]:
        if delay:
            time.sleep(delay)
        out = []
        for item, state in zip(items, states):
            state["sent"] = state.get("sent", 0) + 1
            blob = np.full(int(cast(TurnRequest, item.params).options["nbytes"]), 7, dtype=np.uint8)
            out.append([Blob(blob, index=state["sent"] - 1, t0=time.monotonic_ns())])
        return out

    return source


def build_blob_sink(ctx: BuildContext):
    """Reports how long the blob took to arrive, and checks its bytes; ``delay_ms`` stands for
    compute after that."""
    delay = float(ctx.args.get("delay_ms", 0)) / 1000

    def sink(items: list[WorkItem], states: list[dict]) -> list[list[Any]]:
        arrived = time.monotonic_ns()
        if delay:
            time.sleep(delay)
        out = []
        for item in items:
            blob = item.data.blob
            intact = bool(blob.size == 0 or (blob[0] == 7 and blob[-1] == 7))
            out.append([HopReport(hop_ns=arrived - item.data.t0, nbytes=int(blob.size), intact=intact)])
        return out

    return sink


BUILDERS = {
    "toy.split": build_split,
    "toy.upper": build_upper,
    "toy.count": build_count,
    "toy.join": build_join,
    "toy.blob_source": build_blob_source,
    "toy.blob_sink": build_blob_sink,
}
