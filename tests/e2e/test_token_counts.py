"""One token count: after a few replies from a dearer model, /usage, /stats and `lastword
status` print the same number, the prompt plus completion tokens the provider reported, and
/usage shows the cost-weighted figure its budget counts apart, labelled as weighted. Through a
`lastword run` (Telegram webhook, the OpenAI client on the fake provider, a real server) and
the `lastword status` command."""

from __future__ import annotations

import asyncio
import html
import json
from datetime import UTC, datetime

import pytest

from tests.support.console import clean_env
from tests.support.fakes.openai_server import ToolCalls
from tests.support.operations import lastword
from tests.support.waits import settled
from tests.support.world import CHAT, CONVERSATION, Bot, World

pytestmark = pytest.mark.timeout(60)

COST = 3
MODELS = json.dumps(
    [
        {"name": "plain", "model": "plain-model", "cost": 1},
        {"name": "dear", "model": "dear-model", "cost": COST},
    ]
)
BUDGET = 100_000
ANSWER = "An answer of a known length, so its completion tokens are known too."


async def say(world: World, bot: Bot, text: str, version: int) -> str:
    """Send one message, wait until its burst is answered, and return the answer."""
    sent = len(world.telegram.sent_messages)
    await bot.post(world.telegram.private_text_update(CHAT, CHAT, text))
    await settled(world.redis, CONVERSATION, version=version, within_s=15)
    [reply] = world.telegram.sent_messages[sent:]
    # Admin answers are sent as HTML.
    return html.unescape(reply.text or "")


async def test_usage_stats_and_status_print_the_same_token_count(world: World) -> None:
    provider = world.provider
    provider.reply = lambda request: ANSWER
    settings = {
        "LASTWORD_ACCESS__ADMINS": str(CHAT),
        "LASTWORD_LLM__MODELS": MODELS,
        "LASTWORD_LLM__DAILY_TOKENS_PER_USER": str(BUDGET),
    }
    async with world.bot("a", **settings) as bot:
        # One message a burst: nothing is cut short, so each request is billed whole.
        await say(world, bot, "/model dear", version=1)
        await say(world, bot, "hello there", version=2)
        await say(world, bot, "and a second question", version=3)
        usage = await say(world, bot, "/usage", version=4)
        stats = await say(world, bot, "/stats", version=5)
    env = clean_env(world.data_dir / "status", LASTWORD_REDIS_URL=world.server.url)
    shown, as_json = await asyncio.gather(
        asyncio.to_thread(lastword, "status", env=env),
        asyncio.to_thread(lastword, "status", "--json", env=env),
    )
    assert shown.returncode == 0 and as_json.returncode == 0, shown.stderr + as_json.stderr

    # What the provider billed: every prompt as it landed, and each answer's tokens.
    assert [r.model for r in provider.requests] == ["dear-model"] * 2
    prompt = sum(r.prompt_tokens for r in provider.requests)
    completion = len(provider.requests) * ToolCalls(calls=(), text=ANSWER).tokens()
    tokens = prompt + completion
    assert prompt > 0 and completion > 0
    count = f"{tokens:,} tokens ({prompt:,} prompt + {completion:,} completion)"
    weighted = COST * tokens

    assert usage == (
        f"Today: {count}.\n"
        f"This month: {count}.\n"
        "Your daily budget counts weighted tokens (each token times its model's cost, "
        f"see /model): {weighted:,} today, {weighted:,} this month.\n"
        f"Left today: {BUDGET - weighted:,} of {BUDGET:,} weighted tokens "
        "(renews at midnight UTC)."
    )
    assert f"Spent: {count} in 2 generations" in stats.splitlines()
    day = datetime.now(UTC).date().isoformat()
    [title] = [line for line in shown.stdout.splitlines() if line.startswith("tokens today")]
    assert title.startswith(f"tokens today ({day}, UTC): {count} in 2 generations;")
    today = json.loads(as_json.stdout)["tokens_today"]
    assert (today["prompt"], today["completion"], today["users"]) == (prompt, completion, 1)
    assert [(top["conversation"], top["tokens"]) for top in today["top"]] == [
        (CONVERSATION, tokens)
    ]
