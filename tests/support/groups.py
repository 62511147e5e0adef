"""Groups in process over a real server: the people, the group and a replica reading it."""

from __future__ import annotations

import time
from typing import Any

from bot.core.runtime import Runtime
from bot.message import InboundMessage, Place
from bot.tools import Toolbox
from tests.support.factories import RuntimeFactory
from tests.support.fakes.openai_server import FAKE_MODEL_ID, FakeOpenAI
from tests.support.fakes.outbound import RecordingOutbound

GROUP = "-100"


ANN, BOB, ADMIN = "1", "2", "9"


def said(
    who: str,
    n: int,
    text: str,
    *,
    mentioned: bool = False,
    chat: str = GROUP,
    topic: str = "",
    bot: bool = False,
) -> InboundMessage:
    """Message `n` of group `chat`, said by `who`."""
    place = Place("test", chat, who, topic, group=True)
    name = {ANN: "Ann", BOB: "Bob", ADMIN: "Admin"}.get(who, who)
    return InboundMessage.at(
        place,
        f"g{n}",
        text,
        display_name=name,
        timestamp=time.time(),
        mentioned=mentioned,
        from_bot=bot,
    )


def conv(who: str, chat: str = GROUP, topic: str = "") -> str:
    return Place("test", chat, who, topic, group=True).conversation


async def group_replica(
    runtime_factory: RuntimeFactory,
    fake: FakeOpenAI,
    toolbox: Toolbox | None = None,
    **groups: Any,
) -> tuple[Runtime, RecordingOutbound]:
    llm = {"provider": "openai", "base_url": fake.base_url, "api_key": "k"}
    return await runtime_factory(
        llm=llm | {"model": FAKE_MODEL_ID, "retries": 0},
        groups={"allowed": [GROUP]} | groups,
        access={"rate_per_minute": 0, "admins": [ADMIN]},
        toolbox=toolbox,
    )
