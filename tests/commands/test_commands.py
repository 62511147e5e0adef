"""Commands (/start, /help, /stop, /usage, /reset, unknown ones) and access control
(allow-list, per-user rate limit), shared by every platform: in-process against the real store
and the loopback fake model. /stop across replica processes: tests/e2e/test_stop.py."""

from __future__ import annotations

import pytest

from bot.commands import (
    HELP,
    NOTHING_TO_RETRY,
    RATE_LIMITED,
    REFUSAL,
    RESET,
    STOPPED,
    WELCOME,
    Ask,
    admin,
    command_of,
    decoded,
    encoded,
    plan,
    unknown,
)
from bot.commands.base import Change
from bot.commands.chat import ModelPick
from bot.commands.forget import Asked, Erase
from bot.commands.persona import Persona
from bot.config.settings import InstalledSettings
from bot.message import Attachment
from tests.support.builders import message
from tests.support.commands import CONV, Start
from tests.support.factories import SettingsFactory
from tests.support.fakes.openai_server import FakeOpenAI
from tests.support.waits import settled


@pytest.mark.parametrize(
    ("text", "name"),
    [
        ("/start", "start"),
        ("/help", "help"),
        ("  /RESET now", "reset"),
        ("/reset@LastwordBot", "reset"),
        ("/unknown", "unknown"),
        ("/stop@Bot please", "stop"),
        ("/", None),
        ("/etc/hosts is broken", None),
        ("reset", None),
        ("a /reset in the middle", None),
    ],
)
def test_command_names(text: str, name: str | None) -> None:
    assert command_of(text) == name


def test_plan_drops_what_came_before_the_last_reset() -> None:
    burst = [message(t, n=i) for i, t in enumerate(["a", "/reset", "b", "/help", "/reset", "c"])]
    result = plan(watermark=10, unanswered=burst)
    assert result.reset == 15  # the second /reset is version 10 + 5
    assert result.answers == (RESET,)
    assert [m.text for m in result.for_model] == ["c"]
    keep = plan(watermark=0, unanswered=[message("/start", n=1), message("x", n=2)])
    assert (keep.reset, [m.text for m in keep.for_model]) == (0, ["x"])
    assert [a.command for a in keep.answers if isinstance(a, Ask)] == ["start"]


def test_plan_drops_what_came_before_the_last_stop_and_says_so() -> None:
    texts = ["a", "b", "/stop"]
    stopped = plan(watermark=4, unanswered=[message(t, n=i) for i, t in enumerate(texts)])
    assert (stopped.reset, stopped.answers, stopped.for_model) == (0, (STOPPED,), ())
    # What came after the /stop is answered as usual, and the history is kept.
    texts = ["a", "/stop", "/usage", "c", "/frobnicate"]
    after = plan(watermark=0, unanswered=[message(t, n=i) for i, t in enumerate(texts)])
    user = after.for_model[0].user_id
    assert after.answers == (Ask("usage", by=user, version=3), unknown("frobnicate"))
    assert [m.text for m in after.for_model] == ["c"] and after.keeps_history


async def test_unknown_commands_get_a_help_line_not_the_model(bot: Start, fake: FakeOpenAI) -> None:
    runtime, outbound = await bot()
    assert await runtime.ingest(message("/weather Paris", n=1))
    await settled(runtime, CONV)
    assert outbound.texts() == ["I don't know /weather. /help lists what I understand."]
    assert fake.requests == []


async def test_usage_shows_today_this_month_and_what_is_left(bot: Start, fake: FakeOpenAI) -> None:
    runtime, outbound = await bot(llm={"daily_tokens_per_user": 100_000})
    assert await runtime.ingest(message("count my tokens", n=1))
    await settled(runtime, CONV)
    spending = await runtime.store.spending(CONV, message("x").user_id)
    today, month = spending.tokens_today, spending.tokens_month
    assert today == month and today.total > 0 and spending.budget is None
    # No model weighs more than another: the budget counts the tokens as spent.
    assert spending.today == spending.month == today.total
    assert await runtime.ingest(message("/usage", n=2))
    await settled(runtime, CONV)
    count = f"{today.total:,} tokens ({today.prompt:,} prompt + {today.completion:,} completion)"
    assert outbound.texts()[-1] == (
        f"Today: {count}.\n"
        f"This month: {count}.\n"
        f"Left today: {100_000 - today.total:,} of 100,000 tokens (renews at midnight UTC)."
    )
    assert len(fake.requests) == 1  # /usage did not reach the model


async def test_start_and_help_answer_without_the_model(bot: Start, fake: FakeOpenAI) -> None:
    runtime, outbound = await bot()
    assert await runtime.ingest(message("/start", n=1))
    assert await runtime.ingest(message("/help", n=2))
    await settled(runtime, CONV)
    assert outbound.texts() == [WELCOME + "\n\n" + HELP]
    assert fake.requests == []
    assert await runtime.store.counters(CONV) == (2, 2)  # commands advance W too


async def test_reset_empties_history_and_drops_the_burst_before_it(
    bot: Start, fake: FakeOpenAI
) -> None:
    runtime, outbound = await bot()
    assert await runtime.ingest(message("remember the word apple", n=1))
    await settled(runtime, CONV)
    assert len(await runtime.store.history(CONV)) == 2

    for n, text in [(2, "forget this"), (3, "/reset"), (4, "what word?")]:
        assert await runtime.ingest(message(text, n=n))
    await settled(runtime, CONV)

    assert outbound.texts()[-1] == RESET + "\n\nYou said: what word?"
    last = fake.requests[-1]
    # Nothing from before the reset reached the model: no history, no "forget this".
    assert [m["role"] for m in last.messages] == ["system", "user"]
    assert last.last_user_text == "what word?"
    history = await runtime.store.history(CONV)
    assert [(h.role, h.version, h.text) for h in history] == [
        ("user", 4, "what word?"),
        ("assistant", 4, RESET + "\n\nYou said: what word?"),
    ]
    assert await runtime.store.counters(CONV) == (4, 4)


async def test_allow_list_refuses_once_and_never_reaches_the_model(
    bot: Start, fake: FakeOpenAI
) -> None:
    access = {"allowed_users": ["friend"]}
    runtime, outbound = await bot(access=access)
    assert not await runtime.ingest(message("hello?", n=1, user="stranger"))
    assert not await runtime.ingest(message("hello??", n=2, user="stranger"))
    assert outbound.texts() == [REFUSAL]
    assert await runtime.store.counters(CONV) == (0, 0)

    assert await runtime.ingest(message("hi", n=3, user="friend"))
    await settled(runtime, CONV)
    assert outbound.texts() == [REFUSAL, "You said: hi"]
    assert [r.last_user_text for r in fake.requests] == ["hi"]


async def test_rate_limit_drops_the_excess_with_one_notice(bot: Start, fake: FakeOpenAI) -> None:
    runtime, outbound = await bot(access={"rate_per_minute": 3})
    accepted = [await runtime.ingest(message(n=n)) for n in range(1, 7)]
    assert accepted == [True, True, True, False, False, False]
    # A redelivery of an accepted message is still just a duplicate, not counted.
    assert not await runtime.ingest(message(n=1))
    await settled(runtime, CONV)
    [request] = fake.requests
    prompt = request.last_user_text
    assert 0 <= prompt.index("text 1") < prompt.index("text 2") < prompt.index("text 3")
    assert "text 4" not in prompt
    assert outbound.texts() == [RATE_LIMITED, "You said: " + prompt]
    assert await runtime.store.counters(CONV) == (3, 3)


def test_allowed_users_read_from_a_comma_separated_variable(
    make_settings: SettingsFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_settings()  # clears LASTWORD_* from the environment for this test
    monkeypatch.setenv("LASTWORD_ACCESS__ALLOWED_USERS", "12, 34,,56")
    monkeypatch.setenv("LASTWORD_ACCESS__RATE_PER_MINUTE", "0")
    access = InstalledSettings().access
    assert access.allowed_users == ["12", "34", "56"]
    assert access.rate_per_minute == 0


async def test_the_model_is_told_it_cannot_see_attachments(bot: Start, fake: FakeOpenAI) -> None:
    runtime, _ = await bot()
    sticker = message("", n=1, attachments=(Attachment("sticker", "file-1"),))
    assert await runtime.ingest(sticker)
    assert await runtime.ingest(message("plain words", n=2))
    await settled(runtime, CONV)
    assert await runtime.ingest(message("no media now", n=3))
    await settled(runtime, CONV)
    with_media, without = fake.requests
    assert "cannot see" in with_media.messages[0]["content"]
    assert "[sticker]" in with_media.last_user_text
    assert "cannot see" not in without.messages[0]["content"]


async def test_retry_writes_the_last_reply_again_and_replaces_it_in_the_history(
    bot: Start, fake: FakeOpenAI
) -> None:
    answers = iter(["first answer", "second answer", "a better answer"])
    fake.reply = lambda request: next(answers)
    runtime, outbound = await bot()
    assert await runtime.ingest(message("/retry", n=1))  # nothing to write again yet
    await settled(runtime, CONV)
    assert outbound.texts() == [NOTHING_TO_RETRY]
    for n, text in [(2, "hello"), (3, "name a colour")]:
        assert await runtime.ingest(message(text, n=n))
        await settled(runtime, CONV)
    assert await runtime.ingest(message("/retry", n=4))
    await settled(runtime, CONV)

    assert outbound.texts()[1:] == ["first answer", "second answer", "a better answer"]
    retried = fake.requests[-1]
    # The same question, with the history as it was when it was first asked.
    assert retried.last_user_text == "name a colour"
    assert [m["content"] for m in retried.messages[1:-1]] == ["hello", "first answer"]
    history = await runtime.store.history(CONV)
    assert [(h.role, h.text) for h in history] == [
        ("assistant", NOTHING_TO_RETRY),
        ("user", "hello"),
        ("assistant", "first answer"),
        ("user", "name a colour"),
        ("assistant", "a better answer"),
    ]
    assert await runtime.store.counters(CONV) == (4, 4)


def test_changes_travel_in_the_outbox_by_kind() -> None:
    changes: tuple[Change, ...] = (
        admin.Change("42", "budget", "100", "7"),
        ModelPick("smart"),
        Persona("Be brief."),
        Persona(""),
        Asked(),
        Erase(),
    )
    assert decoded(encoded(changes)) == changes
    assert encoded(()) == "" and decoded("") == ()
