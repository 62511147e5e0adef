"""Waiting for the replies of the media world and finding the model's request about a file."""

from __future__ import annotations

import asyncio
import time

from tests.support.fakes.openai_server import RecordedRequest
from tests.support.world import World


def replies(world: World, chat: int) -> list[str]:
    return [m.text or "" for m in world.telegram.sent_messages if m.chat_id == chat]


async def wait_for_replies(world: World, chat: int, count: int, within_s: float = 20) -> None:
    deadline = time.monotonic() + within_s
    while len(replies(world, chat)) < count:
        assert time.monotonic() < deadline, f"chat {chat}: {replies(world, chat)!r}"
        await asyncio.sleep(0.02)


def request_about(world: World, text: str) -> RecordedRequest:
    [request] = [r for r in world.provider.requests if text in r.last_user_text]
    return request
