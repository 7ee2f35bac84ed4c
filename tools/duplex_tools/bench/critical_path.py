"""Split one staged turn's time to first audio into pure compute and the runtime's share.

Input: the step spans every stage wrote (``duplex.runtime.steptrace``) for one request, the end
of the user's speech and the first audio chunk's arrival, all on the same monotonic clock.

The first audio chunk depends on: the encoder's last step (the end of speech), the thinker's
first-token step and as many decode steps as the talker's first chunk needs (talker step k
speaks reply token k), the talker's first ``first_chunk_frames`` steps, and code2wav's first
step. Its pure compute is the longest path through those steps' compute times (the thinker
decodes token k+1 while the talker runs step k, so that branch overlaps); everything else in
the time to first audio is the runtime: hops between stages, queueing, waking, scheduling.
"""

from __future__ import annotations


def _ms(seconds: float) -> float:
    return seconds * 1e3


def first_chunk_path(spans: list[dict], rid: str, end_of_speech: float, first_audio: float,
                     first_chunk_frames: int) -> dict | None:
    """Per-stage compute and gaps on the path of ``rid``'s first audio chunk, or None if a
    stage's spans are missing (tracing off)."""
    mine = sorted((s for s in spans if rid in s["rids"]), key=lambda s: s["t0"])
    by_stage: dict[str, list[dict]] = {}
    for span in mine:
        by_stage.setdefault(span["stage"], []).append(span)
    encoder = [s for s in by_stage.get("encoder", []) if s["t1"] >= end_of_speech]
    if not encoder or not by_stage.get("talker") or not by_stage.get("code2wav"):
        return None
    enc = encoder[-1]
    thinker = [s for s in by_stage.get("thinker", []) if s["t0"] >= enc["t1"]]
    talker = by_stage["talker"][:first_chunk_frames]
    code2wav = next((s for s in by_stage["code2wav"] if s["t0"] >= talker[-1]["t1"]), None)
    if not thinker or code2wav is None:
        return None
    thinker = thinker[:len(talker)]
    cost = lambda s: s["t1"] - s["t0"]
    # Longest path: thinker steps in a chain after the encoder; talker step k after talker
    # step k-1 and thinker step k (the reply token it speaks).
    thinker_done, clock = [], cost(enc)
    for step in thinker:
        clock += cost(step)
        thinker_done.append(clock)
    talker_done = 0.0
    for k, step in enumerate(talker):
        talker_done = max(talker_done, thinker_done[min(k, len(thinker_done) - 1)]) + cost(step)
    critical = talker_done + cost(code2wav)
    ttfa = first_audio - end_of_speech
    return {
        "ttfa_ms": _ms(ttfa),
        "critical_compute_ms": _ms(critical),
        "serial_compute_ms": _ms(cost(enc) + sum(map(cost, thinker)) + sum(map(cost, talker)) + cost(code2wav)),
        "overhead": ttfa / critical - 1,
        "compute_ms": {"encoder": _ms(cost(enc)), "thinker": [_ms(cost(s)) for s in thinker],
                       "talker": [_ms(cost(s)) for s in talker], "code2wav": _ms(cost(code2wav))},
        "gaps_ms": {  # time on the path when no stage on it computed
            "client->encoder": _ms(enc["t0"] - end_of_speech),
            "encoder->thinker": _ms(thinker[0]["t0"] - enc["t1"]),
            "thinker->talker": _ms(talker[0]["t0"] - thinker[0]["t1"]),
            "talker steps": _ms(sum(b["t0"] - a["t1"] for a, b in zip(talker, talker[1:]))),
            "talker->code2wav": _ms(code2wav["t0"] - talker[-1]["t1"]),
            "code2wav->client": _ms(first_audio - code2wav["t1"]),
        },
    }
