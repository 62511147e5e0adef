"""Live drafts on Telegram: `lastword run` (webhook, the OpenAI client streaming from the fake
provider, a real server). The reply is shown as it is written (sendMessageDraft), then sent
once; an interrupt starts the preview over; a failing draft changes nothing delivered."""

from __future__ import annotations

import itertools

import pytest

from adapters.telegram_html import well_formed
from tests.conftest import settled
from tests.fakes.telegram_server import FakeTelegram, RecordedCall, ScriptedError
from tests.test_media_e2e import CHAT, CONVERSATION, World, world

__all__ = ["world"]  # the fixture, imported for pytest

pytestmark = pytest.mark.timeout(60)

FAST_DRAFTS = {"LASTWORD_TELEGRAM__DRAFT_INTERVAL_MS": "200"}
ANSWER = " ".join(f"word{i}" for i in range(60))


def drafts(telegram: FakeTelegram) -> list[RecordedCall]:
    return telegram.calls_to("sendMessageDraft")


def draft_text(call: RecordedCall) -> str:
    return str(call.params.get("text") or "")


async def test_a_streamed_reply_is_drafted_as_it_grows_then_sent_once(world: World) -> None:
    telegram, provider = world.telegram, world.provider
    provider.reply = lambda request: ANSWER
    provider.delay_s = 2.0  # the pieces spread over two seconds
    async with world.bot(**FAST_DRAFTS) as bot:
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
    for call in drafts(telegram):
        if call.params.get("parse_mode") == "HTML":
            assert well_formed(draft_text(call))
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
    async with world.bot(**FAST_DRAFTS) as bot:
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
