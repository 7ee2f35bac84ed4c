"""Blind transfer with REFER through the SIP leg's call control (``SipCallControl.transfer``, what
the ``transfer_call`` tool and the client's ``duplex.call.transfer`` reach), on an in-process SIP
server with a tone agent:

* SIPp as the transferee: it checks the REFER's Refer-To and Referred-By, answers 202 and sends
  NOTIFYs (trying, ringing, then 200 OK: we BYE; or 486: the call goes on with the agent);
* a hand-driven peer sends what peers should not: NOTIFYs outside a dialog, of another event,
  for no REFER, with another body or a broken sipfrag, and REFERs of its own; each gets its
  refusal and the call goes on.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from duplex.edge.sip.config import OutboundConfig, SipConfig
from duplex.edge.sip.control import SipCallControl
from duplex.edge.sip.dialog import CallState, SipCall
from duplex.edge.sip.uas import SipServer
from duplex.session.call_control import CallControlRefused
from tests.sip_callee import SippCallee
from tests.sip_helpers import RtpPhone, SipPeer, ToneAgent, sdp_offer, wait_until

pytestmark = pytest.mark.timeout(60)
SCENARIO = Path(__file__).parent / "sipp" / "uac_transferee.xml"
CAROL = "sip:carol@127.0.0.1:5099"  # the transfer target (SIPp's scenario checks this Refer-To)
BYE_FROM_US = """  <recv request="BYE"></recv>
  <send>
    <![CDATA[

      SIP/2.0 200 OK
      [last_Via:]
      [last_From:]
      [last_To:]
      [last_Call-ID:]
      [last_CSeq:]
      Content-Length: 0

    ]]>
  </send>"""
BYE_OF_ITS_OWN = """  <pause milliseconds="300"/>
  <send retrans="500">
    <![CDATA[

      BYE sip:agent@[remote_ip]:[remote_port] SIP/2.0
      Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]
      From: caller <sip:caller@[local_ip]:[local_port]>;tag=[pid]SIPpTag[call_number]
      To: agent <sip:agent@[remote_ip]:[remote_port]>[peer_tag_param]
      Call-ID: [call_id]
      CSeq: 5 BYE
      Max-Forwards: 70
      Content-Length: 0

    ]]>
  </send>
  <recv response="200"></recv>"""


class Agents:
    """The tone agents the server made, to stop one "speaking"."""

    def __init__(self) -> None:
        self.made: list[ToneAgent] = []

    async def __call__(self, info) -> ToneAgent:
        agent = ToneAgent()
        self.made.append(agent)
        return agent


async def _serve(agents: Agents, allow: list[str] | None = None) -> SipServer:
    config = SipConfig(port=0, rtp_port_min=48000, rtp_port_max=48999, t1_ms=50,
                       outbound=OutboundConfig(allow=[CAROL] if allow is None else allow))
    server = SipServer(config, agents)
    await server.start()
    return server


def _the_call(server: SipServer) -> SipCall:
    (call,) = server.calls.active.values()
    return call


async def _nothing_left(server: SipServer) -> None:
    keys = ("calls", "rtp_sockets", "agents", "client_transactions")
    await wait_until(lambda: all(server.stats()[k] == 0 for k in keys), 10, f"nothing left: {server.stats()}")
    assert server.stats()["internal_errors"] == 0


@pytest.mark.skipif(shutil.which("sipp") is None, reason="sipp (sip-tester) missing")
@pytest.mark.parametrize(("final", "ending", "accepted"), [
    ("SIP/2.0 200 OK", BYE_FROM_US, True),
    ("SIP/2.0 486 Busy Here", BYE_OF_ITS_OWN, False),
])
async def test_sipp_transferee(tmp_path, final, ending, accepted):
    agents = Agents()
    server = await _serve(agents)
    scenario = SCENARIO.read_text().replace("FINAL_SIPFRAG", final).replace("ENDING", ending)
    (tmp_path / "transferee.xml").write_text(scenario)
    host, port = server.address
    sipp = await asyncio.create_subprocess_exec(
        "sipp", "-sf", "transferee.xml", f"{host}:{port}", "-i", "127.0.0.1", "-mi", "127.0.0.1", "-p", "0",
        "-mp", "0", "-m", "1", "-nostdin", "-timeout", "20s", "-timeout_error", "-trace_err", cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        await wait_until(lambda: (len(server.calls.active) == 1 and agents.made) or sipp.returncode is not None,
                         10, "the call and its agent")
        if sipp.returncode is not None:
            raise AssertionError((await sipp.communicate())[0].decode(errors="replace")[-2000:])
        call = _the_call(server)
        await wait_until(lambda: call.media is not None and call.media.running, 5, "media")
        # (the agent's line is heard before the session asks: session/call_tools.py, its tests)
        transfer = asyncio.get_running_loop().create_task(SipCallControl(server.calls, call).transfer(CAROL))
        result = await asyncio.wait_for(transfer, 15)
        assert result.accepted is accepted
        assert result.status == int(final.split()[1])
        assert agents.made[0].transfers == [("accepted", 202), ("trying", 100), ("ringing", 180),
                                            ("ok" if accepted else "failed", result.status)]
        if not accepted:
            assert "486 Busy Here" in result.detail and "goes on" in result.detail
            assert call.state is CallState.CONFIRMED  # the call goes on with the agent
            with pytest.raises(CallControlRefused, match="matches no pattern"):
                await SipCallControl(server.calls, call).transfer("sip:mallory@127.0.0.1:5099")
        output, _ = await asyncio.wait_for(sipp.communicate(), 30)
        assert sipp.returncode == 0, output.decode(errors="replace")[-2000:]
        await _nothing_left(server)
        assert server.stats()["byes_sent"] == (1 if accepted else 0)
    finally:
        if sipp.returncode is None:
            sipp.kill()
            await sipp.wait()
        await server.stop()


async def _call(server: SipServer, peer: SipPeer, phone: RtpPhone) -> SipCall:
    invite, final = await peer.invite(sdp_offer(phone.port))
    assert final.status == 200
    peer.ack(invite, final)
    await wait_until(lambda: len(server.calls.active) == 1 and _the_call(server).agent is not None, 5, "agent")
    return _the_call(server)


async def test_bad_notify_and_refer_are_refused_and_the_call_goes_on():
    agents = Agents()
    server = await _serve(agents)
    peer, phone = SipPeer(server.address), RtpPhone()
    try:
        call = await _call(server, peer, phone)
        stranger = SipPeer(server.address)  # a NOTIFY in no dialog
        stranger.send(stranger.request("NOTIFY", to_tag="nosuchtag", headers=[("Event", "refer")],
                                       body=b"SIP/2.0 200 OK\r\n", content_type="message/sipfrag"))
        assert (await stranger.next(status=481)).status == 481
        stranger.close()
        peer.send(peer.request("NOTIFY", headers=[("Event", "presence")], body=b"x", content_type="text/plain"))
        assert (await peer.next(status=489)).get("Allow-Events") == "refer"
        peer.send(peer.request("NOTIFY", headers=[("Event", "refer")], body=b"SIP/2.0 200 OK\r\n",
                               content_type="message/sipfrag"))
        await peer.next(status=481)  # no REFER of ours under way
        peer.send(peer.request("REFER"))  # a REFER without Refer-To
        assert "Refer-To" in (await peer.next(status=400)).reason
        peer.send(peer.request("REFER", headers=[("Refer-To", "<sip:someone@127.0.0.1>")]))
        await peer.next(status=403)  # we do not follow a peer's transfer
        assert call.state is CallState.CONFIRMED and server.stats()["internal_errors"] == 0

        transfer = asyncio.get_running_loop().create_task(SipCallControl(server.calls, call).transfer(CAROL))
        refer = await peer.next(method="REFER")
        assert refer.get("Refer-To") == f"<{CAROL}>" and refer.get("Referred-By") == f"<{call.local.uri}>"
        peer.reply(refer, 202, "Accepted")
        with pytest.raises(CallControlRefused, match="already under way"):
            await SipCallControl(server.calls, call).transfer(CAROL)
        for _ in range(20):  # a chatty far end: "trying" is told once
            peer.send(peer.request("NOTIFY", headers=[("Event", "refer")], body=b"SIP/2.0 100 Trying\r\n",
                                   content_type="message/sipfrag"))
            await peer.next(status=200)
        peer.send(peer.request("NOTIFY", headers=[("Event", "refer")], body=b"ringing", content_type="text/plain"))
        assert (await peer.next(status=415)).get("Accept") == "message/sipfrag"
        peer.send(peer.request("NOTIFY", headers=[("Event", "refer;id=2")], body=b"not a status line",
                               content_type="message/sipfrag"))
        assert "sipfrag" in (await peer.next(status=400)).reason
        peer.send(peer.request("NOTIFY", headers=[("Event", "refer")], body=b"SIP/2.0 603 Decline\r\n",
                               content_type="message/sipfrag"))
        await peer.next(status=200)
        result = await asyncio.wait_for(transfer, 5)
        assert (result.accepted, result.status) == (False, 603)
        assert agents.made[0].transfers == [("accepted", 202), ("trying", 100), ("failed", 603)]
        assert call.state is CallState.CONFIRMED  # the call goes on with the agent
        peer.send(peer.request("BYE"))
        await peer.next(status=200)
        await _nothing_left(server)
    finally:
        peer.close()
        await phone.close()
        await server.stop()


async def test_transfer_refused_where_no_target_is_allowed():
    agents = Agents()
    server = await _serve(agents, allow=[])
    peer, phone = SipPeer(server.address), RtpPhone()
    try:
        call = await _call(server, peer, phone)
        with pytest.raises(CallControlRefused, match="no target is allowed"):
            await SipCallControl(server.calls, call).transfer("+15550100")
        with pytest.raises(CallControlRefused, match="not connected"):
            call.state = CallState.ENDED
            await SipCallControl(server.calls, call).transfer(CAROL)
        call.state = CallState.CONFIRMED
        peer.send(peer.request("BYE"))
        await peer.next(status=200)
        await _nothing_left(server)
    finally:
        peer.close()
        await phone.close()
        await server.stop()


@pytest.mark.skipif(shutil.which("sipp") is None, reason="sipp (sip-tester) missing")
async def test_refer_target_gets_the_invite_with_our_referred_by(tmp_path):
    """The whole blind transfer: the caller (the test's phone) follows our REFER as a phone does,
    calling the Refer-To target with the REFER's Referred-By (RFC 3892); SIPp as that target
    checks the header, answers; the phone's NOTIFY 200 makes duplex leave with BYE."""
    async with SippCallee("uas_refer_target.xml", tmp_path) as carol:
        target = f"sip:carol@127.0.0.1:{carol.port}"
        agents = Agents()
        server = await _serve(agents, allow=[target])
        peer, phone = SipPeer(server.address), RtpPhone()
        onward = SipPeer(("127.0.0.1", carol.port))  # the phone's new call, to the target
        try:
            call = await _call(server, peer, phone)
            transfer = asyncio.get_running_loop().create_task(SipCallControl(server.calls, call).transfer(target))
            refer = await peer.next(method="REFER")
            peer.reply(refer, 202, "Accepted")
            referred_by = refer.get("Referred-By")
            assert refer.get("Refer-To") == f"<{target}>" and referred_by == f"<{call.local.uri}>"
            invite, final = await onward.invite(sdp_offer(phone.port), headers=[("Referred-By", referred_by)])
            assert final.status == 200, final.reason
            onward.ack(invite, final)
            peer.send(peer.request("NOTIFY", headers=[("Event", "refer"), ("Subscription-State", "terminated")],
                                   body=b"SIP/2.0 200 OK\r\n", content_type="message/sipfrag"))
            await peer.next(status=200)
            bye = await peer.next(method="BYE")  # duplex leaves once the new call is up
            peer.reply(bye, 200, "OK")
            result = await asyncio.wait_for(transfer, 5)
            assert (result.accepted, result.status) == (True, 200)
            onward.send(onward.request("BYE"))
            await onward.next(status=200)
            rc, output = await carol.result()  # 0: the INVITE's Referred-By was ours
            assert rc == 0, output[-2000:]
            await _nothing_left(server)
        finally:
            onward.close()
            peer.close()
            await phone.close()
            await server.stop()
