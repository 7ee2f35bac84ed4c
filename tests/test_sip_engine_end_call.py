"""The agent ends a phone call itself, end to end: `duplex serve --config engine` (its real
Whisper and Piper stages and the engine thinker) with a SIP door, the thinker's engine a tiny
chat-completions server of the test's (tests/engine_helpers.py) that says goodbye and calls
``end_call``. A SIP caller of the test's presses 1 (RFC 4733); the digit reaches the thinker as
text with the call tool among its tools; the agent's goodbye is spoken on the RTP stream and the
server's BYE comes after its last loud packet; nothing is left afterwards."""



from __future__ import annotations

import json
import time

import pytest

from tests.sip_engine_call import engine_sip_call
from tests.sip_helpers import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


async def test_a_keypad_digit_reaches_the_engine_thinker_and_its_end_call_sends_bye_after_the_goodbye():
    async with engine_sip_call("goodbye", ["--session.call_tools", "[end_call]",
                                           "--session.keypad_gap_ms", "200"]) as call:
        call.press(1)
        bye = await call.next_request("BYE", 120)
        bye_at = time.monotonic()
        call.peer.reply(bye, 200)
        await wait_until(lambda: call.engine.requests, 5, "the engine's request")
        request = call.engine.requests[0]
        assert "[the caller pressed 1 on the keypad]" in json.dumps(request["messages"])
        assert [t["function"]["name"] for t in request["tools"]] == ["end_call"]
        last_loud = call.phone.last_loud_at()
        assert last_loud is not None and last_loud < bye_at  # the goodbye was spoken, all of it before the BYE
