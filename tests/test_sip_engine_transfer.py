"""The agent transfers a phone call itself, end to end: `duplex serve --config engine` (its real
Whisper and Piper stages and the engine thinker) with a SIP door whose allowlist holds the desk,
the thinker's engine a tiny chat-completions server of the test's (tests/engine_helpers.py) that
says it puts the caller through and calls ``transfer_call``. The caller presses 1; the agent's line
is spoken on the RTP stream before the REFER, whose Refer-To is the desk and Referred-By the
agent; the caller's NOTIFYs (trying, then 200 OK) make the server leave with a BYE; nothing is
left afterwards."""


from __future__ import annotations

import json
import time

import pytest

from duplex.edge.sip.headers import parse_name_addr
from tests.engine_helpers import TRANSFER_TARGET
from tests.sip_engine_call import engine_sip_call

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


async def test_the_engine_thinkers_transfer_call_is_said_then_referred_and_the_notify_200_ends_the_call():
    async with engine_sip_call("transfer", ["--sip-outbound-allow", TRANSFER_TARGET,
                                            "--session.call_tools", "[transfer_call]",
                                            "--session.keypad_gap_ms", "200"]) as call:
        call.press(1)
        refer = await call.next_request("REFER", 120)
        refer_at = time.monotonic()
        assert parse_name_addr(refer.get("Refer-To") or "").uri == TRANSFER_TARGET
        assert "sip:" in (refer.get("Referred-By") or "")
        last_loud = call.phone.last_loud_at()
        assert last_loud is not None and last_loud < refer_at, "the agent's line is spoken before the REFER"
        request = call.engine.requests[0]
        assert [t["function"]["name"] for t in request["tools"]] == ["transfer_call"]
        assert "[the caller pressed 1 on the keypad]" in json.dumps(request["messages"])
        call.peer.reply(refer, 202, "Accepted")
        for status in (b"SIP/2.0 100 Trying\r\n", b"SIP/2.0 200 OK\r\n"):
            state = "active" if status.startswith(b"SIP/2.0 1") else "terminated;reason=noresource"
            call.peer.send(call.peer.request("NOTIFY", headers=[("Event", "refer"), ("Subscription-State", state)],
                                             body=status, content_type="message/sipfrag"))
            assert ((await call.peer.next(status=200)).get("CSeq") or "").endswith("NOTIFY")
        bye = await call.next_request("BYE", 10)
        call.peer.reply(bye, 200)
