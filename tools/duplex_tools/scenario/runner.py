"""Plays one scenario against a live server as a real WebRTC client (aiortc), in real time, and
records both directions. Judging what happened is measure.py's job; this only drives and logs.

``exclusive`` says the scenario has the server to itself: only then does "every stage is empty"
at the end say something about this scenario. That an aborted response left every stage is
checked either way (the server's session stats name the session's runtime request).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import httpx
import numpy as np

from duplex_tools.client import RATE, RealtimeClient
from duplex_tools.scenario.audio import loud_span, step_audio
from duplex_tools.scenario.model import Scenario, Step, Trigger
from duplex_tools.scenario.recording import Recording, RecordingMic, StepRecord
from duplex_tools.scenario.server_stats import ServerStats, StatsError

FRAME_S = 0.02
LOUD_RMS = 0.01  # agent audio at least this loud counts as speech heard
# after the event saying a reply's audio ended, its last frames may still be on the way (RTP and
# the data channel race, more so on a loaded box): a wait for more audio gives up only after this
AUDIO_TAIL_S = 2.0
CANCEL_EVENTS = ("conversation.item.truncated", "output_audio_buffer.cleared")
SETTLE_TIMEOUT_S = 40.0
CUT_WINDOW_S = 1.5  # a cut belongs to a step until this long after its end and the end-of-turn silence


class TriggerTimeout(RuntimeError):
    pass


async def run_scenario(scenario: Scenario, url: str, exclusive: bool = True,
                       log: Callable[[str], None] = lambda _: None) -> Recording:
    call = _ScenarioCall(scenario, url, exclusive)
    try:
        await call.run(log)
    except (TimeoutError, TriggerTimeout, StatsError, RuntimeError, OSError, httpx.HTTPError) as exc:
        call.recording.error = call.recording.error or f"{call.phase}: {type(exc).__name__}: {exc or 'timed out'}"
    finally:
        await call.close()
    return call.recording


class _ScenarioCall:
    """One call: the client, the server's stats, and the recording being filled."""

    def __init__(self, scenario: Scenario, url: str, exclusive: bool) -> None:
        self.scenario = scenario
        self.exclusive = exclusive
        self.recording = Recording(scenario.name)
        self.client = RealtimeClient(url)
        self.mic = RecordingMic(scenario.echo_gain)
        self.client.mic = self.mic
        self.stats = ServerStats(url)
        self.watchers: list[asyncio.Task] = []
        self.phase = "connecting"  # what the call was doing, for error messages

    async def run(self, log: Callable[[str], None]) -> None:
        scenario, recording = self.scenario, self.recording
        audio = [step_audio(scenario, step, seed=index) for index, step in enumerate(scenario.steps)]
        await self.client.connect(session=scenario.session)
        recording.started_at = time.monotonic()
        created = self.client.of_type("session.created")[0]["session"]
        recording.session_id = created["id"]
        detection = created.get("audio", {}).get("input", {}).get("turn_detection") or {}
        recording.silence_ms = int(detection.get("silence_duration_ms", recording.silence_ms))
        for index, (step, samples) in enumerate(zip(scenario.steps, audio)):
            self.phase = f"step {index + 1} ({step.title!r})"
            log(f"  {scenario.name}: {self.phase}")
            record = await self._play_step(index, step, samples)
            recording.steps.append(record)
            if record.trigger_error:
                recording.error = record.trigger_error
                return
        self.phase = "waiting for the conversation to end"
        await asyncio.gather(*self.watchers)
        await self._settle()

    async def close(self) -> None:
        for watcher in self.watchers:
            watcher.cancel()
        await asyncio.gather(*self.watchers, return_exceptions=True)
        recording, client = self.recording, self.client
        recording.hangup_status = await _hang_up(client)
        recording.sent = list(self.mic.sent)
        recording.heard = [(h.at, h.rms, h.pts) for h in client.heard]
        recording.events = list(client.events)
        recording.finished_at = time.monotonic()
        if self.exclusive and recording.error is None:
            try:
                await self.stats.wait_idle(timeout=10.0, no_sessions=True)
                if recording.idle_at_end is None:  # hung up once judged: the check made after the hang-up
                    recording.idle_at_end = True
            except (StatsError, httpx.HTTPError) as exc:
                recording.idle_at_end = False
                recording.idle_detail = f"after hang-up: {exc}"
        await self.stats.close()

    async def _play_step(self, index: int, step: Step, samples: np.ndarray) -> StepRecord:
        previous = max((s.queued_at for s in self.recording.steps), default=self.recording.started_at)
        trigger_error = None
        if step.at is not None:
            try:
                await self._wait_trigger(step.at, previous)
            except TriggerTimeout as exc:
                trigger_error = f"step {index + 1} ({step.title!r}): {exc}"
        now = time.monotonic()
        record = StepRecord(index=index, kind=step.kind, title=step.title, queued_at=now, finished_at=now,
                            trigger_error=trigger_error)
        if trigger_error:
            return record
        if step.kind != "pause":
            record.playing_ids = await self.stats.playing_request_ids(self.recording.session_id, self.exclusive)
        clip = self.client.mic.play(samples, RATE)
        record.queued_at = time.monotonic()
        if record.playing_ids is not None:
            until = record.queued_at + len(samples) / RATE + self.recording.silence_ms / 1000 + CUT_WINDOW_S
            self.watchers.append(asyncio.create_task(self._watch_release(record, until)))
        await asyncio.wait_for(clip.ended.wait(), timeout=len(samples) / RATE + 10.0)
        record.finished_at = time.monotonic()
        span = loud_span(samples)
        if span is not None and clip.onset_sent is not None:
            record.onset = clip.onset_sent
            record.end = clip.onset_sent + (span[1] - span[0] + 1) * FRAME_S
        return record

    async def _wait_trigger(self, trigger: Trigger, previous: float) -> None:
        client = self.client
        try:
            if trigger.after_s is not None:
                await asyncio.sleep(trigger.after_s)
            elif trigger.agent_heard_s is not None:
                started = await client.wait_event("output_audio_buffer.started", timeout=trigger.timeout_s,
                                                  after=previous)
                await self._wait_heard(client.time_of(started), trigger.agent_heard_s, trigger.timeout_s,
                                       started["response_id"])
            else:  # the session went back to idle after the previous step began: the agent has finished
                await client.wait_event("duplex.state", timeout=trigger.timeout_s, after=previous, state="idle")
        except TimeoutError as exc:
            raise TriggerTimeout(f"trigger {trigger.model_dump(exclude_defaults=True)} did not happen "
                                 f"within {trigger.timeout_s:g} s" + (f" ({exc})" if str(exc) else "")) from None

    async def _wait_heard(self, since: float, seconds: float, timeout: float, response_id: str) -> None:
        """Until ``seconds`` of loud agent audio arrived after ``since`` (each frame looked at
        once: many callers share one event loop in `duplex bench load`). A reply whose audio
        ended shorter fails the wait then, with what it said, not at the timeout."""
        deadline, cursor, loud = time.monotonic() + timeout, 0, 0
        seen, ended = 0, None
        while loud * FRAME_S < seconds:
            heard = self.client.heard
            loud += sum(1 for h in heard[cursor:] if h.at >= since and h.rms > LOUD_RMS)
            cursor = len(heard)
            if loud * FRAME_S >= seconds:
                return
            events = self.client.events
            if ended is None:
                ended = next((at for at, e in events[seen:] if e.get("response_id") == response_id
                              and e.get("type") in ("output_audio_buffer.stopped", "output_audio_buffer.cleared")),
                             None)
                seen = len(events)
            if ended is not None and time.monotonic() > ended + AUDIO_TAIL_S:
                raise TimeoutError(f"the reply ended after {loud * FRAME_S:.2f} s of agent audio: "
                                   f"{self._said(response_id)!r}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {loud * FRAME_S:.2f} s of agent audio within {timeout:g} s")
            await asyncio.sleep(FRAME_S)

    def _said(self, response_id: str) -> str:
        done = [e for e in self.client.of_type("response.output_audio_transcript.done")
                if e.get("response_id") == response_id]
        return done[0].get("transcript", "") if done else "(no transcript yet)"

    async def _watch_release(self, record: StepRecord, until: float) -> None:
        """If the response playing when the step began is cut during the step, time how long
        its runtime requests stay in any stage after the cut reached the client."""
        cut_at, cursor = None, 0
        while cut_at is None and time.monotonic() < until:
            events = self.client.events
            cut_at = next((at for at, e in events[cursor:] if at >= record.queued_at and _is_cut(e)), None)
            cursor = len(events)
            if cut_at is None:
                await asyncio.sleep(FRAME_S)
        if cut_at is None:
            return
        if not record.playing_ids:
            record.freed_after_ms = 0.0
            return
        timeout = max(3.0, 3 * self.scenario.expect.abort_free_ms / 1000)
        try:
            released = await self.stats.wait_released(record.playing_ids, timeout)
            record.freed_after_ms = round(max(0.0, released - cut_at) * 1000, 1)
        except StatsError as exc:
            record.free_error = str(exc)

    async def _settle(self) -> None:
        """Wait until the conversation is over: the session idle and nothing changing for longer
        than the end-of-turn silence (so a late reply would still have shown up); then read the
        server's view of our session and, if the server is ours alone, check every stage is empty."""
        recording, client = self.recording, self.client
        quiet_s = recording.silence_ms / 1000 + 0.8
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while True:
            states = [(at, e["state"]) for at, e in client.events if e.get("type") == "duplex.state"]
            idle = not states or states[-1][1] == "idle"
            since = max(states[-1][0] if states else 0.0, recording.steps[-1].finished_at)
            if idle and time.monotonic() - since >= quiet_s:
                break
            if self.scenario.hang_up == "judged" and self._judged():
                return
            if time.monotonic() > deadline:
                last = ", ".join(f"{at - recording.started_at:.2f} {_brief(e)}" for at, e in client.events[-16:])
                raise TriggerTimeout(f"the conversation did not go quiet within {SETTLE_TIMEOUT_S:g} s "
                                     f"(state {states[-1][1] if states else 'idle'}); its last events: {last}")
            await asyncio.sleep(FRAME_S * 5)
        current = await self.stats.get()
        recording.session_stats = current.get("sessions", {}).get("sessions", {}).get(recording.session_id)
        if self.exclusive:
            try:
                await self.stats.wait_idle(timeout=5.0)
                recording.idle_at_end = True
            except StatsError as exc:
                recording.idle_at_end = False
                recording.idle_detail = str(exc)


    def _judged(self) -> bool:
        """The last step's outcome is known: its window for a cut closed (as the release watcher
        waits it out) and, unless it was meant to be talked through, a reply after it was heard."""
        step, record = self.scenario.steps[-1], self.recording.steps[-1]
        if time.monotonic() < record.finished_at + self.recording.silence_ms / 1000 + CUT_WINDOW_S:
            return False
        if step.expect.interrupts is False and not step.expect.reply:
            return True
        since = record.onset if record.onset is not None else record.queued_at
        created = [at for at, e in self.client.events if at >= since and e.get("type") == "response.created"]
        return bool(created) and any(h.at >= created[0] and h.rms > LOUD_RMS for h in reversed(self.client.heard))


def _brief(event: dict) -> str:
    """An event's type, with the field that says most about it."""
    kind = str(event.get("type"))
    error = event.get("error")
    detail = error.get("message") if isinstance(error, dict) else None
    detail = detail or event.get("state") or event.get("kind") or event.get("complete") or event.get("transcript")
    return f"{kind}({detail})" if detail not in (None, "") else kind


def _is_cut(event: dict) -> bool:
    kind = event.get("type")
    return kind in CANCEL_EVENTS or (kind == "response.done" and event["response"]["status"] == "cancelled")


async def _hang_up(client: RealtimeClient) -> int | None:
    try:
        return await client.hang_up()
    except Exception:  # the call may already be gone; the recording says so via the status
        await client.close()
        return None
