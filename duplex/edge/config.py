"""Settings of the outward-facing server (HTTP, WebRTC)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class EdgeConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    max_sessions: int = Field(8, ge=1)
    ice_servers: list[str] = Field(default_factory=list)  # e.g. stun:stun.example.org:3478; none by default
    ice_loopback: bool = False  # gather 127.0.0.1 candidates only (tests, single-host use)
    low_latency_receive: bool = True  # release each received audio frame on arrival (see rtc_options)
    connect_timeout_s: float = Field(20.0, gt=0)  # a call not connected by then is dropped
    max_pending_events: int = Field(512, ge=16)  # events kept while the data channel is not open
