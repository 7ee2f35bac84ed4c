"""Where a level's turns spent their time, as the server measured it: the mean of each part of
time to first audio (``duplex_turn_part_seconds``: end of turn, ASR tail, first token, first
phrase, TTS first chunk, playout) over the turns of a level, from two reads of ``/metrics``."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

PART_METRIC = "duplex_turn_part_seconds"
Totals = dict[str, tuple[float, float]]  # part -> (seconds summed, turns counted)


async def read_parts(url: str) -> Totals | None:
    """The server's running totals per part; None where it serves no metrics."""
    try:
        async with httpx.AsyncClient(base_url=url, timeout=10) as http:
            reply = await http.get("/metrics")
    except httpx.HTTPError:
        return None
    if reply.status_code != 200:
        return None
    totals: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(reply.text):
        if family.name != PART_METRIC:
            continue
        for sample in family.samples:
            part = sample.labels.get("part")
            if part is None or not sample.name.endswith(("_sum", "_count")):
                continue
            entry = totals.setdefault(part, [0.0, 0.0])
            entry[0 if sample.name.endswith("_sum") else 1] += sample.value
    return {part: (total, count) for part, (total, count) in totals.items()}


def mean_parts_ms(before: Totals | None, after: Totals | None) -> dict[str, float] | None:
    """Mean milliseconds per part over the turns between the two reads."""
    if before is None or after is None:
        return None
    means = {}
    for part, (total, count) in after.items():
        total0, count0 = before.get(part, (0.0, 0.0))
        if count > count0:
            means[part] = round(1000 * (total - total0) / (count - count0), 1)
    return means


def add_parts(summed: Totals | None, before: Totals | None, after: Totals | None) -> Totals | None:
    """``summed`` plus the turns between the two reads (None once a read found no metrics)."""
    if summed is None or before is None or after is None:
        return None
    added = dict(summed)
    for part, (total, count) in after.items():
        total0, count0 = before.get(part, (0.0, 0.0))
        old_total, old_count = added.get(part, (0.0, 0.0))
        added[part] = (old_total + total - total0, old_count + count - count0)
    return added
