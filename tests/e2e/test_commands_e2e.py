"""The user's commands across replicas and restarts: `lastword run` processes (Telegram
webhook, the OpenAI client on the fake provider, a real server). A /model pick is kept in
Redis: another replica, and the same one after a restart, answer with it; a dearer model's
tokens weigh more in the user's day. /retry on another replica than the one that answered
writes the answer again and puts it in the old one's place; an unknown command never reaches
the model. A /persona set through one process is in the system prompt the other sends, and a
/forget asked on one and confirmed on the other erases the history, the model, the persona and
the cached transcripts and documents, and leaves the usage totals."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import cast

import pytest

from bot.commands import ECHO_MODEL_ANSWER, unknown
from bot.commands.forget import CONFIRM, FORGOTTEN
from bot.llm.prompt import PERSONA_INTRO
from bot.store import HistoryEntry, Keys
from tests.support.fakes import files
from tests.support.waits import settled
from tests.support.world import CHAT, CONVERSATION, Bot, World

pytestmark = pytest.mark.timeout(60)

MODELS = json.dumps(
    [
        {"name": "fast", "model": "fast-model-1", "cost": 1},
        {"name": "smart", "model": "smart-model-2", "cost": 10},
    ]
)


async def test_a_picked_model_is_used_by_every_replica_and_survives_a_restart(
    world: World,
) -> None:
    telegram, provider = world.telegram, world.provider
    models = {"LASTWORD_LLM__MODELS": MODELS, "LASTWORD_LLM__MODEL": "default-model"}
    async with world.bot("a", **models) as first:
        await first.post(telegram.private_text_update(CHAT, CHAT, "/model"))
        await settled(world.redis, CONVERSATION, version=1, within_s=10)
        await first.post(telegram.private_text_update(CHAT, CHAT, "/model nope"))
        await settled(world.redis, CONVERSATION, version=2, within_s=10)
        await first.post(telegram.private_text_update(CHAT, CHAT, "/model smart"))
        await first.post(telegram.private_text_update(CHAT, CHAT, "hello"))
        await settled(world.redis, CONVERSATION, version=4, within_s=10)
    listing, unknown, picked = (m.text or "" for m in telegram.sent_messages)
    assert "fast (fast-model-1)" in listing
    assert "smart (smart-model-2, each token counts 10x)" in listing
    assert "You have the default, default-model." in listing
    assert unknown.startswith("There is no model called 'nope'.")
    assert picked.startswith("From now on I answer you with smart (smart-model-2).")
    # The rest of the burst that picked it is already answered by it.
    assert [r.model for r in provider.requests] == ["smart-model-2"]
    # Its tokens weigh 10x in the user's day (the conversation's own totals stay as spent).
    keys = Keys(CONVERSATION)
    prompt, completion = await world.redis.hmget(keys.usage, ["prompt", "completion"])
    spent = int(prompt or 0) + int(completion or 0)
    day = int(await world.redis.hget(keys.day(datetime.now(UTC).date()), "tokens") or 0)
    assert spent > 0 and day == 10 * spent

    # Another replica, started afresh, answers with the pick.
    async with world.bot("b", **models) as second:
        await second.post(telegram.private_text_update(CHAT, CHAT, "/usage"))
        await second.post(telegram.private_text_update(CHAT, CHAT, "and now?"))
        await settled(world.redis, CONVERSATION, version=6, within_s=10)
    assert [r.model for r in provider.requests] == ["smart-model-2", "smart-model-2"]
    usage = telegram.sent_messages[-1].text or ""
    assert usage.startswith(f"Today: {spent:,} tokens (")
    assert (
        f"counts weighted tokens (each token times its model's cost, see /model): {day:,} today"
        in usage
    )


async def test_retry_on_another_replica_replaces_the_answer_and_unknown_commands_skip_the_model(
    world: World,
) -> None:
    telegram, provider = world.telegram, world.provider
    answers = iter(["a first answer", "a better answer"])
    provider.reply = lambda request: next(answers)
    async with world.bot("a") as first, world.bot("b") as second:
        await first.post(telegram.private_text_update(CHAT, CHAT, "name a colour"))
        await settled(world.redis, CONVERSATION, version=1, within_s=10)
        await second.post(telegram.private_text_update(CHAT, CHAT, "/retry"))
        await settled(world.redis, CONVERSATION, version=2, within_s=10)
        await first.post(telegram.private_text_update(CHAT, CHAT, "/weather Paris"))
        await settled(world.redis, CONVERSATION, version=3, within_s=10)

    texts = [m.text for m in telegram.sent_messages]
    assert texts == ["a first answer", "a better answer", unknown("weather")]
    first_ask, retried = provider.requests
    assert retried.messages == first_ask.messages  # the same question, the same history
    raw = await world.redis.lrange(Keys(CONVERSATION).history, 0, -1)
    history = [HistoryEntry.from_json(entry) for entry in raw]
    assert [(h.role, h.text) for h in history] == [
        ("user", "name a colour"),
        ("assistant", "a better answer"),
        ("user", "/weather Paris"),
        ("assistant", unknown("weather")),
    ]


async def test_model_in_echo_mode_says_the_echo_model_answers(world: World) -> None:
    """With no model set up, /model names none it does not use, listed or not."""
    telegram = world.telegram
    settings = {"LASTWORD_LLM__PROVIDER": "echo", "LASTWORD_LLM__MODELS": MODELS}
    async with world.bot("a", **settings) as first:
        await first.post(telegram.private_text_update(CHAT, CHAT, "/model"))
        await settled(world.redis, CONVERSATION, version=1, within_s=10)
        await first.post(telegram.private_text_update(CHAT, CHAT, "/model smart"))
        await settled(world.redis, CONVERSATION, version=2, within_s=10)
    answers = [m.text for m in telegram.sent_messages]
    assert answers == [ECHO_MODEL_ANSWER, ECHO_MODEL_ANSWER]
    assert world.provider.requests == []


# Each process answers what it took in: its own timer fires after the quiet time, while the
# other's sweep, which would also find the burst, waits a minute. Each has its own API key,
# so the provider tells their requests apart.
ONLY_ITS_OWN = {"LASTWORD_SWEEP_INTERVAL_MS": "60000", "LASTWORD_LLM__MODELS": MODELS}
PIRATE = "Answer like a pirate."


async def say(world: World, bot: Bot, version: int, *updates: dict[str, object]) -> None:
    """Post updates to one process and wait until their burst is answered."""
    for update in updates:
        await bot.post(update)
    await settled(world.redis, CONVERSATION, version=version, within_s=10)


async def test_persona_and_forget_across_two_processes(world: World) -> None:
    telegram, provider, redis = world.telegram, world.provider, world.redis
    keys = Keys(CONVERSATION)
    provider.transcribe = lambda request: "the secret word is apple"
    voice = telegram.add_file(files.voice(3))
    notes = telegram.add_file(b"apple pie: flour, butter, apples\n")
    a_only = ONLY_ITS_OWN | {"LASTWORD_LLM__API_KEY": "sk-a"}
    b_only = ONLY_ITS_OWN | {"LASTWORD_LLM__API_KEY": "sk-b"}
    async with world.bot("a", **a_only) as a, world.bot("b", **b_only) as b:
        await say(world, a, 1, telegram.private_text_update(CHAT, CHAT, f"/persona {PIRATE}"))
        await say(
            world,
            b,
            3,
            telegram.voice_update(CHAT, CHAT, file_id=voice),
            telegram.document_update(CHAT, CHAT, "notes.txt", file_id=notes),
        )
        [read] = provider.requests
        assert read.api_key == "sk-b"
        assert str(read.messages[0]["content"]).endswith(f"{PERSONA_INTRO}\n{PIRATE}")
        await say(world, a, 4, telegram.private_text_update(CHAT, CHAT, "/model smart"))
        cached = [f.decode() for f in cast(list[bytes], await redis.zrange(keys.heard, 0, -1))]
        assert len(cached) == 2 and await redis.exists(*map(keys.transcript, cached)) == 2
        usage = await redis.hgetall(keys.usage)
        assert int(usage[b"prompt"]) > 0

        await say(world, a, 5, telegram.private_text_update(CHAT, CHAT, "/forget"))
        await say(world, b, 6, telegram.private_text_update(CHAT, CHAT, "/forget"))
        assert [m.text for m in telegram.sent_messages[-2:]] == [CONFIRM, FORGOTTEN]
        # Asked on one, confirmed on the other.
        assert a.running.said(CONFIRM) and not b.running.said(CONFIRM)
        assert b.running.said(FORGOTTEN) and not a.running.said(FORGOTTEN)
        history = [HistoryEntry.from_json(h) for h in await redis.lrange(keys.history, 0, -1)]
        assert [(h.role, h.text) for h in history] == [("assistant", FORGOTTEN)]
        assert await redis.hmget(keys.state, ["model", "persona", "forget_asked"]) == [None] * 3
        assert not await redis.exists(keys.heard, *map(keys.transcript, cached))
        assert await redis.hgetall(keys.usage) == usage

        await say(world, a, 7, telegram.private_text_update(CHAT, CHAT, "what was the word?"))
    after = provider.requests[-1]
    assert (after.api_key, after.model) == ("sk-a", "gpt-4o-mini")
    assert PERSONA_INTRO not in str(after.messages[0]["content"])
    assert "apple" not in str(after.messages)
