"""`duplex serve`'s phone options: parsed into a validated config, bad values refused early."""

from __future__ import annotations

import pytest

from duplex.cli import build_parser, main
from duplex.server.phone_edges import config_from_args


def _phone(*argv: str):
    args, _ = build_parser().parse_known_args(["serve", *argv])
    return config_from_args(args)


def test_phone_edges_are_off_by_default():
    phone = _phone()
    assert phone.sip is None and phone.twilio is False


def test_sip_options_build_the_sip_config():
    phone = _phone("--sip", "0.0.0.0:5070", "--sip-allow", "10.0.0.0/8", "--sip-allow",
                   "192.168.1.0/24", "--sip-user", "alice:s3cret", "--sip-advertise", "203.0.113.5",
                   "--sip-rtp-ports", "30000-30099", "--twilio")
    sip = phone.sip
    assert (sip.host, sip.port) == ("0.0.0.0", 5070)
    assert sip.allow == ["10.0.0.0/8", "192.168.1.0/24"]
    assert sip.auth_users == {"alice": "s3cret"}
    assert sip.contact_host == "203.0.113.5"
    assert (sip.rtp_port_min, sip.rtp_port_max) == (30000, 30099)
    assert phone.twilio


def test_bare_sip_flag_means_loopback_5060_and_loopback_allowlist():
    sip = _phone("--sip").sip
    assert (sip.host, sip.port) == ("127.0.0.1", 5060)
    assert sip.allow == ["127.0.0.0/8", "::1/128"] and not sip.auth_users


def test_outbound_options_build_the_outbound_config():
    assert _phone("--sip").sip.outbound.allow == []  # off unless targets are allowed
    outbound = _phone("--sip", "--sip-outbound-allow", "sip:+1555*@trunk.test", "--sip-trunk", "10.0.0.7:5060",
                      "--sip-trunk-user", "acct:pw", "--sip-outbound-max", "4", "--sip-outbound-per-minute", "20",
                      "--sip-ring-timeout-s", "12").sip.outbound
    assert outbound.allow == ["sip:+1555*@trunk.test"] and outbound.trunk == "10.0.0.7:5060"
    assert outbound.trunk_user == "acct" and outbound.trunk_password.get_secret_value() == "pw"
    assert (outbound.max_calls, outbound.per_minute, outbound.ring_timeout_s) == (4, 20, 12.0)


@pytest.mark.parametrize("argv", [
    ["--sip", "127.0.0.1:0", "--sip-trunk", "nohostport"],
    ["--sip", "127.0.0.1:0", "--sip-trunk-user", "nopassword"],
    ["--sip", "127.0.0.1:0", "--sip-ring-timeout-s", "0"],
    ["--sip", "nohostport"], ["--sip", "127.0.0.1:99999"], ["--sip", "127.0.0.1:0",
                                                              "--sip-allow", "10.0.0.0/40"],
    ["--sip", "127.0.0.1:0", "--sip-user", "nopassword"],
    ["--sip", "127.0.0.1:0", "--sip-rtp-ports", "3000"],
    ["--sip", "127.0.0.1:0", "--sip-rtp-ports", "30010-30000"],
])
def test_bad_phone_options_exit_with_a_message(argv, capsys):
    assert main(["serve", "--config", "toy-voice", *argv]) == 2
    assert "error:" in capsys.readouterr().err
