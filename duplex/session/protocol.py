"""Realtime client events applied to a session, and the session as Realtime describes it."""

from __future__ import annotations

import msgspec
from pydantic import ValidationError
from pydantic_core import ErrorDetails

from duplex.audio import SESSION_RATE
from duplex.config.session import SessionConfig
from duplex.runtime.contract import ToolSpec
from duplex.session.call_control import CallControlRefused
from duplex.session.call_tools import parse_call_tools
from duplex.session.realtime import events as ev
from duplex.session.realtime.client_items import ItemError, wants_audio
from duplex.session.realtime.tools import parse_tools
from duplex.session.recording import RecordingRefused
from duplex.session.session import VoiceSession
from duplex.session.states import CallState

MAX_EVENT_BYTES = 64 * 1024


def describe_session(session: VoiceSession, model: str) -> dict:
    vad = session.config.vad
    turn_detection: dict | None = {"type": "server_vad", "threshold": round(vad.aggressiveness / 3, 2),
                                   "prefix_padding_ms": vad.prefix_padding_ms,
                                   "silence_duration_ms": vad.silence_ms}
    if session.config.turn_detection == "none":
        turn_detection = None
    elif session.config.semantic_turns:
        turn_detection = {"type": "semantic_vad", "eagerness": session.config.semantic.eagerness,
                          "speculate_ms": session.config.semantic.speculate_at_ms,
                          "prefix_padding_ms": vad.prefix_padding_ms}
    return {"id": session.session_id, "object": "realtime.session", "type": "realtime", "model": model,
            "instructions": session.config.instructions,
            "output_modalities": ["audio"] if session.items.output_audio else ["text"],
            "preemptive_generation": session.config.preemptive_generation.model_dump(),
            "barge_in": session.config.barge_in.model_dump(),
            # ours: semantic_vad turns are judged by the sound of their end too (Smart Turn), or, on a
            # server without that model, by their words only
            "duplex_turn_end": {"audio_model": session.judge.model is not None},
            "recording": session.recording.active,  # ours: the caller is told they are recorded
            **session.tools.describe(),
            "audio": {"input": {"format": {"type": "audio/pcm", "rate": SESSION_RATE},
                                "turn_detection": turn_detection},
                      "output": {"format": {"type": "audio/pcm", "rate": session.playout.format.sample_rate},
                                 "voice": session.config.voice or None}}}


def announce_session(session: VoiceSession, model: str) -> None:
    """A door's first event, ``session.created``; then, if the opening settings asked for a
    recording the server's policy refused, the error that says why."""
    session.emit(ev.SessionCreated(session=describe_session(session, model)))
    refused, session.recording.refused = session.recording.refused, None
    if refused is not None:
        session.emit_error(refused.code, str(refused))


def apply_settings(config: SessionConfig, settings: ev.SessionSettings) -> SessionConfig:
    """A new config with the client's settings applied (raises ValueError if out of range)."""
    data = config.model_dump()
    if settings.instructions is not None:
        data["instructions"] = settings.instructions
    voice = settings.audio.output.voice if settings.audio is not None and settings.audio.output is not None else None
    if (voice := voice or settings.voice) is not None:
        data["voice"] = voice  # checked by the TTS stage against the voices its engine offers
    if settings.preemptive_generation is not None:
        preempt = settings.preemptive_generation
        data["preemptive_generation"].update({k: v for k, v in (("enabled", preempt.enabled),
                                                                 ("pause_ms", preempt.pause_ms)) if v is not None})
    if settings.barge_in is not None:
        data["barge_in"].update({k: v for k, v in msgspec.structs.asdict(settings.barge_in).items() if v is not None})
    detection = settings.turn_detection
    if settings.audio is not None and settings.audio.input is not None \
            and settings.audio.input.turn_detection is not msgspec.UNSET:
        detection = settings.audio.input.turn_detection
    if detection is None or (isinstance(detection, ev.TurnDetection) and detection.type == "none"):
        data["turn_detection"] = "none"
    elif isinstance(detection, ev.TurnDetection):
        if detection.type not in ("server_vad", "semantic_vad"):
            raise ValueError(f"turn_detection.type {detection.type!r}: server_vad, semantic_vad or none (null) "
                             f"are supported")
        for name in ("eagerness", "speculate_ms"):
            if getattr(detection, name) is not None and detection.type != "semantic_vad":
                raise ValueError(f"turn_detection.{name} applies to semantic_vad only")
        data["turn_detection"] = detection.type
        if detection.eagerness is not None:
            data["semantic"]["eagerness"] = detection.eagerness
        if detection.speculate_ms is not None:
            data["semantic"]["speculate_ms"] = detection.speculate_ms
        if detection.threshold is not None:
            if not 0.0 <= detection.threshold <= 1.0:
                raise ValueError("turn_detection.threshold must be within 0..1")
            data["vad"]["aggressiveness"] = round(detection.threshold * 3)
        if detection.prefix_padding_ms is not None:
            data["vad"]["prefix_padding_ms"] = detection.prefix_padding_ms
        if detection.silence_duration_ms is not None:
            data["vad"]["silence_ms"] = detection.silence_duration_ms
    try:
        return SessionConfig.model_validate(data)
    except ValidationError as exc:  # a ValueError already; this keeps the message short
        raise ValueError("; ".join(_where(e) + e["msg"] for e in exc.errors())) from None


def _where(error: ErrorDetails) -> str:
    return ".".join(map(str, error["loc"])) + ": " if error["loc"] else ""


def handle_client_message(session: VoiceSession, raw: str | bytes, model: str,
                          max_bytes: int = MAX_EVENT_BYTES) -> ev.AnyClientEvent | None:
    """One data-channel message. Bad input becomes an ``error`` event; the session goes on.
    Returns the event it applied (None if it was refused)."""
    if len(raw) > max_bytes:
        session.emit_error("event_too_large", f"event of {len(raw)} bytes; the limit is {max_bytes}")
        return None
    try:
        event = ev.decode_client_event(raw)
    except ev.ClientEventError as exc:
        session.emit_error(exc.code, str(exc), exc.event_id)
        return None
    try:
        _apply(session, event, model)
    except ItemError as exc:
        session.emit_error(exc.code, str(exc), event.event_id)
        return None
    return event


def _apply(session: VoiceSession, event: ev.AnyClientEvent, model: str) -> None:
    if isinstance(event, ev.SessionUpdate):
        _update(session, event, model)
    elif isinstance(event, ev.ResponseCreate):
        session.request_response(session.items.take(event.response))
    elif isinstance(event, ev.InputAppend):
        session.push_input(session.items.decode(event.audio))
    elif isinstance(event, ev.InputCommit):
        _commit(session)
    elif isinstance(event, ev.ItemCreate) and event.item.type == "function_call_output":
        _tool_output(session, event)
    elif isinstance(event, ev.ItemCreate):
        session.items.create(event)
    elif isinstance(event, ev.ItemDelete):
        session.items.delete(event.item_id)
    elif isinstance(event, (ev.ResponseCancel, ev.OutputClear)):
        if not session.cancel_response() and isinstance(event, ev.ResponseCancel):
            session.emit_error("response_cancel_not_active", "there is no response in progress", event.event_id)
    elif isinstance(event, ev.ItemTruncate):
        _truncate(session, event)
    elif isinstance(event, ev.InputClear):
        session.clear_input()
        session.items.clear_buffer()
        session.emit(ev.InputCleared())
    elif isinstance(event, (ev.CallEnd, ev.CallDtmf, ev.CallTransfer)):
        _call_request(session, event)


def _call_request(session: VoiceSession, event: ev.CallEnd | ev.CallDtmf | ev.CallTransfer) -> None:
    """The client asks something of the call (``call_tools.py``); what cannot be done is an error."""
    kind = type(event).__struct_config__.tag
    try:
        if isinstance(event, ev.CallEnd):
            session.calls.end(event.reason or "the client ended the call", event.after_reply)
        elif isinstance(event, ev.CallDtmf):
            session.calls.send_dtmf(event.digits)
        else:
            session.calls.transfer(event.target, event_id=event.event_id)
    except CallControlRefused as exc:
        session.emit_error("call_control_refused", f"{kind}: {exc}", event.event_id)
    except ValueError as exc:
        session.emit_error("invalid_call_request", f"{kind}: {exc}", event.event_id)


def _commit(session: VoiceSession) -> None:
    if session.config.turn_detection != "none":
        raise ItemError("input_audio_buffer_commit_empty", "with server_vad the server commits the input audio "
                                                           "buffer when speech stops; nothing is waiting")
    session.items.commit()


def _tool_output(session: VoiceSession, event: ev.ItemCreate) -> None:
    try:
        session.tools.output(event.item)
    except ValueError as exc:
        session.emit_error("invalid_function_call_output", str(exc), event.event_id)


def updated(config: SessionConfig, settings: ev.SessionSettings, tools: list[ToolSpec], call_tools: list[str]
            ) -> tuple[SessionConfig, list[ToolSpec] | None, str | None]:
    """What ``settings`` make of a session's config, functions and tool choice (None: unchanged),
    given its current ones: a ``session.update``, or the settings a placed call opens with. Raises
    ValueError naming what is wrong."""
    asked_call_tools = parse_call_tools(settings)
    specs, tool_choice = parse_tools(settings, tools, call_tools if asked_call_tools is None else asked_call_tools)
    config = apply_settings(config, settings)
    if asked_call_tools is not None:
        config = config.model_copy(update={"call_tools": asked_call_tools})
    return config, specs, tool_choice


def _update(session: VoiceSession, event: ev.SessionUpdate, model: str) -> None:
    try:
        config, tools, tool_choice = updated(session.config, event.session, session.tools.specs, session.calls.names)
    except ValueError as exc:
        session.emit_error("invalid_session_settings", str(exc), event.event_id)
        return
    if event.session.recording is not None:
        try:  # the rest of the update applies either way: a refused ask leaves the recording as it was
            session.recording.ask(event.session.recording)
        except RecordingRefused as exc:
            session.emit_error(exc.code, str(exc), event.event_id)
    session.reconfigure(config)
    session.tools.configure(tools, tool_choice)
    modalities = event.session.output_modalities or event.session.modalities
    session.items.output_audio = wants_audio(modalities, session.items.output_audio)
    session.emit(ev.SessionUpdated(session=describe_session(session, model)))


def _truncate(session: VoiceSession, event: ev.ItemTruncate) -> None:
    if event.item_id != session.playout.item_id or session.state is not CallState.AGENT_SPEAKING:
        session.emit_error("item_not_playing", f"item {event.item_id!r} is not being played", event.event_id)
        return
    session.cancel_response("client_truncated", audio_end_ms=event.audio_end_ms)
