"""Settings of the outward-facing server (HTTP, WebRTC)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class RealtimeLimits(BaseModel):
    """Limits of one Realtime WebSocket connection; each, when hit, is an ``error`` event and
    a clean close."""

    model_config = ConfigDict(extra="forbid")

    max_frame_bytes: int = Field(1 << 20, ge=1024)  # one message (~21 s of base64 PCM 24 kHz)
    append_burst_s: float = Field(60.0, gt=0)  # audio seconds that may be appended at once ...
    append_rate: float = Field(4.0, gt=0)  # ... and then this many seconds of audio per second
    max_session_s: float = Field(3600.0, gt=0)  # a connection is closed after this long


class AccessConfig(BaseModel):
    """Who may use the server (``edge/auth.py``). No API key: open to anyone who can reach it."""

    model_config = ConfigDict(extra="forbid")

    api_key: str | None = Field(None, min_length=16)
    demo_open: bool = False  # the demo page may mint itself a client secret (no key in the browser)
    secret_ttl_s: float = Field(600.0, ge=10, le=7200)  # client secrets' default life
    max_secrets: int = Field(1000, ge=1)  # unexpired, unused client secrets held at once
    max_failures: int = Field(20, ge=1)  # failed authentications per client address per minute, then 429


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
    realtime: RealtimeLimits = Field(default_factory=RealtimeLimits)
    access: AccessConfig = Field(default_factory=AccessConfig)
