"""From a recording to numbers and verdicts: per step TTFB, barge-in stop time, take-over; per
scenario false interruptions, echo gating, state left behind.

All times are the client's: when its microphone sent a frame, when an agent frame or an event
arrived. TTFB runs from the end of the caller's speech (its last loud frame sent) to the first
loud agent frame of the reply; the barge-in stop time from the caller's speech onset to the end
of the last loud agent frame of the interrupted reply.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from duplex_tools.scenario.model import Scenario, Step
from duplex_tools.scenario.recording import Recording, StepRecord

FRAME_S = 0.02
SPEAKING_LOOKBACK_S = 0.3  # the agent "is speaking" at an onset if its audio arrived this recently
STOP_WINDOW_S = 2.0  # the interrupted reply's audio is looked for this long after the onset
CUT_MARGIN_S = 1.0  # a cut belongs to a step until this long after its end-of-turn silence


@dataclass
class Check:
    name: str
    ok: bool
    detail: str = ""


@dataclass
class StepResult:
    index: int
    kind: str
    title: str
    onset_s: float | None = None  # relative to the call's first microphone frame
    end_s: float | None = None
    agent_speaking_at_onset: bool = False
    cut_response: str | None = None  # the reply that was playing, if this step cut it
    stop_ms: float | None = None
    barge_in: bool = False  # the caller's speech cut the agent (not noise, not a backchannel)
    freed_after_ms: float | None = None
    reply_response: str | None = None
    ttfb_ms: float | None = None
    server_ttfa_ms: float | None = None
    reply_gap_ms: float | None = None  # the longest silence inside the reply's audio (starved playout, or pauses)
    took_over: bool | None = None  # the agent answered during a pause / yielded to a backchannel
    resume_ms: float | None = None  # a sound the agent talked on through: its end -> agent audio heard again
    checks: list[Check] = field(default_factory=list)


@dataclass
class ScenarioResult:
    name: str
    description: str
    passed: bool  # every expectation held
    known_issue: str | None
    steps: list[StepResult]
    checks: list[Check]
    false_interruptions: int
    take_overs: int
    echo_gated_frames: int | None
    error: str | None
    plot: str | None = None

    @property
    def status(self) -> str:
        """pass | FAIL | known issue (failed as its scenario says it still does) | FIXED? (a
        scenario marked as a known issue passed: drop the mark)."""
        if self.known_issue:
            return "FIXED?" if self.passed else "known issue"
        return "pass" if self.passed else "FAIL"

    @property
    def ok(self) -> bool:
        return self.status in ("pass", "known issue")

    @property
    def ttfb_ms(self) -> list[float]:
        return [s.ttfb_ms for s in self.steps if s.ttfb_ms is not None]

    @property
    def stop_ms(self) -> list[float]:
        return [s.stop_ms for s in self.steps if s.stop_ms is not None and s.barge_in]

    @property
    def failures(self) -> list[str]:
        found = [f"{c.name}: {c.detail}" for c in self.checks if not c.ok]
        for step in self.steps:
            found += [f"step {step.index + 1} {c.name}: {c.detail}" for c in step.checks if not c.ok]
        return found

    def to_json(self) -> dict:
        return {**asdict(self), "status": self.status, "ok": self.ok, "ttfb_ms": self.ttfb_ms, "stop_ms": self.stop_ms,
                "failures": self.failures}


def measure(scenario: Scenario, rec: Recording, exclusive: bool = True) -> ScenarioResult:
    t0 = rec.t0
    results = [_measure_step(scenario, rec, step, record, t0) for step, record in zip(scenario.steps, rec.steps)]
    cuts = _cuts(rec)
    false_cuts = [rid for rid, at in cuts.items() if _is_false_cut(scenario, rec, at)]
    take_overs = sum(1 for r in results if r.took_over)
    checks = _scenario_checks(scenario, rec, len(false_cuts), exclusive)
    passed = all(c.ok for c in checks) and all(c.ok for r in results for c in r.checks)
    gated = (rec.session_stats or {}).get("echo_gated_frames")
    return ScenarioResult(scenario.name, scenario.description, passed, scenario.known_issue, results, checks,
                          len(false_cuts), take_overs, gated, rec.error)


def _measure_step(scenario: Scenario, rec: Recording, step: Step, record: StepRecord, t0: float) -> StepResult:
    result = StepResult(record.index, step.kind, step.title,
                        None if record.onset is None else round(record.onset - t0, 3),
                        None if record.end is None else round(record.end - t0, 3))
    if step.kind == "pause":
        return result
    expect = step.expect
    start = record.onset if record.onset is not None else record.queued_at
    end = record.end if record.end is not None else record.finished_at
    window_end = _next_onset(rec, record.index)
    playing = _playing_response(rec, start)
    result.agent_speaking_at_onset = playing is not None and bool(rec.loud_heard(start - SPEAKING_LOOKBACK_S, start))
    if playing is not None:
        cut_at = _cut_time(rec, playing, start, min(window_end, end + rec.silence_ms / 1000 + CUT_MARGIN_S))
        if cut_at is not None:
            result.cut_response = playing
            result.stop_ms = _stop_ms(rec, start)
            result.freed_after_ms = record.freed_after_ms
            result.barge_in = step.kind in ("say", "wav") and expect.interrupts is not False
    reply = rec.events_of("response.created", start, window_end)
    if reply:
        created_at, created = reply[0]
        result.reply_response = created["response"]["id"]
        result.ttfb_ms = _ttfb_ms(rec, result.reply_response, created_at, end)
        result.reply_gap_ms = _longest_gap_ms(rec, result.reply_response)
        result.server_ttfa_ms = next((e["ttfa_ms"] for _, e in rec.events_of("duplex.metrics") if
                                      e.get("response_id") == result.reply_response and e.get("ttfa_ms") is not None),
                                     None)
    if expect.reply is False:
        result.took_over = bool(reply)
    if expect.interrupts is False:
        result.took_over = result.cut_response is not None
        if playing is not None and not result.took_over:
            after = rec.loud_heard(end, window_end)
            result.resume_ms = round(1000 * max(0.0, after[0] - end), 1) if after else None
    result.checks = _step_checks(scenario, step, record, result)
    return result


def _step_checks(scenario: Scenario, step: Step, record: StepRecord, r: StepResult) -> list[Check]:
    expect, checks = step.expect, []
    if record.onset is None and step.kind in ("say", "wav", "noise"):
        checks.append(Check("audible", False, "no frame of this step was loud enough to count as sound"))
    if expect.reply is True:
        if r.reply_response is None:
            checks.append(Check("reply", False, "the agent did not answer"))
        elif r.ttfb_ms is None:
            checks.append(Check("reply", False, f"response {r.reply_response} produced no audio the client heard"))
        else:
            checks.append(Check("reply", True, f"ttfb {r.ttfb_ms:.0f} ms"))
            if expect.max_ttfb_ms is not None:
                checks.append(Check("max_ttfb_ms", r.ttfb_ms <= expect.max_ttfb_ms,
                                    f"{r.ttfb_ms:.0f} ms (limit {expect.max_ttfb_ms:.0f})"))
            if expect.min_ttfb_ms is not None:
                checks.append(Check("min_ttfb_ms", r.ttfb_ms >= expect.min_ttfb_ms,
                                    f"{r.ttfb_ms:.0f} ms (at least {expect.min_ttfb_ms:.0f})"))
    elif expect.reply is False:
        checks.append(Check("no_reply", not r.took_over,
                            f"the agent answered ({r.reply_response})" if r.took_over else "no response"))
    if expect.interrupts is not None and not r.agent_speaking_at_onset:
        checks.append(Check("agent_speaking", False, "the agent was not speaking when this step began"))
    elif expect.interrupts is True:
        checks.append(Check("interrupts", r.cut_response is not None,
                            f"stopped after {r.stop_ms:.0f} ms" if r.cut_response else "the agent was not cut"))
        if expect.max_stop_ms is not None and r.stop_ms is not None:
            checks.append(Check("max_stop_ms", r.stop_ms <= expect.max_stop_ms,
                                f"{r.stop_ms:.0f} ms (limit {expect.max_stop_ms:.0f})"))
    elif expect.interrupts is False:
        talked_on = r.cut_response is None
        checks.append(Check("keeps_talking", talked_on,
                            "the agent talked on" if talked_on else f"the agent yielded ({r.cut_response} cut)"))
        if expect.max_resume_ms is not None and talked_on:
            resumed = r.resume_ms is not None and r.resume_ms <= expect.max_resume_ms
            checks.append(Check("max_resume_ms", resumed, f"{r.resume_ms} ms (limit {expect.max_resume_ms:.0f})"))
    if r.cut_response is not None and record.playing_ids is not None:
        if record.free_error:
            checks.append(Check("released", False, record.free_error))
        elif r.freed_after_ms is not None:
            limit = scenario.expect.abort_free_ms
            checks.append(Check("released", r.freed_after_ms <= limit,
                                f"every stage let go {r.freed_after_ms:.0f} ms after the cut (limit {limit:.0f})"))
    return checks


def _scenario_checks(scenario: Scenario, rec: Recording, false_cuts: int, exclusive: bool) -> list[Check]:
    expect, checks = scenario.expect, []
    checks.append(Check("ran", rec.error is None, rec.error or ""))
    if expect.max_false_interruptions is not None:
        checks.append(Check("false_interruptions", false_cuts <= expect.max_false_interruptions,
                            f"{false_cuts} (at most {expect.max_false_interruptions})"))
    if expect.responses is not None:
        created = len(rec.events_of("response.created"))
        checks.append(Check("responses", created == expect.responses, f"{created} (expected {expect.responses})"))
    if expect.min_echo_gated_frames is not None:
        gated = (rec.session_stats or {}).get("echo_gated_frames")
        checks.append(Check("echo_gated", gated is not None and gated >= expect.min_echo_gated_frames,
                            f"{gated} frames gated as echo (at least {expect.min_echo_gated_frames})"))
    if expect.idle_at_end and exclusive and rec.error is None:
        checks.append(Check("idle_at_end", bool(rec.idle_at_end), rec.idle_detail or "every stage empty"))
    if expect.no_errors:
        errors = [e.get("error", {}).get("message", "?") for _, e in rec.events_of("error")]
        checks.append(Check("no_errors", not errors, "; ".join(errors)))
    checks.append(Check("hang_up", rec.hangup_status == 204, f"DELETE answered {rec.hangup_status}"))
    return checks


def _next_onset(rec: Recording, index: int) -> float:
    later = [s.onset for s in rec.steps[index + 1:] if s.onset is not None]
    return later[0] if later else rec.finished_at


def _playing_response(rec: Recording, at: float) -> str | None:
    """The reply whose audio was playing at ``at``: started and neither stopped nor cleared."""
    started = rec.events_of("output_audio_buffer.started", until=at)
    if not started:
        return None
    response_id = started[-1][1]["response_id"]
    ended = [e for _, e in rec.events if e.get("response_id") == response_id and e.get("type") in (
        "output_audio_buffer.stopped", "output_audio_buffer.cleared")]
    ended_before = [a for a, e in rec.events if e in ended and a < at]
    return None if ended_before else response_id


def _cut_time(rec: Recording, response_id: str, since: float, until: float) -> float | None:
    for at, event in rec.events:
        if not since <= at < until:
            continue
        if event.get("type") == "output_audio_buffer.cleared" and event.get("response_id") == response_id:
            return at
        if event.get("type") == "response.done" and event["response"]["id"] == response_id \
                and event["response"]["status"] == "cancelled":
            return at
    return None


def _cuts(rec: Recording) -> dict[str, float]:
    """Every reply cut short, with when the client learnt of it."""
    cuts: dict[str, float] = {}
    for at, event in rec.events:
        if event.get("type") == "output_audio_buffer.cleared":
            cuts.setdefault(event["response_id"], at)
        elif event.get("type") == "response.done" and event["response"]["status"] == "cancelled":
            cuts.setdefault(event["response"]["id"], at)
    return cuts


def _is_false_cut(scenario: Scenario, rec: Recording, at: float) -> bool:
    """A cut is false unless it came during a step meant to interrupt, or during the caller's
    own speech that says nothing about interrupting (a new turn may cut a reply)."""
    owner = None
    for step, record in zip(scenario.steps, rec.steps):
        start = record.onset if record.onset is not None else record.queued_at
        end = record.end if record.end is not None else record.finished_at
        if step.kind != "pause" and start <= at < end + rec.silence_ms / 1000 + CUT_MARGIN_S:
            owner = step
    if owner is None:
        return True
    if owner.expect.interrupts is not None:
        return not owner.expect.interrupts
    return owner.kind == "noise"


def _stop_ms(rec: Recording, onset: float) -> float:
    # The next reply's audio can reach the client before its output_audio_buffer.started (RTP
    # and the data channel race on a loaded box), never before its response.created.
    next_reply = [at for kind in ("response.created", "output_audio_buffer.started")
                  for at, _ in rec.events_of(kind, since=onset)[:1]]
    cutoff = min([onset + STOP_WINDOW_S, *next_reply])
    loud = rec.loud_heard(onset, cutoff)
    return round(1000 * (max(loud) + FRAME_S - onset), 1) if loud else 0.0


def _ttfb_ms(rec: Recording, response_id: str, created_at: float, speech_end: float) -> float | None:
    started = [at for at, e in rec.events_of("output_audio_buffer.started", since=created_at)
               if e["response_id"] == response_id]
    if not started:
        return None
    loud = rec.loud_heard(created_at - FRAME_S, started[0] + 1.0)
    return round(1000 * (loud[0] - speech_end), 1) if loud else None


def _longest_gap_ms(rec: Recording, response_id: str) -> float | None:
    """The longest stretch without loud agent audio between the first and the last loud frame
    of a reply (its audio runs from output_audio_buffer.started to .stopped or .cleared)."""
    marks = [(at, e["type"]) for at, e in rec.events if e.get("response_id") == response_id]
    started = [at for at, kind in marks if kind == "output_audio_buffer.started"]
    if not started:
        return None
    ended = [at for at, kind in marks if kind in ("output_audio_buffer.stopped", "output_audio_buffer.cleared")]
    loud = rec.loud_heard(started[0] - FRAME_S, (ended[0] + FRAME_S) if ended else rec.finished_at)
    if len(loud) < 2:
        return None
    return round(1000 * max(b - a - FRAME_S for a, b in zip(loud, loud[1:])), 1)
