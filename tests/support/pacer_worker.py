"""One replica's outbound and nothing else, as its own OS process: the real Telegram adapter
(python-telegram-bot, against the fake Bot API) paced by the shared outbound budget
(`bot.outbound.pacing.Paced`), sending messages into one conversation all at once.

For the budget's tests where no `lastword run` can reach the conversation yet (a group: the
adapters take DMs only). Run as ``python -m tests.support.pacer_worker <conversation> <count>`` with
the LASTWORD_* settings of a Telegram `lastword run` in the environment. It prints
``sent <n>`` as each message is delivered, and exits 0 once all are.
"""

from __future__ import annotations

import asyncio
import sys

from adapters.telegram import TelegramAdapter, TelegramSettings
from bot.config.settings import load_settings
from bot.outbound.pacing import Paced
from bot.service.app import make_store
from bot.store.connect import make_client


async def main(conversation: str, count: int) -> int:
    settings = load_settings()
    assert settings.redis_url, "LASTWORD_REDIS_URL must point at the test server"
    adapter = TelegramAdapter(settings.section(TelegramSettings))
    store = make_store(settings, make_client(settings.redis_url))
    paced = Paced(adapter, store, "telegram", settings.replica_id, mode=settings.outbound.budget)

    async def send(n: int) -> None:
        await paced.send(conversation, f"{settings.replica_id} {n}", f"{settings.replica_id}:{n}")
        print(f"sent {n}", flush=True)

    async with adapter.bot:
        await asyncio.gather(*(send(n) for n in range(count)))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1], int(sys.argv[2]))))
