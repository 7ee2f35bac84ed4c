"""SIPp against an in-process SIP server (tone agent, no pipeline): interop of signalling
that needs no speech: SIPp's stock UAC call, and digest auth answered by SIPp's own digest."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from duplex.edge.sip.config import SipConfig
from duplex.edge.sip.uas import SipServer
from tests.sip_helpers import ToneAgent, wait_until

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.skipif(shutil.which("sipp") is None, reason="sipp (sip-tester) missing")]
SCENARIOS = Path(__file__).parent / "sipp"


async def _tone_agent(info):
    return ToneAgent()


async def _sipp(server: SipServer, *args: str, cwd: Path, limit_s: int = 20) -> tuple[int, str]:
    host, port = server.address
    proc = await asyncio.create_subprocess_exec(
        "sipp", f"{host}:{port}", "-i", "127.0.0.1", "-mi", "127.0.0.1", "-p", "0", "-mp", "0",
        "-m", "1", "-nostdin", "-timeout", f"{limit_s}s", "-timeout_error", *args, cwd=cwd,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    output, _ = await asyncio.wait_for(proc.communicate(), 40)
    return proc.returncode, output.decode(errors="replace")


async def _serve(**config) -> SipServer:
    server = SipServer(SipConfig(port=0, rtp_port_min=45000, rtp_port_max=45999, **config),
                       _tone_agent)
    await server.start()
    return server


async def _freed(server: SipServer) -> None:
    await wait_until(lambda: all(server.stats()[k] == 0 for k in ("calls", "rtp_sockets",
                                                                 "agents")), 5, "call freed")


async def test_sipp_stock_uac_call(tmp_path):
    server = await _serve()
    try:
        rc, output = await _sipp(server, "-sn", "uac", "-d", "500", cwd=tmp_path)
        assert rc == 0, output[-2000:]
        await _freed(server)
        assert server.stats()["calls_answered"] == 1 and server.stats()["internal_errors"] == 0
    finally:
        await server.stop()


async def test_sipp_digest_auth(tmp_path):
    server = await _serve(auth_users={"alice": "s3cret"})
    try:
        scenario = str(SCENARIOS / "uac_auth.xml")
        rc, output = await _sipp(server, "-sf", scenario, "-au", "alice", "-ap", "s3cret",
                                 "-key", "user", "alice", cwd=tmp_path)
        assert rc == 0, output[-2000:]
        await _freed(server)
        stats = server.stats()
        assert stats["auth_challenges"] == 1 and stats["auth_failures"] == 0
        assert stats["calls_answered"] == 1

        rc, output = await _sipp(server, "-sf", scenario, "-au", "alice", "-ap", "wrong",
                                 "-key", "user", "alice", cwd=tmp_path, limit_s=4)
        assert rc != 0  # a wrong password gets a second 401, which the scenario does not expect
        assert server.stats()["auth_failures"] == 1 and server.stats()["calls_answered"] == 1
    finally:
        await server.stop()
