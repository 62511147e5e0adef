"""Groups on the fake Telegram: the people in the room, their updates and the bot's replies."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from redis.asyncio import Redis

from bot.message import Place
from bot.store import Keys
from bot.store.embedded import EmbeddedRedis
from tests.support.fakes.openai_server import FAKE_MODEL_ID, FakeOpenAI
from tests.support.fakes.telegram_server import FakeTelegram, RecordedCall
from tests.support.waits import eventually
from tests.support.webhook_fleet import Replica, fleet, post

GROUP, OTHER_GROUP = -1001, -1002


ANN, BOB, CAT, DAN, OTHER_BOT = 101, 102, 103, 104, 999


NAMES = {ANN: "Ann", BOB: "Bob", CAT: "Cat", DAN: "Dan", OTHER_BOT: "Otto"}


BOT = "@fake_bot"


def model_env(fake: FakeOpenAI) -> dict[str, str]:
    return {
        "LASTWORD_LLM__PROVIDER": "openai",
        "LASTWORD_LLM__BASE_URL": fake.base_url,
        "LASTWORD_LLM__MODEL": FAKE_MODEL_ID,
        "LASTWORD_LLM__RETRIES": "0",
        "LASTWORD_GROUPS__ALLOWED": str(GROUP),
        # A window well past the time one line takes to post on a loaded machine, so that a
        # burst's lines, posted one after another, stay one burst.
        "LASTWORD_DEBOUNCE__QUIET_MS": "1000",
        "LASTWORD_DEBOUNCE__MAX_WAIT_MS": "5000",
    }


def conversation(user: int, chat: int = GROUP) -> str:
    return Place("telegram", str(chat), str(user), group=True).conversation


class Room:
    """The group as its members use it: each says a line to one of the replicas in turn."""

    def __init__(self, fake: FakeTelegram, replicas: list[Replica]) -> None:
        self.fake = fake
        self.members = replicas
        self.replicas = itertools.cycle(replicas)

    async def say(self, user: int, text: str, chat: int = GROUP, topic: int | None = None) -> int:
        """Post the line (in forum topic `topic`, if given); its message id."""
        update = self.fake.group_text_update(
            chat, user, text, first_name=NAMES[user], is_bot=user == OTHER_BOT, topic=topic
        )
        assert await post(next(self.replicas), update) == 200
        return int(update["message"]["message_id"])


@contextlib.asynccontextmanager
async def group(
    server: EmbeddedRedis,
    short_dir: Path,
    each: Callable[[int], dict[str, str]] = lambda n: {},
) -> AsyncIterator[tuple[FakeTelegram, FakeOpenAI, Room]]:
    """The fake Bot API, the fake model, and the group over three replicas (replica n with
    `each(n)` on top of the model's settings)."""
    async with (
        FakeTelegram() as fake,
        FakeOpenAI() as model,
        fleet(server, fake, short_dir, each=lambda n: model_env(model) | each(n)) as replicas,
    ):
        yield fake, model, Room(fake, replicas)


def reply_to(fake: FakeTelegram, message_id: int) -> list[RecordedCall]:
    return [c for c in fake.bot_replies_in(GROUP) if c.reply_to_message_id == message_id]


async def replied(fake: FakeTelegram, message_id: int) -> None:
    async def found() -> bool:
        return bool(reply_to(fake, message_id))

    await eventually(found, 30, what=f"a reply to message {message_id}")


async def settled(redis: Redis, *users: int) -> None:
    """Every listed person's messages answered (V == W, nothing in an outbox)."""

    async def done() -> bool:
        for user in users:
            k = Keys(conversation(user))
            v, w = await redis.hmget(k.state, ["v", "w"])
            if v != w or await redis.exists(k.outbox):
                return False
        return True

    await eventually(done, 30, what=f"the bursts of {users} answered")
