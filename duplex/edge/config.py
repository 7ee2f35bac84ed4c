"""Settings of the outward-facing server (HTTP, WebRTC, the Realtime WebSocket)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from duplex.edge.rate import RateConfig


class RealtimeLimits(BaseModel):
    """Limits of one Realtime WebSocket connection; each, when hit, is an ``error`` event and
    a clean close."""

    model_config = ConfigDict(extra="forbid")

    max_frame_bytes: int = Field(1 << 20, ge=1024)  # one message (~21 s of base64 PCM 24 kHz)
    append_burst_s: float = Field(60.0, gt=0)  # audio seconds that may be appended at once ...
    append_rate: float = Field(4.0, gt=0)  # ... and then this many seconds of audio per second
    max_session_s: float = Field(3600.0, gt=0)  # a connection is closed after this long (= EdgeConfig.max_call_s)


class AccessConfig(BaseModel):
    """Who may use the server (``edge/http/auth.py``). No API key: open to anyone who can reach it."""

    model_config = ConfigDict(extra="forbid")

    api_key: str | None = Field(None, min_length=16)
    demo_open: bool = False  # the demo page may mint itself a client secret (no key in the browser)
    secret_ttl_s: float = Field(600.0, ge=10, le=7200)  # client secrets' default life
    max_secrets: int = Field(1000, ge=1)  # unexpired, unused client secrets held at once
    max_failures: int = Field(20, ge=1)  # failed authentications per client address per minute, then 429


class HttpLimits(BaseModel):
    """What one HTTP client may hold of the server (``edge/http/guard.py``, ``edge/http/protocol.py``)."""

    model_config = ConfigDict(extra="forbid")

    header_timeout_s: float = Field(10.0, gt=0, le=300)  # a request's headers must be in by then (408)
    body_timeout_s: float = Field(10.0, gt=0, le=300)  # ... and its body (408)
    max_body_bytes: int = Field(64 * 1024, ge=1024, le=16 << 20)  # any request body (413)
    max_connections: int = Field(256, ge=8)  # open HTTP + WebSocket connections; more are closed at accept
    max_connections_per_source: int = Field(64, ge=1)  # ... of them from one address
    error_log_per_minute: int = Field(10, ge=1)  # repeats of one server error message logged a minute


class EdgeConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    max_sessions: int = Field(8, ge=1)
    ice_servers: list[str] = Field(default_factory=list)  # e.g. stun:stun.example.org:3478; none by default
    ice_loopback: bool = False  # gather 127.0.0.1 candidates only (tests, single-host use)
    # WebRTC media (ICE, DTLS, SRTP, Opus, RTP) in this many worker processes; 0: on the server's loop.
    # One by default: with the local pipeline's stages busy (8 callers on 2 cores) the server's loop
    # fell ~1 s behind the callers' audio, and barge-ins with it (docs/benchmarks/load.md).
    media_workers: int = Field(1, ge=0, le=32)
    media_stall_s: float = Field(3.0, ge=1.0, le=60.0)  # a media worker silent this long is ended and restarted
    low_latency_receive: bool = True  # release each received audio frame on arrival (see rtc_options)
    # the admission deadline: a WebRTC call whose ICE + DTLS have not connected by then is dropped
    # and its session slot freed (an answered offer holds a slot until then)
    connect_timeout_s: float = Field(5.0, gt=0, le=60)
    max_call_s: float = Field(3600.0, gt=0)  # any WebRTC or WebSocket call ends then, with an error event
    max_pending_events: int = Field(512, ge=16)  # events kept while the data channel is not open
    max_event_bytes: int = Field(64 * 1024, ge=1024, le=256 * 1024)  # a data-channel message (SDP + checked)
    call_rate: RateConfig = Field(default_factory=RateConfig)  # new calls per source / in all, per door
    limit_loopback: bool = False  # rate-limit loopback sources too (off: the host's own tools, a local proxy)
    # reverse proxies (addresses or CIDRs) whose X-Forwarded-For names the caller; empty: the header
    # is ignored and the caller is the peer address, whoever sends it
    trusted_proxies: list[str] = Field(default_factory=list)
    # Host names the server answers to; empty: IP literals, localhost names and the bound host (so a
    # DNS-rebound name is refused). "*" allows any.
    allowed_hosts: list[str] = Field(default_factory=list)
    # Origins (scheme://host[:port]) other than the server's own that browsers may call it from
    # (CORS preflights answered for these only). "*" allows any.
    allowed_origins: list[str] = Field(default_factory=list)
    http: HttpLimits = Field(default_factory=HttpLimits)
    realtime: RealtimeLimits = Field(default_factory=RealtimeLimits)
    access: AccessConfig = Field(default_factory=AccessConfig)
    # doors of your own beside the built-in ones, each MODULE:FACTORY (``edge/plugin``; --door)
    doors: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _one_call_limit(self) -> EdgeConfig:
        """``max_call_s`` serves both doors; a WebSocket limit given alone (``--ws-max-session-s``)
        is taken as it."""
        if "max_call_s" not in self.model_fields_set and "max_session_s" in self.realtime.model_fields_set:
            self.max_call_s = self.realtime.max_session_s
        self.realtime.max_session_s = self.max_call_s
        return self
