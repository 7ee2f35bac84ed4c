"""Tools the server calls itself, for callers with no data channel (a SIP or Twilio call).

Declared in the pipeline config (the engine thinker's ``args.server_tools``), each with the URL
the server POSTs the model's arguments to, as JSON. The reply's body goes back to the model as
the call's result and the model answers it aloud. A failure (timeout, refused, HTTP >= 400) is
not retried: the caller hears the tool's ``fallback`` sentence and the model sees the error.
Only URLs that start with an entry of ``url_allowlist`` may be declared: a config names where
its calls may go, and a typo cannot send a caller's data elsewhere.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field, model_validator

log = logging.getLogger("duplex.engine")
MAX_REPLY_BYTES = 16 * 1024  # a tool's reply goes into the prompt: keep it small


class ServerTool(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    strict: bool = False
    url: str
    timeout_s: float = Field(5.0, gt=0)
    fallback: str = "Sorry, I could not do that just now."


class ServerTools(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tools: list[ServerTool] = Field(default_factory=list)
    url_allowlist: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _allowed(self) -> ServerTools:
        for tool in self.tools:
            if not any(tool.url.startswith(prefix) for prefix in self.url_allowlist):
                raise ValueError(f"server tool {tool.name!r}: url {tool.url!r} is not in url_allowlist "
                                 f"{self.url_allowlist}")
        names = [tool.name for tool in self.tools]
        if len(set(names)) != len(names):
            raise ValueError(f"server tools: duplicate names in {names}")
        return self

    def by_name(self) -> dict[str, ServerTool]:
        return {tool.name: tool for tool in self.tools}


@dataclass(frozen=True)
class ToolResult:
    output: str  # for the model
    ok: bool  # False: say the fallback


async def call_server_tool(client: httpx.AsyncClient, tool: ServerTool, arguments: str) -> ToolResult:
    try:
        payload = json.loads(arguments or "{}")
    except json.JSONDecodeError as exc:
        return ToolResult(f"error: the arguments are not JSON ({exc})", ok=False)
    try:
        reply = await client.post(tool.url, json=payload, timeout=tool.timeout_s)
    except httpx.TimeoutException:
        log.info("server tool %s: no reply from %s within %.1f s", tool.name, tool.url, tool.timeout_s)
        return ToolResult(f"error: {tool.url} did not answer within {tool.timeout_s:g} s", ok=False)
    except httpx.HTTPError as exc:
        log.info("server tool %s: %s failed: %s", tool.name, tool.url, exc)
        return ToolResult(f"error: {tool.url} failed: {exc}", ok=False)
    body = reply.text[:MAX_REPLY_BYTES]
    if reply.status_code >= 400:
        return ToolResult(f"error: {tool.url} answered HTTP {reply.status_code}: {body}", ok=False)
    return ToolResult(body, ok=True)
