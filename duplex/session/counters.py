"""What one call's session counts: a plain record the session and its barge-in listener add to and
the server's metrics read; apart from ``observe.py`` so the conversation core counts without
importing the wire events a tap watches."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SessionCounters:
    """What one call's session counted (its stats; the server's metrics read them)."""

    turns: int = 0
    responses: int = 0
    barge_ins: int = 0
    cancelled: int = 0
    errors: int = 0
    preemptive_starts: int = 0
    preemptive_aborts: int = 0
    preemptive_commits: int = 0
    resumed: int = 0  # onsets during a reply that were backchannels or noises: it played on
    judged_complete: int = 0  # semantic turns: pauses judged the turn's end (before the longest pause)
    judged_incomplete: int = 0  # ... judged not (the turn waited for more)
