"""Recording per call against real servers: the policy (``--record-policy``, ``--record-share``),
the client's ask (``session.update`` ``recording``), the caller told (``session.created``), and the
owner-only recordings API (``/v1/recordings``)."""

from __future__ import annotations

import argparse
import time

import httpx
import pytest

from duplex.server.serve import watch_config
from duplex_tools.harness import ServerProcess
from duplex_tools.ws_client import WsCaller

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
KEY = "sk-test-recording-0123456789"


def serve(*args: str) -> ServerProcess:
    return ServerProcess(["--config", "toy-voice", "--port", "0", "--max-sessions", "4", *args])


@pytest.fixture(scope="module")
def on_request(tmp_path_factory):
    folder = tmp_path_factory.mktemp("on_request")
    with serve("--record", str(folder), "--record-policy", "on_request", "--api-key", KEY) as proc:
        yield proc, folder
    assert proc.stop() == 0, "".join(proc.output[-30:])


def http(url: str, key: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url, timeout=10, headers={"Authorization": f"Bearer {key}"})


async def mint(url: str, session: dict | None = None) -> str:
    async with http(url, KEY) as keyed:
        reply = await keyed.post("/v1/realtime/client_secrets", json={"session": session or {"type": "realtime"}})
    assert reply.status_code == 200, reply.text
    return reply.json()["value"]


def recorded(event) -> bool | None:
    return getattr(event.session, "recording", None)


async def update(caller: WsCaller, recording: bool, event_id: str) -> None:
    await caller.conn.send({"type": "session.update", "event_id": event_id,
                            "session": {"type": "realtime", "recording": recording}})


# -- on request ------------------------------------------------------------------------------------
async def test_a_call_that_asks_at_open_is_recorded_and_told_so_one_that_does_not_is_not(on_request):
    server, folder = on_request
    asking = await mint(server.url, {"type": "realtime", "recording": True})
    async with WsCaller(server.url, asking, stream=False) as caller:
        created = caller.of_type("session.created")[0]
        assert recorded(created) is True
        asked_id = created.session.id
    async with WsCaller(server.url, KEY, stream=False) as caller:
        created = caller.of_type("session.created")[0]
        assert recorded(created) is False
        quiet_id = created.session.id
    assert (folder / f"{asked_id}.wav").exists() and (folder / f"{asked_id}.json").exists()
    assert not (folder / f"{quiet_id}.wav").exists()
    assert asking not in (folder / f"{asked_id}.json").read_text()  # the owner is a hash, never the secret


async def test_a_later_session_update_starts_the_recording_and_may_stop_it(on_request):
    server, folder = on_request
    async with WsCaller(server.url, KEY, stream=False) as caller:
        session_id = caller.of_type("session.created")[0].session.id
        await update(caller, True, "ev_on")
        assert recorded(await caller.wait("session.updated")) is True
        assert (folder / f"{session_id}.wav").exists()
        updated = len(caller.of_type("session.updated"))
        asked_off = time.monotonic()  # what answers it arrives after this, the first update before
        await update(caller, False, "ev_off")  # asked for, so the client may turn it off
        await caller.wait("session.updated", after=asked_off)
        assert len(caller.of_type("session.updated")) == updated + 1
        assert recorded(caller.of_type("session.updated")[-1]) is False
        assert not [e for e in caller.of_type("error") if e.event_id == "ev_off"]


async def test_only_the_owner_or_the_server_key_reaches_a_recording(on_request):
    server, _ = on_request
    mine = await mint(server.url, {"type": "realtime", "recording": True})
    theirs = await mint(server.url)
    async with WsCaller(server.url, mine, stream=False) as caller:
        recording_id = caller.of_type("session.created")[0].session.id
    async with WsCaller(server.url, theirs, stream=False):
        pass
    async with http(server.url, mine) as owner, http(server.url, theirs) as other, http(server.url, KEY) as keyed:
        listed = (await owner.get("/v1/recordings")).json()["data"]
        assert [r["id"] for r in listed] == [recording_id]
        assert listed[0]["call_id"] == recording_id and listed[0]["bytes"] >= 44
        assert recording_id not in [r["id"] for r in (await other.get("/v1/recordings")).json()["data"]]
        for path in (f"/v1/recordings/{recording_id}", f"/v1/recordings/{recording_id}/events"):
            refused = await other.get(path)  # another's recording answers as a missing one
            assert refused.status_code == 404 and refused.json()["error"]["code"] == "recording_not_found"
        assert (await other.delete(f"/v1/recordings/{recording_id}")).status_code == 404
        assert recording_id in [r["id"] for r in (await keyed.get("/v1/recordings")).json()["data"]]
        wav = await owner.get(f"/v1/recordings/{recording_id}")
        assert wav.status_code == 200 and wav.content[:4] == b"RIFF"
        assert (await keyed.get(f"/v1/recordings/{recording_id}/events")).status_code == 200
        assert (await owner.delete(f"/v1/recordings/{recording_id}")).status_code == 204
        assert (await keyed.get(f"/v1/recordings/{recording_id}")).status_code == 404
        for bad in (".hidden", "%2e%2e", "a%20b", "x" * 201):
            reply = await keyed.get(f"/v1/recordings/{bad}")
            assert reply.status_code == 400 and reply.json()["error"]["code"] == "invalid_recording_id", bad


# -- required recordings and none ------------------------------------------------------------------
async def test_a_client_cannot_turn_off_a_recording_the_policy_requires(tmp_path):
    with serve("--record", str(tmp_path), "--record-share", "1") as server:  # no key: loopback only
        async with WsCaller(server.url, stream=False) as caller:
            created = caller.of_type("session.created")[0]
            assert recorded(created) is True
            await update(caller, False, "ev_off")
            error = await caller.wait("error")
            assert error.error.code == "recording_required" and "share" in error.error.message
            assert recorded(await caller.wait("session.updated")) is True  # the recording goes on
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as local:
            listed = (await local.get("/v1/recordings")).json()["data"]
        assert created.session.id in [r["id"] for r in listed]
        assert server.stop() == 0


async def test_share_zero_records_nothing_and_no_policy_refuses_an_ask(tmp_path):
    with serve("--record", str(tmp_path), "--record-share", "0") as server:
        async with WsCaller(server.url, stream=False) as caller:
            assert recorded(caller.of_type("session.created")[0]) is False
            await update(caller, True, "ev_on")  # the share decides, not the client
            assert (await caller.wait("error")).error.code == "recording_unavailable"
        assert not list(tmp_path.glob("*.wav"))
        assert server.stop() == 0
    with serve() as server:  # no --record: no recording, no recordings API
        async with WsCaller(server.url, stream=False) as caller:
            assert recorded(caller.of_type("session.created")[0]) is False
            await update(caller, True, "ev_on")
            assert (await caller.wait("error")).error.code == "recording_unavailable"
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as local:
            assert (await local.get("/v1/recordings")).status_code == 404
        assert server.stop() == 0


# -- the policy's settings --------------------------------------------------------------------------
def _args(**given):
    defaults = {"no_metrics": False, "call_log": None, "record": None, "record_policy": None, "record_share": None,
                "record_notice": None, "record_max_mb": 1024.0, "record_max_age_h": 24.0, "drain_timeout_s": 30.0}
    return argparse.Namespace(**(defaults | given))


def test_the_policy_is_checked_with_a_clear_error(tmp_path):
    assert watch_config(_args()).policy.value == "none"
    assert watch_config(_args(record=tmp_path)).policy.value == "all"  # --record DIR alone: as before
    assert watch_config(_args(record=tmp_path, record_share=0.1)).policy.value == "share"
    for given, says in (({"record_policy": "all"}, "needs --record DIR"),
                        ({"record": tmp_path, "record_policy": "share"}, "needs --record-share"),
                        ({"record": tmp_path, "record_policy": "all", "record_share": 0.5}, "applies to"),
                        ({"record": tmp_path, "record_share": 1.5}, "less than or equal to 1")):
        with pytest.raises(ValueError, match=says):
            watch_config(_args(**given))
