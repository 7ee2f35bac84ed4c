"""Access control against a real `duplex serve --api-key`: the key on every endpoint but the demo
page, client secrets (minted with the official SDK, single use, expiring), calls reachable only
with the credential that opened them, 401/403/429 with JSON bodies."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
import websockets
from openai import AsyncOpenAI
from websockets.exceptions import InvalidStatus

from duplex_tools.client import RealtimeClient
from duplex_tools.harness import ServerProcess
from duplex_tools.ws_client import WsCaller

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
KEY = "sk-test-access-0123456789"


@pytest.fixture(scope="module")
def server():
    with ServerProcess(["--config", "toy-voice", "--port", "0", "--max-sessions", "4", "--ice-loopback",
                        "--api-key", KEY, "--demo-open"]) as proc:
        yield proc
    assert proc.stop() == 0, "".join(proc.output[-30:])


def http(url: str, key: str | None = None) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url, timeout=10, headers={"Authorization": f"Bearer {key}"} if key else {})


async def mint(url: str, seconds: int = 600, instructions: str | None = None) -> tuple[str, int]:
    sdk = AsyncOpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
    session = {"type": "realtime", **({"instructions": instructions} if instructions else {})}
    secret = await sdk.realtime.client_secrets.create(expires_after={"anchor": "created_at", "seconds": seconds},
                                                      session=session)
    return secret.value, secret.expires_at


def refusal(exc: InvalidStatus) -> tuple[int, str]:
    return exc.response.status_code, json.loads(exc.response.body)["error"]["code"]


async def test_the_key_guards_every_endpoint_but_the_demo_page(server):
    async with http(server.url) as anonymous, http(server.url, "sk-wrong-key-0000000000") as wrong:
        for client, code in ((anonymous, "missing_api_key"), (wrong, "invalid_api_key")):
            reply = await client.get("/duplex/stats")
            assert reply.status_code == 401 and reply.json()["error"]["code"] == code
            assert reply.headers["www-authenticate"].startswith("Bearer")
            reply = await client.post("/v1/realtime/calls", content="v=0", headers={"Content-Type": "application/sdp"})
            assert reply.status_code == 401 and reply.json()["error"]["type"] == "authentication_error"
        assert (await anonymous.get("/")).status_code == 200
        assert (await anonymous.get("/web/app.js")).status_code == 200
    async with http(server.url, KEY) as keyed:
        assert (await keyed.get("/duplex/stats")).status_code == 200
    with pytest.raises(InvalidStatus) as refused:
        async with WsCaller(server.url, "sk-wrong-key-0000000000", stream=False):
            pass
    assert refusal(refused.value) == (401, "invalid_api_key")


async def test_a_client_secret_opens_one_call_and_nothing_else(server):
    secret, _ = await mint(server.url, instructions="Answer in one word.")
    async with WsCaller(server.url, secret, stream=False) as caller:
        created = caller.of_type("session.created")[0]
        assert created.session.instructions == "Answer in one word."  # the secret's session settings
        async with http(server.url, secret) as holder:
            reply = await holder.get("/duplex/stats")
            assert reply.status_code == 403 and reply.json()["error"]["code"] == "client_secret_not_allowed"
            reply = await holder.post("/v1/realtime/client_secrets")
            assert reply.status_code == 403
    with pytest.raises(InvalidStatus) as again:
        async with WsCaller(server.url, secret, stream=False):
            pass
    assert refusal(again.value) == (401, "client_secret_used")


async def test_an_expired_client_secret_is_refused(server):
    secret, expires_at = await mint(server.url, seconds=1)
    while time.time() < expires_at + 1:  # the server's clock passes the expiry (whole seconds)
        await asyncio.sleep(0.1)
    with pytest.raises(InvalidStatus) as refused:
        async with WsCaller(server.url, secret, stream=False):
            pass
    assert refusal(refused.value) == (401, "client_secret_expired")


async def test_a_call_answers_only_to_the_credential_that_opened_it(server, loopback_candidates):
    secret, _ = await mint(server.url)
    client = RealtimeClient(server.url, api_key=secret)
    await client.connect()
    try:
        assert client.call_url is not None and len(client.call_url.rsplit("_", 1)[1]) == 32  # 128 random bits
        async with http(server.url, KEY) as keyed, http(server.url, secret) as owner:
            for attempt in (keyed.get(client.call_url), keyed.delete(client.call_url),
                            keyed.post(client.call_url + "/hangup")):
                reply = await attempt
                assert reply.status_code == 403 and reply.json()["error"]["code"] == "not_call_owner"
            seen = await owner.get(client.call_url)
            assert seen.status_code == 200 and seen.json()["id"] == client.call_url.rsplit("/", 1)[1]
        assert await client.hang_up() == 204
    finally:
        await client.close()
    keyed_call = RealtimeClient(server.url, api_key=KEY)
    await keyed_call.connect()
    try:
        other, _ = await mint(server.url)
        async with http(server.url, other) as stranger:
            assert (await stranger.delete(keyed_call.call_url)).status_code == 403
        assert await keyed_call.hang_up() == 204
    finally:
        await keyed_call.close()


async def test_a_browser_passes_the_key_as_a_subprotocol_and_the_demo_gets_a_secret(server):
    url = server.url.replace("http://", "ws://") + "/v1/realtime?model=duplex"
    async with websockets.connect(url, subprotocols=["realtime", f"openai-insecure-api-key.{KEY}"]) as ws:
        assert ws.subprotocol == "realtime"
        assert json.loads(await ws.recv())["type"] == "session.created"
    async with http(server.url) as page:  # the demo page holds no key
        reply = await page.post("/duplex/demo/client_secret")
        assert reply.status_code == 200 and reply.json()["value"].startswith("ek_")
    async with WsCaller(server.url, reply.json()["value"], stream=False) as caller:
        assert caller.of_type("session.created")


def test_repeated_failures_from_one_address_get_429():
    proc = ServerProcess(["--config", "toy-voice", "--port", "0", "--api-key", KEY])
    with proc, httpx.Client(base_url=proc.url or "", timeout=10) as client:
        codes = [client.get("/duplex/stats", headers={"Authorization": "Bearer nope"}).status_code
                 for _ in range(20)]
        assert set(codes) == {401}
        limited = client.get("/duplex/stats", headers={"Authorization": f"Bearer {KEY}"})
        assert limited.status_code == 429 and limited.json()["error"]["type"] == "rate_limit_error"
        assert int(limited.headers["retry-after"]) >= 1
    assert proc.stop() == 0


async def test_a_refused_offer_does_not_spend_the_client_secret(server, loopback_candidates):
    secret, _ = await mint(server.url)
    async with http(server.url, secret) as holder:  # a malformed offer: refused before any call exists
        reply = await holder.post("/v1/realtime/calls", content="v=0", headers={"Content-Type": "application/sdp"})
        assert reply.status_code == 400, reply.text
    client = RealtimeClient(server.url, api_key=secret)
    await client.connect()  # the same secret still opens its one call ...
    try:
        async with http(server.url, secret) as holder:  # ... and only one
            again = await holder.post("/v1/realtime/calls", content="v=0", headers={"Content-Type": "application/sdp"})
            assert again.status_code == 401 and again.json()["error"]["code"] == "client_secret_used"
    finally:
        assert await client.hang_up() == 204
