"""Live drafts on Telegram: `lastword run` (webhook, the OpenAI client streaming from the fake
provider, a real server). The reply is shown as it is written (sendMessageDraft), then sent
once; an interrupt starts the preview over; a failing draft changes nothing delivered. Every
draft shows the stop button, and pressing it is /stop, over the webhook and over polling.

A held drafter (a speculative generation's, while the user's window is open) is driven
directly, through the real Telegram adapter against the fake Bot API: nothing is shown before
the hold ends, and the first draft after it carries all the text so far."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from telegram import Update

from adapters.telegram import TelegramAdapter, TelegramSettings, normalize
from adapters.telegram_html import well_formed
from bot.commands import STOPPED
from bot.loop_lag import SHED_LAG_S, SHED_MIN_PREVIEWS, watch
from bot.outbound.drafts import Drafter, drafting
from bot.outbound.typing_indicator import Typing
from tests.support.drafts import ANSWER, FAST_DRAFTS, FIXED_WINDOW, draft_text, drafts
from tests.support.fakes.telegram_server import (
    STOP_PRESSED,
    FakeTelegram,
    ScriptedError,
)
from tests.support.running import Running, run_env
from tests.support.stalls import through_a_stall
from tests.support.waits import counters, eventually, settled
from tests.support.world import CHAT, CONVERSATION, World

pytestmark = pytest.mark.timeout(60)


async def test_a_streamed_reply_is_drafted_as_it_grows_then_sent_once(world: World) -> None:
    telegram, provider = world.telegram, world.provider
    provider.reply = lambda request: ANSWER
    provider.delay_s = 2.0  # the pieces spread over two seconds
    async with world.bot(**FAST_DRAFTS, **FIXED_WINDOW) as bot:
        await bot.post(telegram.private_text_update(CHAT, CHAT, "tell me something long"))
        await telegram.wait_for_sent(1, timeout=15)
        await settled(world.redis, CONVERSATION, within_s=10)
    shown = [draft_text(c) for c in drafts(telegram) if c.status == 200]
    assert shown[0] == ""  # "Thinking…" as soon as the generation starts
    growing = shown[1:]
    assert len(growing) >= 2
    # Each one the answer so far, never shorter than the one before (a draft whose answer was
    # lost in a slow moment is sent again), and growing.
    assert all(ANSWER.startswith(text) for text in growing)
    assert all(len(a) <= len(b) for a, b in itertools.pairwise(growing))
    assert len(growing[-1]) > len(growing[0])
    html = [draft_text(c) for c in drafts(telegram) if c.params.get("parse_mode") == "HTML"]
    assert html, "no draft was sent as HTML"
    assert all(well_formed(text) for text in html)
    [reply] = telegram.sent_messages
    assert reply.text == ANSWER
    assert all(c.at < reply.at for c in drafts(telegram))
    assert len({c.params["draft_id"] for c in drafts(telegram)}) == 1


async def test_a_message_mid_generation_starts_the_draft_over_and_one_reply_covers_all(
    world: World,
) -> None:
    telegram, provider = world.telegram, world.provider
    provider.reply = lambda request: ANSWER + " about " + request.last_user_text.split()[-1]
    provider.delay_s = 3.0
    async with world.bot(**FAST_DRAFTS, **FIXED_WINDOW) as bot:
        await bot.post(telegram.private_text_update(CHAT, CHAT, "first thought"))
        await provider.wait_for_request(lambda r: r.pieces_streamed >= 5, timeout=15)
        await bot.post(telegram.private_text_update(CHAT, CHAT, "second thought"))
        await telegram.wait_for_sent(1, timeout=20)
        await settled(world.redis, CONVERSATION, version=2, within_s=10)
    shown = [draft_text(c) for c in drafts(telegram) if c.status == 200]
    # Text, then the preview starts over ("" again) for the generation after the interrupt.
    restart = next(i for i, text in enumerate(shown) if i > 0 and text == "")
    assert any(shown[:restart]), "nothing was drafted before the interrupt"
    assert len({c.params["draft_id"] for c in drafts(telegram)}) == 1  # replaced, not added
    [reply] = telegram.sent_messages
    assert (reply.text or "").endswith("about thought") and len(provider.requests) == 2


@pytest.mark.parametrize(
    "failure",
    [ScriptedError(400, "Bad Request: method is not available"), FakeTelegram.too_many_requests(1)],
    ids=["400", "429"],
)
async def test_failing_drafts_change_nothing_delivered(
    world: World, failure: ScriptedError
) -> None:
    telegram, provider = world.telegram, world.provider
    provider.reply = lambda request: ANSWER
    provider.delay_s = 1.5
    telegram.fail_for("sendMessageDraft", 60, failure)
    async with world.bot(**FAST_DRAFTS) as bot:
        await bot.post(telegram.private_text_update(CHAT, CHAT, "go"))
        await telegram.wait_for_sent(1, timeout=15)
        await settled(world.redis, CONVERSATION, within_s=10)
        assert bot.running.process.returncode is None
    assert drafts(telegram) and all(c.status != 200 for c in drafts(telegram))
    assert [m.text for m in telegram.sent_messages] == [ANSWER]


Deliver = Callable[[dict[str, Any]], Awaitable[None]]


@contextlib.asynccontextmanager
async def running(world: World, mode: str, **extra: str) -> AsyncIterator[Deliver]:
    """A `lastword run` in `mode`, and how Telegram hands it an update: posted to its webhook,
    or queued for its getUpdates (which it has started calling)."""
    telegram = world.telegram
    if mode == "webhook":
        async with world.bot(**extra) as bot:
            yield bot.post
        return
    env = (
        run_env("telegram", world.server.url, world.data_dir / "poller")
        | {
            "LASTWORD_TELEGRAM__TOKEN": telegram.token,
            "LASTWORD_TELEGRAM__API_URL": telegram.api_url,
            "LASTWORD_TELEGRAM__MODE": "polling",
            "LASTWORD_LLM__PROVIDER": "openai",
            "LASTWORD_LLM__BASE_URL": world.provider.base_url,
            "LASTWORD_LLM__API_KEY": "sk-drafts-test",
            "LASTWORD_LLM__MODEL": "gpt-4o-mini",
        }
        | extra
    )

    async def push(update: dict[str, Any]) -> None:
        telegram.push_update(update)

    process = await Running.start(env)
    try:
        await telegram.wait_for_calls("getUpdates", 1, timeout=15)
        yield push
    finally:
        if process.process.returncode is None:
            await process.terminate()


@pytest.mark.parametrize("mode", ["webhook", "polling"])
async def test_pressing_stop_on_a_draft_cancels_the_generation_and_answers_stopped(
    world: World, mode: str
) -> None:
    telegram, provider = world.telegram, world.provider
    provider.reply = lambda request: ANSWER
    provider.delay_s = 10.0  # a long answer, streamed

    async def text_drafted() -> bool:
        return any(c.ok and draft_text(c) for c in drafts(telegram))

    async with running(world, mode, **FAST_DRAFTS) as deliver:
        await deliver(telegram.private_text_update(CHAT, CHAT, "write me a long essay"))
        request = await provider.wait_for_request(timeout=15)
        await eventually(text_drafted, within_s=10)
        # The user presses the button on the draft shown (the fake refuses a press on a draft
        # that had none), and Telegram sends the press: the bot asked for such updates.
        pressed = telegram.stop_pressed_update(CHAT)
        assert telegram.delivers(pressed)
        await deliver(pressed)
        await provider.wait_for_request(lambda r: r is request and r.cancelled, timeout=5)
        await telegram.wait_for_sent(1, timeout=15)
        await settled(world.redis, CONVERSATION, version=2, within_s=10)
        if mode == "webhook":
            # Telegram delivers the press again: the same message, dropped.
            await deliver(pressed)
            assert await counters(world.redis, CONVERSATION) == (2, 2)
    assert [m.text for m in telegram.sent_messages] == [STOPPED]
    assert provider.requests == [request]  # nothing generated again for what was stopped
    assert drafts(telegram) and all(c.params.get("can_stop") is True for c in drafts(telegram))


def test_a_stop_press_is_the_stop_its_user_could_have_typed() -> None:
    chat = {"id": CHAT, "type": "private", "first_name": "Ann", "last_name": "Lee"}
    update = Update.de_json({"update_id": 77, STOP_PRESSED: {"chat": chat, "draft_id": 3}}, None)
    message = normalize(update)
    assert message is not None
    assert (message.conversation, message.text, message.message_id) == (
        CONVERSATION,
        "/stop",
        "stop:77",
    )
    # The update names no user; a private chat's id is its user's, which the allow-list checks.
    assert (message.user_id, message.display_name) == (str(CHAT), "Ann Lee")
    group = {"id": -100, "type": "group", "title": "Team"}
    other = Update.de_json({"update_id": 78, STOP_PRESSED: {"chat": group, "draft_id": 3}}, None)
    assert normalize(other) is None


HELD_CONVERSATION = f"telegram:{CHAT}"
# Long enough that a drafter ignoring the hold would have drafted well before it ends.
HOLD_S = 0.8


@pytest.fixture
async def adapter() -> AsyncIterator[tuple[TelegramAdapter, FakeTelegram]]:
    """The real Telegram adapter, its bot open (getMe) against the fake Bot API."""
    async with FakeTelegram() as telegram:
        settings = TelegramSettings.model_validate(
            {"token": telegram.token, "api_url": telegram.api_url, "draft_interval_ms": 200}
        )
        own = TelegramAdapter(settings)
        async with own.bot:
            yield own, telegram


async def write(drafter: Drafter | None, pieces: list[str], every_s: float) -> str:
    """Stream `pieces` into the drafter as a generation would; the text it ends with."""
    assert drafter is not None
    text = ""
    for piece in pieces:
        text += piece
        drafter.update(text)
        await asyncio.sleep(every_s)
    return text


async def test_a_held_drafter_shows_nothing_until_the_hold_ends_then_all_the_text_so_far(
    adapter: tuple[TelegramAdapter, FakeTelegram],
) -> None:
    outbound, telegram = adapter
    hold_until = time.monotonic() + HOLD_S
    async with drafting(outbound, HELD_CONVERSATION, 7, hold_until) as drafter:
        written = await write(drafter, ["Hello", " there,", " friend"], HOLD_S / 4)
        first = (await telegram.wait_for_calls("sendMessageDraft", 1, timeout=5))[0]
        assert drafter is not None
        drafter.update(written + " and more")
        await telegram.wait_for_calls("sendMessageDraft", 2, timeout=5)
    shown = drafts(telegram)
    assert first.at >= hold_until
    # No "Thinking…" first: the text was there when the hold ended.
    assert draft_text(first) == written
    assert draft_text(shown[1]) == written + " and more"
    # Measured from the end of the hold, not from the start.
    assert drafter.first_after_s is not None and drafter.first_after_s < HOLD_S / 2


async def test_a_held_drafter_with_no_text_yet_shows_thinking_when_the_hold_ends(
    adapter: tuple[TelegramAdapter, FakeTelegram],
) -> None:
    outbound, telegram = adapter
    hold_until = time.monotonic() + HOLD_S / 2
    async with drafting(outbound, HELD_CONVERSATION, 7, hold_until):
        [first] = await telegram.wait_for_calls("sendMessageDraft", 1, timeout=5)
    assert first.at >= hold_until and draft_text(first) == ""


async def test_a_generation_that_ends_within_its_hold_is_never_drafted(
    adapter: tuple[TelegramAdapter, FakeTelegram],
) -> None:
    outbound, telegram = adapter
    async with drafting(outbound, HELD_CONVERSATION, 7, time.monotonic() + 60) as drafter:
        await write(drafter, ["all", " of", " it"], HOLD_S / 3)
    # A draft sent during the block would have been received long before this one.
    await outbound.draft("telegram:99", 1, "marker")
    assert [c.chat_id for c in drafts(telegram)] == [99]
    assert drafter is not None and drafter.sent == 0


async def test_no_typing_indicator_is_sent_while_a_draft_shows_the_bot_at_work(
    adapter: tuple[TelegramAdapter, FakeTelegram],
) -> None:
    outbound, telegram = adapter
    outbound.typing_interval_s = 0.05
    typing = Typing(outbound)
    typing.show(HELD_CONVERSATION)
    try:
        await telegram.wait_for_calls("sendChatAction", 2, timeout=5)
        async with drafting(outbound, HELD_CONVERSATION, 7) as drafter:
            assert drafter is not None
            await eventually(_shown(drafter), within_s=5)
            typed = len(telegram.calls_to("sendChatAction"))
            drafter.update("the answer so far")
            # Two more drafts, at least 0.2 s apart: room for several typing intervals.
            await telegram.wait_for_calls("sendMessageDraft", 2, timeout=5)
            drafter.update("the answer so far, and more")
            await telegram.wait_for_calls("sendMessageDraft", 3, timeout=5)
            # One call may have been on its way as the draft was shown.
            assert len(telegram.calls_to("sendChatAction")) <= typed + 1
        # The draft is gone: the indicator is the only sign of work again.
        await telegram.wait_for_calls("sendChatAction", typed + 3, timeout=5)
    finally:
        typing.stop()


def _shown(drafter: Drafter) -> Callable[[], Awaitable[bool]]:
    async def shown() -> bool:
        return drafter.sent > 0

    return shown


class LagRecordingDrafts:
    """A platform's drafts that note, with each call, how late the loop counted as running."""

    draft_interval_s: float | None = 0.05

    def __init__(self) -> None:
        self.lags_at_calls: list[float] = []

    async def draft(self, conversation: str, draft_id: int, text: str) -> None:
        self.lags_at_calls.append(watch().recent_s)


async def drafting_through_a_stall(conversations: int) -> LagRecordingDrafts:
    """`conversations` generations drafted at once, their text growing, the loop stalled for
    0.3 s, until drafts have gone on for a while after the stall has decayed from the lag."""
    platform = LagRecordingDrafts()
    drafters = [Drafter(platform, f"test:{n}", 1) for n in range(conversations)]

    async def write() -> None:
        for words in itertools.count():
            for drafter in drafters:
                drafter.update(f"word{words} " * words)
            await asyncio.sleep(0.01)

    for drafter in drafters:
        drafter.start()
    writer = asyncio.create_task(write())
    try:
        await through_a_stall(lambda: len(platform.lags_at_calls), conversations, "a draft")
    finally:
        writer.cancel()
        for drafter in drafters:
            await drafter.stop()
    return platform


async def test_drafts_are_shed_while_the_loop_lags_with_many_in_flight() -> None:
    platform = await drafting_through_a_stall(SHED_MIN_PREVIEWS)
    # Checked and sent in one step: no draft went out while the loop counted as lagging.
    assert max(platform.lags_at_calls) <= SHED_LAG_S


async def test_a_few_drafts_go_on_through_a_stall() -> None:
    # A few previews cannot be what lags the loop (on a loaded machine it is the machine).
    platform = await drafting_through_a_stall(2)
    assert max(platform.lags_at_calls) > SHED_LAG_S
