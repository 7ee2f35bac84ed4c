"""Function calling in a session: the tools a client declares, the calls the model makes, the
results the client sends back.

- ``session.update`` with ``tools`` (name, description, JSON-Schema ``parameters``, ``strict``)
  and ``tool_choice`` (auto | none | required | a function): checked here (a schema that is not
  JSON Schema, a choice naming no declared function: the update is refused with an error
  event), then carried by every request (``TurnRequest.tools``).
- A call from the model (``ToolCallDelta`` / ``ToolCallDone`` from the thinker) becomes
  ``response.output_item.added`` (a ``function_call`` item), ``response.function_call_arguments
  .delta`` / ``.done`` and ``response.output_item.done``; its item is listed in ``response.done``.
  The call is then pending until the client answers it.
- The client's ``conversation.item.create`` with a ``function_call_output`` (an unknown or
  already answered ``call_id`` is an error event) waits for the next request, which carries it
  to the thinker (``TurnRequest.tool_outputs``); the client's ``response.create`` then has the
  agent speak the result.
- A barge-in (the caller starts speaking) while a call is pending fences it: its late result
  still joins the history (``ToolOutput.speak`` False), but no response answers it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import jsonschema
import msgspec

from duplex.runtime.contract import ToolCallDelta, ToolCallDone, ToolOutput, ToolSpec, TurnRequest
from duplex.session.realtime import events as ev
from duplex.session.realtime import tool_events as tev
from duplex.session.realtime.announce import Announcer
from duplex.session.response import Response

MAX_CALLS = 256  # calls remembered per session (to answer, or to refuse a duplicate answer)
_CHOICES = ("auto", "none", "required")


@dataclass
class _Call:
    call_id: str
    name: str
    item_id: str
    response_id: str
    output_index: int
    arguments: str = ""
    done: bool = False
    fenced: bool = False
    answered: bool = False

    def item(self, status: ev.ItemStatus) -> ev.FunctionCallItem:
        return ev.FunctionCallItem(id=self.item_id, status=status, call_id=self.call_id, name=self.name,
                                   arguments=self.arguments if status == "completed" else "")


class BuiltinTools(Protocol):
    """Functions the session does itself (the call's: ``call_tools.py``), beside the client's."""

    @property
    def names(self) -> list[str]: ...

    def specs(self) -> list[ToolSpec]: ...

    def describe(self) -> list[dict]: ...

    def run(self, call_id: str, name: str, arguments: str) -> None: ...


BUILTIN_TYPE = "duplex.call"  # a ``tools`` entry of this type switches on a built-in call tool


def parse_tools(settings: ev.SessionSettings, current: list[ToolSpec],
                builtin: Sequence[str] = ()) -> tuple[list[ToolSpec] | None, str | None]:
    """The tools and tool choice ``settings`` set (None: unchanged); raises ValueError naming what
    is wrong. ``builtin``: the built-in tools on after this update (tool_choice may name them)."""
    specs = None
    if settings.tools is not None:
        specs = [_spec(i, tool) for i, tool in enumerate(settings.tools) if tool.type != BUILTIN_TYPE]
        names = [spec.name for spec in specs]
        if len(set(names)) != len(names):
            raise ValueError(f"tools: duplicate function names in {names}")
    choice = settings.tool_choice
    name = choice if isinstance(choice, str) or choice is None else choice.name
    if name is not None and name not in _CHOICES:
        known = [spec.name for spec in (specs if specs is not None else current)] + list(builtin)
        if name not in known:
            raise ValueError(f"tool_choice {name!r}: not one of auto, none, required or a declared function {known}")
    return specs, name


def _spec(index: int, tool: ev.ToolDefinition) -> ToolSpec:
    where = f"tools[{index}]"
    if tool.type != "function":
        raise ValueError(f"{where}.type {tool.type!r}: only function tools are supported")
    if not tool.name or len(tool.name) > 64 or not all(c.isalnum() or c in "_-" for c in tool.name):
        raise ValueError(f"{where}.name {tool.name!r}: 1-64 letters, digits, _ or -")
    parameters = tool.parameters or {"type": "object", "properties": {}}
    try:
        jsonschema.validators.validator_for(parameters).check_schema(parameters)
    except jsonschema.SchemaError as exc:
        path = "/".join(map(str, exc.path)) or "(root)"
        raise ValueError(f"{where} ({tool.name}).parameters is not a valid JSON Schema at {path}: "
                         f"{exc.message}") from None
    if parameters.get("type") != "object":
        raise ValueError(f"{where} ({tool.name}).parameters: the arguments must be an object schema "
                         f"(type: object), got type {parameters.get('type')!r}")
    return ToolSpec(name=tool.name, description=tool.description, parameters=parameters, strict=tool.strict)


class SessionTools:
    def __init__(self, tell: Announcer, new_item_id: Callable[[], str]) -> None:
        self._tell = tell
        self._emit = tell.emit
        self._new_item_id = new_item_id
        self.specs: list[ToolSpec] = []
        self.choice = "auto"
        self._calls: OrderedDict[str, _Call] = OrderedDict()
        self._outputs: list[ToolOutput] = []  # for the next request
        self.builtin: BuiltinTools | None = None

    # -- settings -------------------------------------------------------------------------------
    def configure(self, specs: list[ToolSpec] | None, choice: str | None) -> None:
        if specs is not None:
            self.specs = specs
        if choice is not None:
            self.choice = choice

    def describe(self) -> dict:
        builtin = self.builtin.describe() if self.builtin is not None else []
        return {"tools": [{"type": "function", "name": s.name, "description": s.description,
                           "parameters": s.parameters, "strict": s.strict} for s in self.specs] + builtin,
                "tool_choice": self.choice}

    def attach(self, request: TurnRequest) -> TurnRequest:
        """``request`` with the session's tools and the results waiting for it."""
        outputs, self._outputs = self._outputs, []
        specs = self.specs + (self.builtin.specs() if self.builtin is not None else [])
        if not specs and not outputs:
            return request
        return msgspec.structs.replace(request, tools=specs, tool_choice=self.choice, tool_outputs=outputs)

    # -- the model's calls ----------------------------------------------------------------------
    def on_call(self, response: Response, event: ToolCallDelta | ToolCallDone) -> None:
        call = self._calls.get(event.call_id)
        if call is None:
            call = self._open(response, event.call_id, event.name)
        if isinstance(event, ToolCallDelta):
            call.arguments += event.delta
            if event.delta:
                self._emit(tev.ArgumentsDelta(response_id=call.response_id, item_id=call.item_id,
                                              output_index=call.output_index, call_id=call.call_id, delta=event.delta))
            return
        call.arguments, call.done = event.arguments, True
        self._emit(tev.ArgumentsDone(response_id=call.response_id, item_id=call.item_id, output_index=call.output_index,
                                     call_id=call.call_id, name=call.name, arguments=call.arguments))
        item = call.item("completed")
        self._emit(tev.CallItemDone(response_id=call.response_id, output_index=call.output_index, item=item))
        self._tell.call_listed(response, item)
        if self.builtin is not None and call.name in self.builtin.names:
            self.builtin.run(call.call_id, call.name, call.arguments)  # the session's own: done here

    def _open(self, response: Response, call_id: str, name: str) -> _Call:
        index = 1 + sum(1 for c in self._calls.values() if c.response_id == response.id)  # 0: the message item
        call = _Call(call_id, name, self._new_item_id(), response.id, index)
        self._calls[call_id] = call
        while len(self._calls) > MAX_CALLS:
            self._calls.popitem(last=False)
        self._emit(tev.CallItemAdded(response_id=response.id, output_index=index, item=call.item("in_progress")))
        return call

    def fence(self) -> None:
        """The caller barged in: calls still waiting for their result will not be answered aloud."""
        for call in self._calls.values():
            if call.done and not call.answered:
                call.fenced = True

    # -- the client's results -------------------------------------------------------------------
    def output(self, item: ev.ClientItem) -> None:
        """A ``function_call_output`` item; raises ValueError (unknown or answered call)."""
        call_id, output = item.call_id or "", item.output
        call = self._calls.get(call_id)
        if call is None or not call.done:
            raise ValueError(f"function_call_output: unknown call_id {call_id!r} (no finished call of the model "
                             f"has it)")
        if call.answered:
            raise ValueError(f"function_call_output: call {call_id!r} was already answered")
        if output is None:
            raise ValueError(f"function_call_output for {call_id!r} has no 'output'")
        if self.builtin is not None and call.name in self.builtin.names:
            raise ValueError(f"function_call_output: call {call_id!r} is of {call.name}, which the server does "
                             f"itself (a call tool)")
        self.answer(call_id, output, item.id)

    def answer(self, call_id: str, output: str, item_id: str | None = None, speak: bool = True) -> None:
        """The result of a finished call (the client's, or a built-in tool's): it joins the next
        request; ``speak``: a response may answer it (unless a barge-in fenced the call)."""
        call = self._calls.get(call_id)
        if call is None or call.answered:
            return
        call.answered = True
        self._outputs.append(ToolOutput(call_id=call_id, output=output, speak=speak and not call.fenced))
        item_id = item_id or self._new_item_id()
        self._emit(tev.OutputItemAdded(item=tev.FunctionCallOutputItem(id=item_id, call_id=call_id, output=output),
                                       previous_item_id=call.item_id))
        if call.fenced:
            self._emit(tev.OutputFenced(call_id=call_id, item_id=item_id))
