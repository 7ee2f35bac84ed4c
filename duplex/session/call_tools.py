"""The call's own tools and keypad: what a conversation does with the call it is on.

- Built-in call tools, opt-in per session (``SessionConfig.call_tools``; a client switches them
  with ``session.update`` ``tools`` entries ``{"type": "duplex.call", "name": "end_call"}``):
  ``end_call``, ``send_dtmf`` (digits), ``transfer_call`` (target). Their specs go to the thinker
  with the client's functions; a call of one is done here, through the door's ``CallControl``,
  not sent to the client to answer (the client still sees the function_call item, and the
  result as a ``function_call_output`` item); the result joins the history.
- The same from the client: ``duplex.call.end`` / ``.dtmf`` / ``.transfer`` client events;
  what cannot be done is an ``error`` event naming why.
- Ending and transferring wait for the current reply to finish playing (``reply_over``, called
  by the session when a response is over; the agent says its line first) unless asked to end at
  once; a reply that never ends is cut after ``END_WAIT_S``.
- Keypad digits in: each one is a ``input_audio_buffer.dtmf_event_received`` event at once, and
  the conversation gets them grouped: digits less than ``keypad_gap_ms`` apart (1.5 s by default:
  someone keying a number presses a key every 0.3-0.8 s, so the gap closes a number, while a
  single "press 1" is answered within the gap) become one user text item, "[the caller pressed
  123#]", answered by a response as soon as the agent is not speaking or listening to speech.
  A flood is bounded: at most ``KEYPAD_RATE`` digits a second (burst ``KEYPAD_BURST``), at most
  ``MAX_GROUP`` in a group; the rest are dropped, counted and said once in an ``error`` event.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

import msgspec

from duplex.config.session import SessionConfig
from duplex.runtime.contract import ToolSpec
from duplex.session.call_control import CallControl, CallControlRefused, check_digits
from duplex.session.realtime import call_events as cev
from duplex.session.realtime import events as ev
from duplex.session.realtime.announce import Announcer
from duplex.session.realtime.client_items import ClientItems, ClientTurn, ItemError
from duplex.session.realtime.tools import BUILTIN_TYPE, SessionTools
from duplex.session.response import Response
from duplex.session.states import CallState

CALL_TOOL_TYPE = BUILTIN_TYPE  # {"type": "duplex.call", "name": "end_call"} in session.update tools
END_WAIT_S = 30.0  # a pending end waits at most this long for the reply to finish
KEYPAD_RATE = 10.0  # digits per second (RFC 4733 tones of 40 ms + 40 ms gaps allow 12.5)
KEYPAD_BURST = 32
MAX_GROUP = 32
MAX_TARGET = 256

SPECS = {
    "end_call": ToolSpec("end_call", "End the phone call. Say goodbye first: the call ends once your current "
                                     "reply has been heard.", {"type": "object", "properties": {}}),
    "send_dtmf": ToolSpec("send_dtmf", "Press keys on the phone keypad (DTMF tones), e.g. to choose in a phone "
                                       "menu or enter a number.",
                          {"type": "object", "properties": {"digits": {
                              "type": "string", "pattern": "^[0-9*#A-Da-d]{1,32}$",
                              "description": "the keys, in order: 0-9, *, #, A-D"}},
                           "required": ["digits"]}),
    "transfer_call": ToolSpec("transfer_call", "Transfer the caller to another number or SIP address. Tell "
                                               "the caller first.",
                              {"type": "object", "properties": {"target": {
                                  "type": "string", "description": "a phone number or a sip: URI"}},
                               "required": ["target"]}),
}


class CallToolResult(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What a call tool's ``function_call_output`` says (JSON)."""

    ok: bool
    detail: str
    digits: str | None = None


class CallHost(Protocol):
    """What call tools see of the session."""

    config: SessionConfig
    tell: Announcer
    items: ClientItems
    tools: SessionTools

    @property
    def response(self) -> Response | None: ...

    @property
    def state(self) -> CallState: ...

    def request_response(self, client: ClientTurn | None = None) -> None: ...


def parse_call_tools(settings: ev.SessionSettings) -> list[str] | None:
    """The call tools a ``session.update`` switches on (None: ``tools`` not given: unchanged);
    raises ValueError naming an unknown one."""
    if settings.tools is None:
        return None
    names = [tool.name for tool in settings.tools if tool.type == CALL_TOOL_TYPE]
    for name in names:
        if name not in SPECS:
            raise ValueError(f"tools: {CALL_TOOL_TYPE} tool {name!r} unknown; the call tools are {sorted(SPECS)}")
    clash = {tool.name for tool in settings.tools if tool.type == "function"} & set(names)
    if clash:
        raise ValueError(f"tools: {sorted(clash)} declared both as a function and as a call tool")
    return sorted(set(names))


class CallTools:
    def __init__(self, host: CallHost, control: CallControl,
                 spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task]) -> None:
        self._host = host
        self._control = control
        self._spawn = spawn
        self._ending: str | None = None  # the reason, while an end waits for the reply
        self._guard: asyncio.Task | None = None
        self._reply_waiters: list[asyncio.Future[None]] = []  # transfers waiting for the reply to be over
        self._group: list[str] = []  # digits of the group being keyed
        self._waiting: list[str] = []  # groups' digits closed while the agent was busy
        self._group_timer: asyncio.Task | None = None
        self._tokens, self._filled = float(KEYPAD_BURST), time.monotonic()
        self.keypad_dropped = 0

    def _reply_live(self) -> bool:
        """A response is being made or played, or the caller is speaking (a response follows)."""
        response = self._host.response
        return (response is not None and response.live) or self._host.state is CallState.USER_SPEAKING

    # -- the tools the thinker sees ---------------------------------------------------------------
    @property
    def names(self) -> list[str]:
        return list(self._host.config.call_tools)

    def specs(self) -> list[ToolSpec]:
        return [SPECS[name] for name in self.names]

    def describe(self) -> list[dict]:
        return [{"type": CALL_TOOL_TYPE, "name": name, "description": SPECS[name].description} for name in self.names]

    def run(self, call_id: str, name: str, arguments: str) -> None:
        """The model called call tool ``name``: do it; its result joins the history."""
        try:
            args = msgspec.json.decode(arguments or "{}")
            if not isinstance(args, dict):
                raise ValueError("the arguments are not a JSON object")
            if name == "end_call":
                self.end("the agent ended the call", after_reply=True)
                result = CallToolResult(ok=True, detail="the call ends once this reply has been heard")
            elif name == "send_dtmf":
                digits = self.send_dtmf(str(args.get("digits", "")), call_id)
                result = CallToolResult(ok=True, detail="sent", digits=digits)
            else:
                self.transfer(str(args.get("target", "")), call_id)
                return  # its result comes when the far end has answered
        except (ValueError, msgspec.DecodeError, CallControlRefused) as exc:
            result = CallToolResult(ok=False, detail=str(exc))
        self._host.tools.answer(call_id, msgspec.json.encode(result).decode(), speak=False)

    # -- ending the call ----------------------------------------------------------------------
    def end(self, reason: str, after_reply: bool = True) -> None:
        """End the call, once the current reply has played (``after_reply``) or now; raises
        CallControlRefused where the door cannot."""
        if self._ending is not None and after_reply:
            return  # already waiting
        self._host.tell.emit(cev.CallEnding(reason=reason, after_reply=after_reply and self._reply_live()))
        if after_reply and self._reply_live():
            self._ending = reason
            self._guard = self._spawn(self._end_anyway())
            return
        self._hang_up(reason)

    def reply_over(self) -> None:
        """A response is over (played out, failed or text only): a pending end or waiting
        digits go now."""
        if self._reply_live():
            return
        for waiter in self._reply_waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._reply_waiters.clear()
        if self._ending is not None:
            self._hang_up_reporting(self._ending)
        elif self._waiting:
            self._answer_digits()

    async def _end_anyway(self) -> None:
        await asyncio.sleep(END_WAIT_S)
        if self._ending is not None:
            self._hang_up_reporting(self._ending)

    def _hang_up(self, reason: str) -> None:
        self._ending = None
        if self._guard is not None and self._guard is not asyncio.current_task():
            self._guard.cancel()
        self._control.end(reason)

    def _hang_up_reporting(self, reason: str) -> None:
        try:
            self._hang_up(reason)
        except CallControlRefused as exc:
            self._host.tell.error("call_control_refused", str(exc))

    # -- keypad digits out, transfer ----------------------------------------------------------
    def send_dtmf(self, digits: str, call_id: str | None = None) -> str:
        """Raises ValueError (not keypad digits) or CallControlRefused."""
        digits = check_digits(digits)
        self._control.send_dtmf(digits)
        self._host.tell.emit(cev.DtmfSent(digits=digits, call_id=call_id))
        return digits

    def transfer(self, target: str, call_id: str | None = None, event_id: str | None = None) -> None:
        """Start a transfer; its outcome comes as an event (and the tool's result); ``event_id``:
        the client event that asked, named by a refusal's error."""
        target = target.strip()
        if not target or len(target) > MAX_TARGET or any(c.isspace() or not c.isprintable() for c in target):
            raise ValueError(f"transfer target {target[:40]!r}: 1-{MAX_TARGET} printable characters, no spaces")
        self._spawn(self._transfer(target, call_id, event_id))

    async def _after_reply(self) -> None:
        """Until the current reply has played (the agent says its line first), at most END_WAIT_S."""
        if not self._reply_live():
            return
        waiter = asyncio.get_running_loop().create_future()
        self._reply_waiters.append(waiter)
        try:
            await asyncio.wait_for(waiter, END_WAIT_S)
        except TimeoutError:
            pass

    async def _transfer(self, target: str, call_id: str | None, event_id: str | None) -> None:
        await self._after_reply()
        try:
            outcome = await self._control.transfer(target)
        except CallControlRefused as exc:
            self._host.tell.emit(cev.TransferDone(target=target, accepted=False, detail=str(exc), call_id=call_id))
            if call_id is None:
                self._host.tell.error("call_control_refused", f"duplex.call.transfer: {exc}", event_id)
            else:
                self._host.tools.answer(call_id, msgspec.json.encode(CallToolResult(ok=False, detail=str(exc)))
                                       .decode(), speak=False)
            return
        self._host.tell.emit(cev.TransferDone(target=target, accepted=outcome.accepted, status=outcome.status,
                                              detail=outcome.detail, call_id=call_id))
        if call_id is not None:
            result = CallToolResult(ok=outcome.accepted, detail=outcome.detail or str(outcome.status or ""))
            self._host.tools.answer(call_id, msgspec.json.encode(result).decode(), speak=not outcome.accepted)
            if not outcome.accepted and not self._reply_live():
                self._host.request_response()  # the call goes on with the agent: it says so

    # -- keypad digits in ---------------------------------------------------------------------
    def keypad(self, digit: str) -> None:
        """A digit the caller pressed (the door's leg parsed it); past the bounds it is dropped
        before anything is sent (a flood costs no event per digit)."""
        if not self._take_token() or len(self._group) + len(self._waiting) >= MAX_GROUP:
            self.keypad_dropped += 1
            if self.keypad_dropped == 1 or self.keypad_dropped % 100 == 0:
                self._host.tell.error("keypad_flood", f"keypad digits arrive faster than {KEYPAD_RATE:g}/s or "
                                                      f"more than {MAX_GROUP} wait; {self.keypad_dropped} dropped",
                                      kind="invalid_request_error")
            return
        self._host.tell.emit(cev.DtmfReceived(event=digit, received_at=round(time.time(), 3)))
        self._group.append(digit)
        if self._group_timer is not None:
            self._group_timer.cancel()
        self._group_timer = self._spawn(self._close_group())

    def _take_token(self) -> bool:
        now = time.monotonic()
        self._tokens = min(KEYPAD_BURST, self._tokens + (now - self._filled) * KEYPAD_RATE)
        self._filled = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True

    async def _close_group(self) -> None:
        await asyncio.sleep(self._host.config.keypad_gap_ms / 1000)
        self._group_timer = None
        self._waiting += self._group
        self._group = []
        if not self._reply_live():
            self._answer_digits()

    def _answer_digits(self) -> None:
        digits, self._waiting = "".join(self._waiting), []
        text = f"[the caller pressed {digits} on the keypad]"
        item = ev.ClientItem(type="message", role="user", content=[ev.ItemContent(type="input_text", text=text)])
        try:
            self._host.items.create(ev.ItemCreate(item=item))
        except ItemError as exc:  # a client's own audio item waits: the digits would mix with it
            self._host.tell.error("keypad_not_delivered", f"keypad digits {digits}: {exc}")
            return
        self._host.request_response(self._host.items.take(None))
