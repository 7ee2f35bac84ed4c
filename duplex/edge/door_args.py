"""Command-line settings of the doors (issue 15): admission deadline, call length, rate limits
on new calls, Host/Origin allow-lists, HTTP limits, and door plug-ins (``--door``). ``duplex
serve`` adds them; each maps to a field of ``EdgeConfig``, which checks them."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("holding the doors (WebRTC, WebSocket, HTTP)")
    group.add_argument("--connect-timeout-s", type=float, default=5.0,
                       help="a WebRTC call whose media has not connected by then is dropped (its slot freed)")
    group.add_argument("--max-call-s", type=float, default=None,
                       help="any WebRTC or WebSocket call ends then with an error event (default 3600, "
                            "or --ws-max-session-s)")
    group.add_argument("--call-rate", type=float, default=30.0, help="new calls a minute from one address, per door")
    group.add_argument("--call-burst", type=int, default=None,
                       help="... of which this many at once (default 10, and never more than --max-sessions)")
    group.add_argument("--pending-share", type=float, default=None,
                       help="calls one address may hold before they connect, as a share of the sessions "
                            "(default 0.25, at least one call; loopback exempt unless --limit-loopback)")
    group.add_argument("--trusted-proxy", action="append", default=[], metavar="CIDR",
                       help="a reverse proxy whose X-Forwarded-For names the caller (repeatable); from "
                            "any other peer the header is ignored")
    group.add_argument("--call-rate-total", type=float, default=600.0, help="new calls a minute in all, per door")
    group.add_argument("--limit-loopback", action="store_true",
                       help="rate-limit new calls from 127.0.0.0/8 and ::1 too, at every door (WebRTC, "
                            "WebSocket, SIP, Twilio; off: the host's own clients and a reverse proxy on it "
                            "are not limited)")
    group.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                       help="a host name the server answers to besides IP literals and localhost (repeatable; "
                            "*.example.org a domain, * any)")
    group.add_argument("--allowed-origin", action="append", default=[], metavar="ORIGIN",
                       help="a web origin (https://app.example.org) that may call the server from a browser "
                            "besides its own (repeatable; * any)")
    group.add_argument("--http-timeout-s", type=float, default=10.0,
                       help="a request's headers, and then its body, must arrive within this (408)")
    group.add_argument("--max-connections", type=int, default=256,
                       help="open HTTP and WebSocket connections; more are closed with 503 at accept")
    group.add_argument("--max-connections-per-source", type=int, default=64,
                       help="open connections from one address; more are closed with 503 at accept")
    plugins = parser.add_argument_group("doors of your own (docs/architecture/extending.md)")
    plugins.add_argument("--door", action="append", default=[], metavar="MODULE:FACTORY",
                         help="serve a door plug-in too: FACTORY in the importable MODULE takes a DoorContext "
                              "(the sessions, the call limits) and returns a door (duplex/edge/plugin: name, "
                              "router(), start(), close(), stats() shown under edges.NAME in /duplex/stats); "
                              "repeatable; checked before the server starts")


def settings(args: argparse.Namespace) -> dict:
    """EdgeConfig fields from the command line."""
    fields: dict = {
        "connect_timeout_s": args.connect_timeout_s,
        "call_rate": call_rate_fields(args),
        "trusted_proxies": args.trusted_proxy,
        "limit_loopback": args.limit_loopback,
        "doors": args.door,
        "allowed_hosts": args.allowed_host, "allowed_origins": args.allowed_origin,
        "http": {"header_timeout_s": args.http_timeout_s, "body_timeout_s": args.http_timeout_s,
                 "max_connections": args.max_connections,
                 "max_connections_per_source": args.max_connections_per_source},
    }
    if args.max_call_s is not None:
        fields["max_call_s"] = args.max_call_s
    return fields


def call_rate_fields(args: argparse.Namespace) -> dict:
    """RateConfig fields: only what was given, so a default burst can follow the session count."""
    burst = args.call_burst if args.call_burst is not None else 10
    fields: dict = {"per_source": args.call_rate, "total": args.call_rate_total,
                    "total_burst": max(burst, round(args.call_rate_total / 10))}
    if args.call_burst is not None:
        fields["source_burst"] = args.call_burst
    if args.pending_share is not None:
        fields["pending_share"] = args.pending_share
    return fields
