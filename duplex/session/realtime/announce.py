"""What a session tells its client, as Realtime events: one method per thing that happened, so
the session says *what* happened and this module alone knows *how* the Realtime API spells it
(event types, ids, the response and item resources of ``events.py``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from duplex.runtime.contract import Transcript
from duplex.session.endpoint import TurnJudgement
from duplex.session.overlap import OverlapKind, OverlapVerdict
from duplex.session.realtime import events as ev
from duplex.session.realtime import item_events as iev
from duplex.session.response import Response


class Announcer:
    def __init__(self, session_id: str, send: Callable[[ev.ServerEvent], None]) -> None:
        self._tag = session_id[-6:]
        self._send = send
        self._count = 0
        self._calls: dict[str, list[ev.FunctionCallItem]] = {}  # per response: listed in its response.done

    def emit(self, event: ev.ServerEvent) -> None:
        self._count += 1
        event.event_id = f"event_{self._tag}_{self._count}"
        self._send(event)

    def error(self, code: str, message: str, event_id: str | None = None,
              kind: str = "invalid_request_error") -> None:
        self.emit(ev.ErrorEvent(error=ev.ErrorDetail(type=kind, code=code, message=message, event_id=event_id)))

    def state(self, state: str) -> None:
        self.emit(ev.StateChanged(state=state))

    # -- the caller's turn ----------------------------------------------------------------------
    def speech_started(self, user_item: str, onset_ms: int) -> None:
        self.emit(ev.SpeechStarted(audio_start_ms=onset_ms, item_id=user_item))

    def turn_committed(self, user_item: str, end_ms: int) -> None:
        self.emit(ev.SpeechStopped(audio_end_ms=end_ms, item_id=user_item))
        self.emit(ev.InputCommitted(item_id=user_item))
        self.emit(ev.ItemAdded(item=ev.user_audio_item(user_item)))

    def turn_judged(self, user_item: str, judgement: TurnJudgement) -> None:
        probability = None if judgement.probability is None else round(judgement.probability, 3)
        self.emit(ev.TurnJudged(item_id=user_item, audio_end_ms=judgement.pause_end_ms, probability=probability,
                                words_hang=judgement.words_hang, words_ask=judgement.words_ask,
                                words_open=judgement.words_open, complete=judgement.complete))

    def user_transcript(self, user_item: str, transcript: Transcript) -> None:
        if transcript.final:
            self.emit(ev.TranscriptionCompleted(item_id=user_item, transcript=transcript.text))
        else:
            self.emit(ev.TranscriptionDelta(item_id=user_item, delta=transcript.text))

    # -- preemptive generation ------------------------------------------------------------------
    def speculation_started(self, response: Response, audio_end_ms: int) -> None:
        self.emit(ev.PreemptiveStarted(item_id=response.user_item_id or "", request_id=response.turn.request_id,
                                       audio_end_ms=audio_end_ms))

    def speculation_cancelled(self, response: Response, resumed_ms: int) -> None:
        self.emit(ev.PreemptiveCancelled(item_id=response.user_item_id or "", request_id=response.turn.request_id,
                                         audio_start_ms=resumed_ms, reason="speech_resumed"))

    def speculation_committed(self, response: Response, audio_ready_ms: int) -> None:
        self.emit(ev.PreemptiveCommitted(item_id=response.user_item_id or "", request_id=response.turn.request_id,
                                         response_id=response.id, audio_ready_ms=audio_ready_ms))

    # -- a response -----------------------------------------------------------------------------
    def response_created(self, response: Response) -> None:
        self.emit(ev.ResponseCreated(response=self._resource(response, "in_progress")))
        self.emit(ev.OutputItemAdded(response_id=response.id,
                                     item=ev.assistant_item(response.item_id, "", "in_progress")))

    def agent_text(self, response: Response, delta: str) -> None:
        if response.text_only:
            self.emit(iev.TextDelta(response_id=response.id, item_id=response.item_id, delta=delta))
        else:
            self.emit(ev.AudioTranscriptDelta(response_id=response.id, item_id=response.item_id, delta=delta))

    def response_completed(self, response: Response) -> None:
        text = "".join(response.transcript)
        if response.text_only:
            self.emit(iev.TextDone(response_id=response.id, item_id=response.item_id, text=text))
        else:
            self.emit(ev.AudioTranscriptDone(response_id=response.id, item_id=response.item_id, transcript=text))
        self.emit(ev.ResponseDone(response=self._resource(response, "completed")))

    def response_failed(self, response: Response, error: str | None) -> None:
        details = ev.StatusDetails(type="failed", error=error)
        self.emit(ev.ResponseDone(response=self._resource(response, "failed", details)))

    def response_cancelled(self, response: Response, reason: str) -> None:
        details = ev.StatusDetails(type="cancelled", reason=reason)
        self.emit(ev.ResponseDone(response=self._resource(response, "cancelled", details)))

    # -- its audio ------------------------------------------------------------------------------
    def audio_started(self, response: Response) -> None:
        self.emit(ev.OutputAudioStarted(response_id=response.id))
        b = response.breakdown
        if b is None:
            self.emit(ev.TurnMetrics(response_id=response.id, ttfa_ms=response.ttfa_ms))
            return
        self.emit(ev.TurnMetrics(response_id=response.id, ttfa_ms=b.ttfa_ms, end_of_turn_ms=b.end_of_turn_ms,
                                 asr_tail_ms=b.asr_tail_ms, first_token_ms=b.first_token_ms,
                                 first_phrase_ms=b.first_phrase_ms, tts_first_chunk_ms=b.tts_first_chunk_ms,
                                 playout_ms=b.playout_ms))

    def audio_stopped(self, response: Response) -> None:
        self.emit(ev.OutputAudioStopped(response_id=response.id))

    def audio_cut(self, response: Response, heard_ms: int, heard_text: str | None) -> None:
        self.emit(ev.OutputAudioCleared(response_id=response.id))
        self.emit(ev.ItemTruncated(item_id=response.item_id, audio_end_ms=heard_ms, transcript=heard_text))

    def paused(self, response: Response, played_ms: int, onset_ms: int) -> None:
        self.emit(ev.ResponsePaused(response_id=response.id, item_id=response.item_id, audio_end_ms=played_ms,
                                    audio_start_ms=onset_ms))

    def resumed(self, response: Response, played_ms: int, verdict: OverlapVerdict) -> None:
        kind: Literal["backchannel", "noise"] = "noise" if verdict.kind is OverlapKind.NOISE else "backchannel"
        self.emit(ev.ResponseResumed(response_id=response.id, item_id=response.item_id, kind=kind,
                                     audio_end_ms=played_ms, overlap_ms=verdict.span_ms, voiced_ms=verdict.voiced_ms,
                                     transcript=verdict.words))

    def overlap_judged(self, response: Response, verdict: OverlapVerdict) -> None:
        self.emit(ev.OverlapJudged(response_id=response.id, kind=verdict.kind.value,
                                   decided_by="sound" if verdict.words is None else "words",
                                   transcript=verdict.words, audio_start_ms=verdict.onset_ms,
                                   overlap_ms=verdict.span_ms, voiced_ms=verdict.voiced_ms))

    def barge_in(self, response: Response, stop_ms: float) -> None:
        self.emit(ev.TurnMetrics(response_id=response.id, barge_in_ms=round(stop_ms, 1)))

    def call_listed(self, response: Response, item: ev.FunctionCallItem) -> None:
        """A finished function call of the model (tools.py), to list in its response's ``response.done``."""
        self._calls.setdefault(response.id, []).append(item)

    def _resource(self, response: Response, status: ev.ResponseStatus,
                  details: ev.StatusDetails | None = None) -> ev.ResponseResource:
        usage = None if status == "in_progress" else _usage(response)
        resource = ev.response_resource(response.id, response.item_id, "".join(response.transcript), status, details,
                                        response.text_only, usage)
        if status != "in_progress":
            resource.output.extend(self._calls.pop(response.id, []))  # the model's function calls (tools.py)
        return resource


def _usage(response: Response) -> ev.Usage:
    """Counted in the units ``ev.Usage`` names: text deltas, words, 20 ms frames of agent audio."""
    text, audio = len(response.transcript), round(response.audio_received_ms / 20)
    return ev.Usage(total_tokens=response.input_words + text + audio, input_tokens=response.input_words,
                    output_tokens=text + audio, input_token_details=ev.TokenDetails(text_tokens=response.input_words),
                    output_token_details=ev.TokenDetails(text_tokens=text, audio_tokens=audio))
