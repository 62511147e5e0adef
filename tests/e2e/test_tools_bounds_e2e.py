"""Bounds on MCP servers through `lastword run` (Telegram webhook, the OpenAI client on the fake
provider taught to call tools, a real server, real MCP servers):

- one user's tool answers with 100 MB in one message, and another user's reply still arrives
  on time: the replica reads the answer in short steps, stops the server at the message limit,
  and the first user hears of the error;
- a server's URL with a credential in its path or its query, and its headers, never reach the
  replica's log, even at DEBUG, where the HTTP library logs every request's URL.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.support.fakes.openai_server import RecordedRequest, ToolCalls, ToolPolicy
from tests.support.fakes.telegram_server import RecordedCall
from tests.support.mcp import TOKEN
from tests.support.mcp_runs import append_server, servers
from tests.support.mcp_secrets import PATH_SECRET, QUERY_SECRET
from tests.support.waits import eventually
from tests.support.world import CHAT, World

pytestmark = [pytest.mark.timeout(90), pytest.mark.slow]

# The other user, and how long their reply may take from their message: the debounce's quiet
# spell (600 ms in `World`) and a cycle, with room for a loaded machine.
OTHER = 6363
ON_TIME_S = 3.0


async def test_another_users_reply_is_on_time_while_a_tool_streams_100_mb(
    world: World, short_dir: Path
) -> None:
    flood = ToolPolicy("flood", json.dumps({"n": 100_000_000}), answer="Flood: {result}")

    def reply(request: RecordedRequest) -> str | ToolCalls:
        return flood(request) if "flood" in request.last_user_text else "quick answer"

    world.provider.reply = reply
    telegram = world.telegram

    def sent_to(chat: int) -> list[RecordedCall]:
        return [m for m in telegram.sent_messages if m.chat_id == chat]

    async with world.bot("a", **servers(app=append_server(short_dir / "effects.txt"))) as bot:
        await bot.post(telegram.private_text_update(CHAT, CHAT, "flood me"))

        async def asked() -> bool:
            return len(world.provider.requests) >= 1

        # The model has asked for the tool: it runs from now on.
        await eventually(asked, 10, what="the model asking for the flood")
        posted = time.monotonic()
        await bot.post(telegram.private_text_update(OTHER, OTHER, "hello"))

        async def answered() -> bool:
            return bool(sent_to(OTHER) and sent_to(CHAT))

        await eventually(answered, 20, what="a reply to each user")
    [quick] = sent_to(OTHER)
    assert quick.text == "quick answer"
    assert quick.at - posted < ON_TIME_S, f"the other user waited {quick.at - posted:.1f} s"
    [flooded] = sent_to(CHAT)
    assert (flooded.text or "").startswith(
        "Flood: error: the tool failed: TooLong: the answer of the MCP server app was over "
        "4194304 bytes"
    ), flooded.text


async def test_a_servers_url_and_headers_never_reach_the_log(
    world: World, http_server: str
) -> None:
    origin = http_server.removesuffix("/mcp")
    headers = {"Authorization": f"Bearer {TOKEN}"}
    web = {"url": f"{http_server}?api_key={QUERY_SECRET}", "headers": headers}
    # Its path is not the server's: it never starts, and is retried, with a warning.
    hidden = {"url": f"{origin}/s/{PATH_SECRET}/mcp", "headers": headers}
    world.provider.reply = ToolPolicy(
        "read_only_echo", '{"text": "over http"}', answer="Echo: {result}"
    )
    async with world.bot("a", **servers(web=web, hidden=hidden)) as bot:
        await bot.post(world.telegram.private_text_update(CHAT, CHAT, "echo"))
        reply = await world.one_reply()

        async def warned() -> bool:
            return bool(bot.running.said(f"MCP server hidden ({origin}/***) is not running"))

        await eventually(warned, 10, what="the warning about the hidden server")
    assert reply == "Echo: over http"
    # At DEBUG the HTTP library logs each request's URL: the requests were made, and shown.
    assert bot.running.said("HTTP Request: POST ")
    for secret in (QUERY_SECRET, PATH_SECRET, TOKEN):
        assert secret not in bot.log
