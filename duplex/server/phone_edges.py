"""The phone edges of ``duplex serve``: its command-line options, and the SIP server and the
Twilio Media Streams endpoint they ask for, as door plug-ins (``edge/plugin``) on the server's
sessions."""

from __future__ import annotations

import argparse

from pydantic import BaseModel

from duplex.edge.door_args import call_rate_fields
from duplex.edge.plugin import DoorFactory
from duplex.edge.rate import RateConfig
from duplex.edge.sip.config import OutboundConfig, SipConfig
from duplex.edge.sip.door import sip_door
from duplex.edge.twilio.config import TwilioLimits
from duplex.edge.twilio.door import twilio_door


class PhoneConfig(BaseModel):
    sip: SipConfig | None = None  # None: no SIP server
    twilio: bool = False  # mount the Twilio Media Streams WebSocket (/twilio/media-stream)
    twilio_limits: TwilioLimits = TwilioLimits()  # its timeouts, duration and rate (issue 15)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("phone (SIP/RTP G.711, Twilio Media Streams)")
    group.add_argument("--sip", metavar="HOST:PORT", nargs="?", const="127.0.0.1:5060",
                       help="answer SIP calls on UDP HOST:PORT (default 127.0.0.1:5060; port 0 "
                            "picks a free one, printed)")
    group.add_argument("--sip-allow", metavar="CIDR", action="append", default=None,
                       help="sources allowed to call (repeatable; default: loopback only)")
    group.add_argument("--sip-user", metavar="USER:PASSWORD", action="append", default=[],
                       help="require SIP digest auth with these credentials (repeatable)")
    group.add_argument("--sip-advertise", metavar="HOST",
                       help="address put in Contact and SDP (binding 0.0.0.0, or behind NAT)")
    group.add_argument("--sip-rtp-ports", metavar="MIN-MAX", default="20000-20999",
                       help="UDP port range for RTP media (default 20000-20999)")
    group.add_argument("--twilio", action="store_true",
                       help="accept Twilio Media Streams WebSockets at /twilio/media-stream")
    group.add_argument("--sip-trusted", metavar="CIDR", action="append", default=[],
                       help="SIP peers whose replies are not capped by the anti-amplification "
                            "budget (your trunk, your SBC; repeatable)")
    group.add_argument("--sip-ack-timeout-s", type=float, default=4.0,
                       help="an answered INVITE not ACKed by then is dropped (default 4)")
    group.add_argument("--sip-outbound-allow", metavar="PATTERN", action="append", default=[],
                       help="targets placed calls (POST /v1/calls/outbound) and transfers may reach: shell-style "
                            "patterns on the SIP URI, e.g. 'sip:*@10.0.0.7:5060' (repeatable; default: none, "
                            "no outbound calls and no transfers)")
    group.add_argument("--sip-trunk", metavar="HOST:PORT",
                       help="send placed calls' INVITEs here (an outbound proxy / SIP trunk)")
    group.add_argument("--sip-trunk-user", metavar="USER:PASSWORD",
                       help="digest credentials answering the trunk's 401/407 challenge")
    group.add_argument("--sip-outbound-max", type=int, default=2,
                       help="placed calls live at once (default 2)")
    group.add_argument("--sip-outbound-per-minute", type=int, default=10,
                       help="placed calls started in any minute (default 10)")
    group.add_argument("--sip-ring-timeout-s", type=float, default=30.0,
                       help="a placed call not answered by then is cancelled (default 30)")
    group.add_argument("--twilio-media-timeout-s", type=float, default=10.0,
                       help="a Twilio stream without media (or without a start) for this long is "
                            "closed (default 10)")


def config_from_args(args: argparse.Namespace) -> PhoneConfig:
    """Raises ValueError with a readable message on a bad option value."""
    sip = None
    if args.sip is not None:
        host, _, port = args.sip.rpartition(":")
        low, _, high = args.sip_rtp_ports.partition("-")
        if not host or not port.isdigit() or not low.isdigit() or not high.isdigit():
            raise ValueError(f"--sip wants HOST:PORT and --sip-rtp-ports MIN-MAX, got "
                             f"{args.sip!r} and {args.sip_rtp_ports!r}")
        users = dict(_credential(value) for value in args.sip_user)
        extra = {"allow": args.sip_allow} if args.sip_allow else {}
        sip = SipConfig(host=host.strip("[]"), port=int(port), auth_users=users,
                        advertise_host=args.sip_advertise, rtp_port_min=int(low),
                        rtp_port_max=int(high), budget_exempt=args.sip_trusted,
                        ack_timeout_s=args.sip_ack_timeout_s, outbound=_outbound(args), **extra,
                        **_shared_limits(args))
    twilio = TwilioLimits(start_timeout_s=args.twilio_media_timeout_s,
                          media_timeout_s=args.twilio_media_timeout_s, **_shared_limits(args))
    return PhoneConfig(sip=sip, twilio=args.twilio, twilio_limits=twilio)


def _outbound(args: argparse.Namespace) -> OutboundConfig:
    user, password = _credential(args.sip_trunk_user, "--sip-trunk-user") if args.sip_trunk_user else (None, None)
    return OutboundConfig(allow=args.sip_outbound_allow, trunk=args.sip_trunk, trunk_user=user,
                          trunk_password=password, max_calls=args.sip_outbound_max,
                          per_minute=args.sip_outbound_per_minute, ring_timeout_s=args.sip_ring_timeout_s)


def _shared_limits(args: argparse.Namespace) -> dict:
    """The doors' common settings (``edge/door_args``: --call-rate ..., --max-call-s), when
    the command line has them: the phone doors use the same values."""
    fields: dict = {}
    if getattr(args, "call_rate", None) is not None:
        fields["rate"] = RateConfig(**call_rate_fields(args))
    if getattr(args, "max_call_s", None) is not None:
        fields["max_call_s"] = args.max_call_s
    if getattr(args, "limit_loopback", False):
        fields["limit_loopback"] = True
    return fields


def _credential(value: str, option: str = "--sip-user") -> tuple[str, str]:
    user, colon, password = value.partition(":")
    if not colon or not user or not password:
        raise ValueError(f"{option} wants USER:PASSWORD, got {value!r}")
    return user, password


def door_factories(config: PhoneConfig) -> list[DoorFactory]:
    """The phone doors the options ask for, as plug-ins (``edge/plugin``) like any other door."""
    factories: list[DoorFactory] = []
    if config.sip is not None:
        factories.append(sip_door(config.sip))
    if config.twilio:
        factories.append(twilio_door(config.twilio_limits))
    return factories
