"""Settings of the SIP door (UAS, RTP media)."""

from __future__ import annotations

import ipaddress

from pydantic import BaseModel, Field, SecretStr, field_validator, model_validator

from duplex.edge.phone.amd import AmdSettings
from duplex.edge.rate import RateConfig


class OutboundConfig(BaseModel):
    """Calls duplex places (``POST /v1/calls/outbound``). Off until ``allow`` names targets."""

    # Targets that may be called: shell-style patterns on the target URI ("sip:*@10.0.0.7:5060",
    # "sip:+4930*@trunk.example.com"). Empty: no outbound calls at all.
    allow: list[str] = []
    max_calls: int = Field(2, ge=0, le=1000)  # placed calls at once (ringing or answered)
    per_minute: int = Field(10, ge=1, le=10_000)  # new placed calls in any 60 s
    ring_timeout_s: float = Field(30.0, gt=0, le=300)  # unanswered by then: CANCEL
    trunk: str | None = None  # "host:port" every INVITE goes to (an outbound proxy); None: the target's
    trunk_user: str | None = None  # digest credentials for a trunk's 401/407 challenge
    trunk_password: SecretStr | None = None
    amd: AmdSettings = Field(default_factory=AmdSettings)  # answering-machine screening's thresholds
    from_user: str = Field("duplex", pattern=r"^[A-Za-z0-9_.+\-]{1,64}$")  # the user part of our From

    @field_validator("trunk")
    @classmethod
    def _valid_trunk(cls, value: str | None) -> str | None:
        if value is not None:
            host, _, port = value.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"trunk wants HOST:PORT, got {value!r}")
        return value


class SipConfig(BaseModel):
    host: str = "127.0.0.1"  # address the SIP and RTP sockets bind to
    port: int = Field(5060, ge=0, le=65535)  # 0: any free port (tests)
    advertise_host: str | None = None  # address written in Contact and SDP; default: `host`
    rtp_port_min: int = Field(20000, ge=1024, le=65534)
    rtp_port_max: int = Field(20999, ge=1025, le=65535)
    max_calls: int = Field(8, ge=0)
    # Sources allowed to send SIP; everyone else gets 403. Loopback only unless configured.
    allow: list[str] = ["127.0.0.0/8", "::1/128"]
    auth_users: dict[str, str] = {}  # username -> password; non-empty turns on digest auth
    realm: str = "duplex"
    ring_ms: int = Field(0, ge=0, le=60000)  # 180 Ringing held this long before the 200 OK
    t1_ms: int = Field(500, ge=10, le=5000)  # RFC 3261 T1: retransmission base interval
    symmetric_rtp: bool = False  # send RTP back to where it comes from (NAT), not to the SDP
    jitter_depth: int = Field(3, ge=1, le=20)  # 20 ms frames buffered before playout
    rtp_timeout_s: float = Field(30.0, ge=0)  # hang up after this long without RTP; 0: never
    user_agent: str = "duplex"
    # Holding the line (issue 15). A call holds a session only once its 200 OK is ACKed;
    # until then it is "pending" (an RTP port, a dialog entry) and yields to newer INVITEs.
    ack_timeout_s: float = Field(4.0, gt=0, le=32)  # a 200 OK not ACKed by then: call dropped
    max_pending_calls: int = Field(16, ge=1, le=1000)  # INVITEs answered, not yet ACKed
    max_transactions: int = Field(4096, ge=16, le=1_000_000)  # open server transactions (each lives ~32 s)
    max_call_s: float = Field(3600.0, gt=0)  # an answered call is hung up (BYE) after this long
    rate: RateConfig = Field(default_factory=RateConfig)  # new INVITEs per source and in total
    limit_loopback: bool = False  # rate-limit loopback sources too (off: every door's rule, edge/rate.py)
    # Anti-amplification: to a source without a confirmed call we send at most the bytes it
    # sent us (plus `reply_allowance_bytes`, renewed after `reply_window_s` of silence from it),
    # responses and their retransmissions included; refusals (503) at most `refusal_replies`
    # a minute per source, the rest dropped unanswered.
    reply_window_s: float = Field(30.0, gt=0, le=3600)
    reply_allowance_bytes: int = Field(1024, ge=0, le=65536)
    refusal_replies: float = Field(6.0, gt=0)
    budget_exempt: list[str] = []  # CIDRs whose replies are not capped (your trunk, your SBC)
    outbound: OutboundConfig = Field(default_factory=OutboundConfig)

    @field_validator("allow", "budget_exempt")
    @classmethod
    def _valid_networks(cls, value: list[str]) -> list[str]:
        for cidr in value:
            ipaddress.ip_network(cidr, strict=False)  # raises a clear ValueError
        return value

    @model_validator(mode="after")
    def _valid_port_range(self) -> SipConfig:
        if self.rtp_port_max - self.rtp_port_min < 1:
            raise ValueError("rtp_port_max must be above rtp_port_min")
        return self

    @property
    def contact_host(self) -> str:
        if self.advertise_host:
            return self.advertise_host
        return "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host

