"""Settings of the Twilio Media Streams door."""

from __future__ import annotations

from pydantic import BaseModel, Field

from duplex.edge.rate import RateConfig


class TwilioLimits(BaseModel):
    """Limits of the Twilio Media Streams door: a stream holds its session only while media flows."""

    start_timeout_s: float = Field(10.0, gt=0)  # connected, no `start` by then: closed
    media_timeout_s: float = Field(10.0, gt=0)  # started, then no `media` for this long: closed
    max_call_s: float = Field(3600.0, gt=0)  # a stream is closed this long after its `start`
    rate: RateConfig = Field(default_factory=RateConfig)  # `start`s per source address and in total
    # loopback sources pass the rate unless set: a TLS proxy on the host carries every stream
    limit_loopback: bool = False
