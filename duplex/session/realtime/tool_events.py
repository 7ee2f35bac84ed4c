"""Realtime server events of function calls (the rest are in ``events.py``)."""

from __future__ import annotations

import msgspec

from duplex.session.realtime.events import FunctionCallItem, ServerEvent


class FunctionCallOutputItem(msgspec.Struct, kw_only=True):
    id: str
    type: str = "function_call_output"
    call_id: str
    output: str


class CallItemAdded(ServerEvent, kw_only=True, tag="response.output_item.added"):
    response_id: str
    output_index: int
    item: FunctionCallItem


class CallItemDone(ServerEvent, kw_only=True, tag="response.output_item.done"):
    response_id: str
    output_index: int
    item: FunctionCallItem


class ArgumentsDelta(ServerEvent, kw_only=True, tag="response.function_call_arguments.delta"):
    response_id: str
    item_id: str
    output_index: int
    call_id: str
    delta: str


class ArgumentsDone(ServerEvent, kw_only=True, tag="response.function_call_arguments.done"):
    response_id: str
    item_id: str
    output_index: int
    call_id: str
    name: str
    arguments: str


class OutputItemAdded(ServerEvent, kw_only=True, tag="conversation.item.added"):
    item: FunctionCallOutputItem
    previous_item_id: str | None = None


class OutputFenced(ServerEvent, kw_only=True, tag="duplex.function_call_output.fenced"):
    """Ours: a barge-in came while the call was pending, so its result joins the history but the
    agent does not answer it (the caller has moved on)."""

    call_id: str
    item_id: str
