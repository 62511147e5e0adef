"""The fake Telegram Bot API must look, to the real ``python-telegram-bot`` client, like the
real API in every way the Telegram adapter relies on; these tests pin that down."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from telegram import Bot, BotCommand, BotCommandScopeChat, Message, ReplyParameters, Update
from telegram.constants import ChatAction, ParseMode
from telegram.error import BadRequest, Conflict, Forbidden, InvalidToken, NetworkError, RetryAfter
from telegram.request import HTTPXRequest

from bot.tls import client_context
from tests.support.fakes.telegram_server import (
    MAX_DOWNLOAD_SIZE,
    STOP_PRESSED,
    FakeTelegram,
    post_update,
)


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram() as server:
        yield server


def make_bot(fake: FakeTelegram, token: str | None = None) -> Bot:
    # PTB appends the token to base_url, then "/{method}"; to base_file_url, "/{file_path}".
    # Its requests share the process's TLS context, as the adapter's do (each would load the
    # certificate store again).
    return Bot(
        token or fake.token,
        base_url=f"{fake.api_url}/bot",
        base_file_url=f"{fake.api_url}/file/bot",
        request=HTTPXRequest(httpx_kwargs={"verify": client_context()}),
        get_updates_request=HTTPXRequest(httpx_kwargs={"verify": client_context()}),
    )


def message_of(update: Update) -> Message:
    assert update.message is not None
    return update.message


@pytest.fixture
async def bot(fake: FakeTelegram) -> AsyncIterator[Bot]:
    async with make_bot(fake) as b:
        yield b


async def test_get_me(fake: FakeTelegram, bot: Bot) -> None:
    me = await bot.get_me()

    assert me.is_bot
    assert me.id == 123456789
    assert me.username == "fake_bot"
    assert bot.username == "fake_bot"  # initialize() already called getMe
    assert [c.method for c in fake.calls] == ["getMe", "getMe"]
    assert all(c.ok for c in fake.calls)


async def test_wrong_token_is_unauthorized(fake: FakeTelegram) -> None:
    with pytest.raises(InvalidToken):
        async with make_bot(fake, token="42:wrong"):
            pass
    assert fake.calls == []


async def test_unknown_method_is_not_found(fake: FakeTelegram) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{fake.api_url}/bot{fake.token}/launchRocket") as response,
    ):
        assert response.status == 404
        assert await response.json() == {
            "ok": False,
            "error_code": 404,
            "description": "Not Found",
        }


async def test_send_message_records_and_returns_message(fake: FakeTelegram, bot: Bot) -> None:
    first = await bot.send_message(7, "<b>hi</b> there", parse_mode=ParseMode.HTML)
    second = await bot.send_message(7, "plain", reply_to_message_id=first.message_id)
    other_chat = await bot.send_message(8, "elsewhere")

    assert isinstance(first, Message)
    assert first.text == "<b>hi</b> there"
    assert first.chat.id == 7 and first.chat.type == "private"
    assert first.from_user is not None and first.from_user.is_bot
    assert first.date is not None
    assert (first.message_id, second.message_id, other_chat.message_id) == (1, 2, 1)
    assert second.reply_to_message is not None
    assert second.reply_to_message.message_id == 1

    sent = await fake.wait_for_sent(3)
    assert [(c.chat_id, c.text) for c in sent] == [
        (7, "<b>hi</b> there"),
        (7, "plain"),
        (8, "elsewhere"),
    ]
    assert sent[0].params["parse_mode"] == "HTML"
    assert "parse_mode" not in sent[1].params
    assert sent[1].params["reply_parameters"]["message_id"] == 1
    assert sent[0].at <= sent[1].at <= sent[2].at


async def test_message_length_limit_counts_visible_text(fake: FakeTelegram, bot: Bot) -> None:
    # Tags do not count towards the 4096 limit; the visible text does.
    await bot.send_message(1, "<b>" + "x" * 4096 + "</b>", parse_mode=ParseMode.HTML)
    with pytest.raises(BadRequest, match="too long"):
        await bot.send_message(1, "x" * 4097)
    assert len(fake.sent_messages) == 1
    assert fake.calls[-1].status == 400


async def test_chat_action_edit_and_delete(fake: FakeTelegram, bot: Bot) -> None:
    assert await bot.send_chat_action(7, ChatAction.TYPING)
    message = await bot.send_message(7, "draft")
    edited = await bot.edit_message_text("final", chat_id=7, message_id=message.message_id)
    assert isinstance(edited, Message)
    assert edited.text == "final" and edited.edit_date is not None
    with pytest.raises(BadRequest, match="not modified"):
        await bot.edit_message_text("final", chat_id=7, message_id=message.message_id)
    assert await bot.delete_message(7, message.message_id)
    with pytest.raises(BadRequest, match=r"(?i)message to delete not found"):
        await bot.delete_message(7, message.message_id)

    [action] = fake.calls_to("sendChatAction")
    assert action.params == {"chat_id": 7, "action": "typing"}
    assert [c.text for c in fake.calls_to("editMessageText")] == ["final", "final"]


async def test_get_updates_returns_pushed_and_offset_confirms(fake: FakeTelegram, bot: Bot) -> None:
    first = fake.push_update(fake.private_text_update(chat_id=7, user_id=7, text="hi"))
    second = fake.push_update(fake.photo_update(chat_id=7, user_id=7, caption="look"))

    updates = await bot.get_updates(timeout=0)
    assert [u.update_id for u in updates] == [first, second]
    assert updates[0].message is not None and updates[0].message.text == "hi"
    assert updates[1].message is not None and updates[1].message.caption == "look"
    assert updates[1].effective_chat is not None and updates[1].effective_chat.type == "private"

    # Without an offset nothing is confirmed: the same batch comes back.
    again = await bot.get_updates(timeout=0)
    assert [u.update_id for u in again] == [first, second]

    after_first = await bot.get_updates(offset=first + 1, timeout=0)
    assert [u.update_id for u in after_first] == [second]
    await fake.wait_for_confirmed(first, timeout=1)

    assert await bot.get_updates(offset=second + 1, timeout=0) == ()
    assert fake.pending_updates == []
    assert fake.calls_to("getUpdates")[-1].params["offset"] == second + 1


async def test_long_poll_wakes_on_push(fake: FakeTelegram, bot: Bot) -> None:
    poll = asyncio.create_task(bot.get_updates(timeout=5))
    await fake.wait_for_calls("getUpdates", 1, timeout=2)
    assert fake.get_updates_in_flight == 1
    update_id = fake.push_update(fake.private_text_update(chat_id=3, user_id=3, text="late"))

    updates = await asyncio.wait_for(poll, timeout=2)
    assert [u.update_id for u in updates] == [update_id]
    assert fake.get_updates_in_flight == 0


async def test_long_poll_times_out_empty(fake: FakeTelegram, bot: Bot) -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await bot.get_updates(timeout=1) == ()
    assert 0.9 <= loop.time() - started < 2.0


async def test_concurrent_get_updates_conflict(fake: FakeTelegram) -> None:
    async with make_bot(fake) as first, make_bot(fake) as second:
        older = asyncio.create_task(first.get_updates(timeout=5))
        await fake.wait_for_calls("getUpdates", 1, timeout=2)

        # Like Telegram, the newer request wins and the one already waiting is terminated.
        assert await second.get_updates(timeout=0) == ()
        with pytest.raises(Conflict, match="terminated by other getUpdates"):
            await asyncio.wait_for(older, timeout=2)

    assert fake.max_concurrent_get_updates == 2
    assert fake.get_updates_in_flight == 0
    assert [c.status for c in fake.calls_to("getUpdates")] == [409, 200]


async def test_sequential_polls_never_overlap(fake: FakeTelegram, bot: Bot) -> None:
    for _ in range(3):
        await bot.get_updates(timeout=0)
    assert fake.max_concurrent_get_updates == 1


async def test_scripted_429_is_retry_after(
    fake: FakeTelegram, bot: Bot, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Opt in to PTB 23's timedelta retry_after now (read at access time; avoids a deprecation).
    monkeypatch.setenv("PTB_TIMEDELTA", "1")
    fake.fail_next("sendMessage", fake.too_many_requests(3))

    with pytest.raises(RetryAfter) as caught:
        await bot.send_message(7, "first try")
    retry_after = caught.value.retry_after
    assert isinstance(retry_after, timedelta) and retry_after.total_seconds() == 3

    await bot.send_message(7, "second try")
    first, second = fake.calls_to("sendMessage")
    assert (first.status, first.text) == (429, "first try")
    assert (second.status, second.text) == (200, "second try")
    assert first.description == "Too Many Requests: retry after 3"
    assert [c.text for c in fake.sent_messages] == ["second try"]


async def test_scripted_bad_request_forbidden_and_server_error(
    fake: FakeTelegram, bot: Bot
) -> None:
    fake.fail_next(
        "sendmessage",  # method names are case-insensitive, as in Telegram
        fake.cant_parse_entities(),
        fake.forbidden_blocked(),
        fake.server_error(502),
    )

    with pytest.raises(BadRequest, match=r"(?i)can't parse entities"):
        await bot.send_message(7, "<span>x", parse_mode=ParseMode.HTML)
    with pytest.raises(Forbidden, match="bot was blocked by the user"):
        await bot.send_message(7, "x")
    with pytest.raises(NetworkError):
        await bot.send_message(7, "x")
    await bot.send_message(7, "<span>x")

    assert [c.status for c in fake.calls_to("sendMessage")] == [400, 403, 502, 200]
    assert len(fake.sent_messages) == 1


async def test_failure_phases_follow_each_other_from_the_first_call(
    fake: FakeTelegram, bot: Bot, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PTB_TIMEDELTA", "1")  # as in test_scripted_429_is_retry_after
    fake.fail_for("getUpdates", 0.3, fake.too_many_requests(1))
    fake.fail_for("getupdates", 0.3, fake.server_error(502))
    # The first phase's clock starts at the first call, not when it was scripted.
    await asyncio.sleep(0.4)
    with pytest.raises(RetryAfter):
        await bot.get_updates(timeout=0)
    with pytest.raises(RetryAfter):
        await bot.get_updates(timeout=0)
    await asyncio.sleep(0.35)  # the first phase runs out
    with pytest.raises(NetworkError, match="Bad Gateway"):
        await bot.get_updates(timeout=0)
    await asyncio.sleep(0.35)  # so does the second
    assert await bot.get_updates(timeout=0) == ()
    assert [c.status for c in fake.calls_to("getUpdates")] == [429, 429, 502, 200]


async def test_a_failing_chat_fails_every_call_about_it_until_lifted(
    fake: FakeTelegram, bot: Bot
) -> None:
    fake.fail_chat(7, fake.forbidden_blocked())
    with pytest.raises(Forbidden, match="bot was blocked by the user"):
        await bot.send_message(7, "hello")
    with pytest.raises(Forbidden):
        await bot.send_chat_action(7, ChatAction.TYPING)
    await bot.send_message(8, "another chat is fine")
    fake.fail_chat(7, fake.chat_not_found())
    with pytest.raises(BadRequest, match=r"(?i)chat not found"):
        await bot.send_message(7, "hello")
    fake.fail_chat(7, None)
    await bot.send_message(7, "hello again")
    assert [(c.chat_id, c.status) for c in fake.calls_to("sendMessage")] == [
        (7, 403),
        (8, 200),
        (7, 400),
        (7, 200),
    ]


async def test_set_webhook_records_and_blocks_polling(fake: FakeTelegram, bot: Bot) -> None:
    assert await bot.set_webhook(
        "https://bot.example/tg",
        secret_token="s3cret",
        allowed_updates=["message", "edited_message"],
        max_connections=5,
    )
    assert fake.webhook is not None
    assert fake.webhook.url == "https://bot.example/tg"
    assert fake.webhook.secret_token == "s3cret"
    assert fake.webhook.allowed_updates == ["message", "edited_message"]
    assert fake.webhook.max_connections == 5

    info = await bot.get_webhook_info()
    assert info.url == "https://bot.example/tg"
    assert info.allowed_updates == ("message", "edited_message")

    with pytest.raises(Conflict, match="webhook is active"):
        await bot.get_updates(timeout=0)

    fake.push_update(fake.private_text_update(chat_id=1, user_id=1, text="queued"))
    assert await bot.delete_webhook(drop_pending_updates=True)
    assert fake.webhook is None
    assert fake.pending_updates == []
    assert (await bot.get_webhook_info()).url == ""


async def test_builders_parse_as_updates(fake: FakeTelegram, bot: Bot) -> None:
    built: list[dict[str, Any]] = [
        fake.private_text_update(chat_id=5, user_id=5, text="hello"),
        fake.edited_update(chat_id=5, user_id=5, text="hello!", message_id=1),
        fake.group_text_update(chat_id=-100, user_id=5, text="in group"),
        fake.sticker_update(chat_id=5, user_id=5),
        fake.photo_update(chat_id=5, user_id=5),
        fake.voice_update(chat_id=5, user_id=5),
        fake.document_update(chat_id=5, user_id=5, caption="doc"),
    ]
    updates = [Update.de_json(json.loads(json.dumps(u)), bot) for u in built]

    ids = [u.update_id for u in updates]
    assert ids == sorted(set(ids))
    text, edited, group, sticker, photo, voice, document = updates
    assert text.message is not None and text.message.text == "hello"
    assert text.message.from_user is not None and text.message.from_user.first_name == "Ann"
    assert edited.edited_message is not None and edited.edited_message.message_id == 1
    assert edited.edited_message.text == "hello!"
    assert group.message is not None and group.message.chat.type == "group"
    assert sticker.message is not None and sticker.message.sticker is not None
    assert photo.message is not None and photo.message.photo and photo.message.caption is None
    assert voice.message is not None and voice.message.voice is not None
    assert document.message is not None and document.message.caption == "doc"
    # Message ids grow per chat, past explicitly given ones.
    assert [u.message.message_id for u in (sticker, photo, voice) if u.message] == [2, 3, 4]


async def test_post_update_delivers_to_webhook(fake: FakeTelegram, bot: Bot) -> None:
    received: list[tuple[str | None, dict[str, Any]]] = []

    async def handle(request: web.Request) -> web.Response:
        received.append(
            (request.headers.get("X-Telegram-Bot-Api-Secret-Token"), await request.json())
        )
        return web.Response(status=200 if received[-1][0] == "s3cret" else 403)

    app = web.Application()
    app.router.add_post("/hook", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        url = f"http://127.0.0.1:{runner.addresses[0][1]}/hook"
        update = fake.private_text_update(chat_id=9, user_id=9, text="via webhook")

        assert await post_update(url, update, "s3cret") == 200
        assert await post_update(url, update, None) == 403

        await bot.set_webhook(url, secret_token="s3cret")
        assert await fake.deliver(update) == 200
    finally:
        await runner.cleanup()

    assert [secret for secret, _ in received] == ["s3cret", None, "s3cret"]
    assert all(body == update for _, body in received)
    parsed = Update.de_json(received[0][1], bot)
    assert parsed.message is not None and parsed.message.text == "via webhook"


async def test_a_draft_records_its_stop_button_and_only_such_a_draft_can_be_stopped(
    fake: FakeTelegram, bot: Bot
) -> None:
    # python-telegram-bot 22.8 has no argument for can_stop (Bot API 10.3): api_kwargs.
    assert await bot.send_message_draft(5, 7, "so far", api_kwargs={"can_stop": True})
    assert await bot.send_message_draft(6, 8, "no button")
    assert await bot.send_message_draft(5, 9, "", api_kwargs={"can_stop": True})
    first, plain, second = fake.calls_to("sendMessageDraft")
    assert first.params["can_stop"] is True and second.params["can_stop"] is True
    assert "can_stop" not in plain.params

    pressed = fake.stop_pressed_update(5, draft_id=7)
    assert pressed[STOP_PRESSED] == {
        "chat": {"id": 5, "type": "private", "first_name": "Ann"},
        "draft_id": 7,
    }
    assert fake.stop_pressed_update(5)[STOP_PRESSED]["draft_id"] == 9  # the last one shown
    with pytest.raises(AssertionError, match="no stop button"):
        fake.stop_pressed_update(6)
    with pytest.raises(AssertionError, match="no draft"):
        fake.stop_pressed_update(5, draft_id=99)

    # The library does not know the update: it keeps the raw object in api_kwargs.
    update = Update.de_json(json.loads(json.dumps(pressed)), bot)
    assert update.message is None and update.effective_chat is None
    assert update.api_kwargs[STOP_PRESSED]["draft_id"] == 7


async def test_updates_come_only_of_the_kinds_the_bot_asked_for(
    fake: FakeTelegram, bot: Bot
) -> None:
    await bot.send_message_draft(5, 7, "so far", api_kwargs={"can_stop": True})
    # allowed_updates never given: every kind but chat_member and the reaction counts.
    first = fake.push_update(fake.stop_pressed_update(5))
    [update] = await bot.get_updates(timeout=0, allowed_updates=["message"])
    assert update.update_id == first and STOP_PRESSED in update.api_kwargs
    # That getUpdates asked for messages only, from then on: a press is not even queued.
    assert not fake.delivers(fake.stop_pressed_update(5))
    fake.push_update(fake.stop_pressed_update(5))
    text = fake.push_update(fake.private_text_update(chat_id=5, user_id=5, text="hi"))
    assert [u.update_id for u in await bot.get_updates(offset=first + 1, timeout=0)] == [text]
    # A later list replaces it.
    await bot.get_updates(offset=text + 1, timeout=0, allowed_updates=["message", STOP_PRESSED])
    pressed = fake.push_update(fake.stop_pressed_update(5))
    [update] = await bot.get_updates(offset=text + 1, timeout=0)
    assert update.update_id == pressed

    # A webhook's own list decides what deliver() may send.
    await bot.set_webhook("https://bot.example/tg", allowed_updates=["message"])
    with pytest.raises(ValueError, match=STOP_PRESSED):
        await fake.deliver(fake.stop_pressed_update(5))
    await bot.set_webhook("https://bot.example/tg", allowed_updates=["message", STOP_PRESSED])
    assert fake.delivers(fake.stop_pressed_update(5))


async def test_get_file_then_download_through_ptb(fake: FakeTelegram, bot: Bot) -> None:
    data = b"\xff\xd8 a cat"
    # A path with a space and a non-ASCII letter: PTB percent-encodes it, the fake decodes it.
    file_id = fake.add_file(data, file_unique_id="cat-1", file_path="photos/my cat \u00e9.jpg")

    file = await bot.get_file(file_id)
    assert (file.file_id, file.file_unique_id, file.file_size) == (file_id, "cat-1", len(data))
    assert file.file_path == f"{fake.api_url}/file/bot{fake.token}/photos/my cat \u00e9.jpg"
    assert await file.download_as_bytearray() == bytearray(data)

    [call] = fake.get_file_calls
    assert (call.file_id, call.status, call.path) == (file_id, 200, f"/bot{fake.token}/getFile")
    [download] = await fake.wait_for_downloads(1, timeout=1)
    assert download.ok and download.file_id == file_id
    assert download.file_path == "photos/my cat \u00e9.jpg"
    assert download.path == f"/file/bot{fake.token}/photos/my cat \u00e9.jpg"


async def test_get_file_wire_format_over_get_and_json(fake: FakeTelegram) -> None:
    file_id = fake.add_file(b"abc")
    expected = {
        "ok": True,
        "result": {
            "file_id": file_id,
            "file_unique_id": "unique-1",
            "file_size": 3,
            "file_path": "documents/file_1",
        },
    }
    url = f"{fake.api_url}/bot{fake.token}/getFile"
    async with aiohttp.ClientSession() as session:
        async with session.get(url, params={"file_id": file_id}) as response:
            assert (response.status, await response.json()) == (200, expected)
        async with session.post(url, json={"file_id": file_id}) as response:
            assert (response.status, await response.json()) == (200, expected)
    assert [c.file_id for c in fake.get_file_calls] == [file_id, file_id]


async def test_get_file_refuses_unknown_ids_and_files_over_20_mb(
    fake: FakeTelegram, bot: Bot
) -> None:
    at_limit = fake.add_file(b"x", declared_size=MAX_DOWNLOAD_SIZE)
    # The declared size is what the message shows too, so a bot can refuse before getFile.
    huge = fake.add_file(b"x", declared_size=MAX_DOWNLOAD_SIZE + 1)
    update = fake.document_update(7, 7, file_name="huge.zip", file_id=huge)
    document = message_of(Update.de_json(update, bot)).document
    assert document is not None and document.file_size == MAX_DOWNLOAD_SIZE + 1

    assert (await bot.get_file(at_limit)).file_size == MAX_DOWNLOAD_SIZE
    # PTB strips "Bad Request: " and capitalizes what is left.
    with pytest.raises(BadRequest, match=r"(?i)^file is too big$"):
        await bot.get_file(document)
    with pytest.raises(BadRequest, match=r"(?i)^wrong file identifier/http url specified$"):
        await bot.get_file("never-registered")

    assert [(c.status, c.description) for c in fake.get_file_calls] == [
        (200, None),
        (400, "Bad Request: file is too big"),
        (400, "Bad Request: wrong file identifier/HTTP URL specified"),
    ]
    assert fake.downloads == []


async def test_unreachable_file_resolves_but_does_not_download(
    fake: FakeTelegram, bot: Bot
) -> None:
    file_id = fake.add_file(b"lost")
    fake.make_unreachable(file_id)

    file = await bot.get_file(file_id)
    # PTB reads every 404 as a bad token, downloads included.
    with pytest.raises(InvalidToken, match="Not Found"):
        await file.download_as_bytearray()
    [download] = fake.downloads
    assert (download.file_id, download.status, download.ok) == (file_id, 404, False)


async def test_wrong_token_fails_get_file_and_download(fake: FakeTelegram) -> None:
    file_id = fake.add_file(b"secret", file_path="documents/a.txt")
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"{fake.api_url}/bot42:wrong/getFile", json={"file_id": file_id}
        ) as response:
            assert response.status == 401
        async with session.get(f"{fake.api_url}/file/bot42:wrong/documents/a.txt") as response:
            assert response.status == 404
            assert (await response.json())["description"] == "Not Found"
        async with session.get(f"{fake.api_url}/file/bot{fake.token}/nothing/here") as response:
            assert response.status == 404
        async with session.get(f"{fake.api_url}/file/bot{fake.token}/documents/a.txt") as response:
            assert (response.status, await response.read()) == (200, b"secret")

    assert fake.get_file_calls == []  # a wrong token never reaches a method
    assert [(d.path, d.file_id, d.status) for d in fake.downloads] == [
        ("/file/bot42:wrong/documents/a.txt", file_id, 404),
        (f"/file/bot{fake.token}/nothing/here", None, 404),
        (f"/file/bot{fake.token}/documents/a.txt", file_id, 200),
    ]


async def test_media_messages_parse_and_their_files_download(
    fake: FakeTelegram, bot: Bot, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PTB_TIMEDELTA", "1")  # durations as timedelta, without a warning
    photo = fake.add_file(b"large photo", declared_size=250_000)
    small, large = fake.add_file(b"small"), fake.add_file(b"large")
    first_of_album, second_of_album = fake.add_file(b"one"), fake.add_file(b"two")
    pdf = fake.add_file(b"%PDF-1.7", file_path="documents/report.pdf")
    voice = fake.add_file(b"OggS voice")
    song = fake.add_file(b"ID3 song")
    sticker = fake.add_file(b"RIFF webp")
    for update in (
        fake.photo_update(7, 7, "my cat", photo=photo),
        fake.photo_update(7, 7, photo=[small, large], width=800, height=600),
        *fake.album_updates(7, 7, [first_of_album, second_of_album], caption="trip"),
        fake.document_update(7, 7, "report.pdf", "read this", file_id=pdf),
        fake.voice_update(7, 7, duration=4, file_id=voice),
        fake.audio_update(7, 7, file_id=song, title="Tune", performer="Band"),
        fake.sticker_update(7, 7, "\N{SLIGHTLY SMILING FACE}", file_id=sticker),
    ):
        fake.push_update(update)

    messages = [message_of(u) for u in await bot.get_updates(timeout=0)]
    one_photo, two_sizes, album_first, album_second, document, voiced, audio, stuck = messages

    # One file id: the fake adds a smaller, registered size below it.
    assert [(p.width, p.height) for p in one_photo.photo] == [(640, 480), (1280, 960)]
    assert one_photo.photo[-1].file_id == photo and one_photo.photo[-1].file_size == 250_000
    assert one_photo.caption == "my cat" and one_photo.media_group_id is None
    assert [p.file_id for p in two_sizes.photo] == [small, large]
    assert [(p.width, p.height) for p in two_sizes.photo] == [(400, 300), (800, 600)]

    assert album_first.media_group_id is not None
    assert album_first.media_group_id == album_second.media_group_id
    assert (album_first.caption, album_second.caption) == ("trip", None)
    assert album_second.message_id == album_first.message_id + 1

    assert document.document is not None and document.caption == "read this"
    assert (document.document.file_name, document.document.mime_type) == (
        "report.pdf",
        "application/pdf",
    )
    assert document.document.file_size == len(b"%PDF-1.7")
    assert voiced.voice is not None and voiced.voice.mime_type == "audio/ogg"
    assert voiced.voice.duration == timedelta(seconds=4)
    assert audio.audio is not None and (audio.audio.title, audio.audio.performer) == (
        "Tune",
        "Band",
    )
    assert (audio.audio.file_name, audio.audio.mime_type) == ("song.mp3", "audio/mpeg")
    assert stuck.sticker is not None and stuck.sticker.emoji == "\N{SLIGHTLY SMILING FACE}"
    assert (stuck.sticker.type, stuck.sticker.is_animated) == ("regular", False)

    media = (
        one_photo.photo[0],
        one_photo.photo[-1],
        two_sizes.photo[-1],
        album_second.photo[-1],
        document.document,
        voiced.voice,
        audio.audio,
        stuck.sticker,
    )
    downloaded = [await (await m.get_file()).download_as_bytearray() for m in media]
    assert downloaded == [
        b"thumbnail of " + photo.encode(),
        b"large photo",
        b"large",
        b"two",
        b"%PDF-1.7",
        b"OggS voice",
        b"ID3 song",
        b"RIFF webp",
    ]
    assert [c.file_id for c in fake.get_file_calls] == [m.file_id for m in media]
    assert [d.file_id for d in fake.downloads] == [m.file_id for m in media]


async def test_command_menus_are_kept_per_scope_and_checked(fake: FakeTelegram, bot: Bot) -> None:
    await bot.set_my_commands([BotCommand("help", "this list")])
    await bot.set_my_commands(
        [BotCommand("help", "this list"), BotCommand("allow", "<user id>: let a user in")],
        scope=BotCommandScopeChat(77),
    )
    assert fake.menu() == [{"command": "help", "description": "this list"}]
    assert [c["command"] for c in fake.menu(77) or []] == ["help", "allow"]
    assert fake.menu(78) is None
    assert [c.command for c in await bot.get_my_commands(scope=BotCommandScopeChat(77))] == [
        "help",
        "allow",
    ]
    # Telegram's rules: lowercase names of at most 32 characters, 1-256 of description.
    for refused in (BotCommand("Help", "x"), BotCommand("help", "x" * 257)):
        with pytest.raises(BadRequest):
            await bot.set_my_commands([refused])
    assert fake.menu() == [{"command": "help", "description": "this list"}]


async def test_a_hung_method_answers_once_let_go(fake: FakeTelegram, bot: Bot) -> None:
    fake.hang("setMyCommands")
    call = asyncio.create_task(bot.set_my_commands([BotCommand("help", "this list")]))
    await fake.wait_for_calls("setMyCommands", 1)
    assert not call.done() and fake.menu() is None
    fake.hang("setMyCommands", False)
    assert await asyncio.wait_for(call, 5) is True
    assert fake.menu() is not None


# -- groups ------------------------------------------------------------------------------------

GROUP = -1001234567890


async def test_a_group_message_carries_mentions_and_commands_in_utf16(
    fake: FakeTelegram, bot: Bot
) -> None:
    # The emoji is one code point but two UTF-16 code units: offsets after it count it twice.
    text = "/ask@fake_bot \N{GRINNING FACE} hey @fake_bot, write to me@mail.org /help"
    fake.push_update(fake.group_text_update(GROUP, 5, text, supergroup=True, username="ann"))
    [update] = await bot.get_updates(timeout=0)
    message = message_of(update)

    assert [(e.type, e.offset, e.length) for e in message.entities] == [
        ("bot_command", 0, 13),
        ("mention", 21, 9),  # Python's index is 20
        ("bot_command", 53, 5),
    ]
    # PTB slices the text by UTF-16 offsets: the entities cover exactly what they name.
    assert list(message.parse_entities().values()) == ["/ask@fake_bot", "@fake_bot", "/help"]
    assert (message.chat.type, message.chat.title) == ("supergroup", "Test group")
    assert message.from_user is not None and message.from_user.username == "ann"
    assert not message.from_user.is_bot
    assert message.reply_to_message is None and message.message_thread_id is None


async def test_group_builders_keep_the_old_call_and_make_basic_groups_and_bots(
    fake: FakeTelegram, bot: Bot
) -> None:
    plain = message_of(Update.de_json(fake.group_text_update(-100, 5, "hello all"), bot))
    assert (plain.chat.type, plain.chat.title, plain.text) == ("group", "Test group", "hello all")
    assert plain.entities == () and plain.from_user is not None
    assert plain.from_user.username is None and not plain.from_user.is_bot
    # Too short a name, a mention inside a word, a command inside a path: no entities.
    nothing = fake.group_text_update(-100, 5, "@a x@fake_bot usr/bin /", title="Team")
    assert "entities" not in nothing["message"]

    other = fake.group_text_update(-100, 77, "/help@fake_bot", first_name="Other", is_bot=True)
    sender = message_of(Update.de_json(other, bot)).from_user
    assert sender is not None and sender.is_bot and sender.username == "otherbot"
    assert [m["message_id"] for m in fake.messages_in(-100)] == [1, 2, 3]
    assert fake.messages_in(-100)[-1]["chat"]["title"] == "Test group"


async def test_a_reply_to_the_bot_shows_the_bot_as_the_replied_sender(
    fake: FakeTelegram, bot: Bot
) -> None:
    asked = message_of(Update.de_json(fake.group_text_update(-100, 5, "hi", title="Team"), bot))
    sent = await bot.send_message(-100, "hello, Team")
    # The bot's message shows the chat as the users' messages made it.
    assert (sent.chat.type, sent.chat.title) == ("group", "Team")

    reply = fake.group_text_update(-100, 6, "thanks", reply_to=sent.message_id, title="Team")
    replied = message_of(Update.de_json(reply, bot)).reply_to_message
    assert replied is not None and replied.from_user is not None
    assert (replied.message_id, replied.text) == (sent.message_id, "hello, Team")
    assert replied.from_user.id == bot.id and replied.from_user.is_bot
    assert replied.from_user.username == "fake_bot"

    # A reply to a user's message shows that user; one to a message never seen, a stub.
    to_user = fake.group_text_update(-100, 6, "me too", reply_to=asked.message_id, title="Team")
    assert to_user["message"]["reply_to_message"]["from"]["id"] == 5
    assert to_user["message"]["reply_to_message"]["text"] == "hi"
    unknown = fake.group_text_update(-100, 6, "what?", reply_to=999, title="Team")
    assert set(unknown["message"]["reply_to_message"]) == {"message_id", "chat", "date"}

    assert [(m["message_id"], m["from"]["id"]) for m in fake.messages_in(-100)] == [
        (1, 5),
        (2, bot.id),
        (3, 6),
        (4, 6),
        (5, 6),
    ]
    # Telegram nests no reply in a reply_to_message.
    again = fake.group_text_update(-100, 5, "!", reply_to=3, title="Team")
    assert "reply_to_message" not in again["message"]["reply_to_message"]


async def test_a_topic_message_replies_to_the_topics_creation(fake: FakeTelegram, bot: Bot) -> None:
    fake.push_update(fake.group_text_update(GROUP, 5, "in the topic", topic=42))
    [update] = await bot.get_updates(timeout=0)
    message = message_of(update)

    assert (message.message_thread_id, message.is_topic_message) == (42, True)
    assert message.chat.type == "supergroup" and message.chat.is_forum
    assert message.message_id > 42  # the topic's id is its creation message's
    creation = message.reply_to_message
    # Not a reply to anything said: the service message that created the topic.
    assert creation is not None and creation.message_id == 42
    assert creation.forum_topic_created is not None
    assert creation.forum_topic_created.name == "Topic" and creation.text is None
    assert creation.from_user is not None and creation.from_user.id == 5

    answer = fake.group_text_update(GROUP, 6, "sure", topic=42, reply_to=message.message_id)
    replied = message_of(Update.de_json(answer, bot)).reply_to_message
    assert replied is not None and replied.message_id == message.message_id
    assert replied.text == "in the topic" and replied.forum_topic_created is None
    assert [m["message_id"] for m in fake.messages_in(GROUP)] == [42, 43, 44]


async def test_send_message_in_a_topic_with_reply_parameters(fake: FakeTelegram, bot: Bot) -> None:
    asked = fake.group_text_update(GROUP, 5, "@fake_bot hi", topic=42)["message"]
    assert await bot.send_chat_action(GROUP, "typing", message_thread_id=42)
    sent = await bot.send_message(
        GROUP,
        "hello",
        message_thread_id=42,
        reply_parameters=ReplyParameters(message_id=asked["message_id"]),
    )
    plain = await bot.send_message(GROUP, "and more", message_thread_id=42)
    elsewhere = await bot.send_message(GROUP, "in General")

    [action] = fake.calls_to("sendChatAction")
    assert action.thread_id == 42 and action.reply_to_message_id is None
    call, plain_call, _ = fake.sent_messages
    assert (call.reply_to_message_id, call.thread_id) == (asked["message_id"], 42)
    assert (plain_call.reply_to_message_id, plain_call.thread_id) == (None, 42)
    assert fake.bot_replies_in(GROUP, thread=42) == [call, plain_call]
    assert [c.text for c in fake.bot_replies_in(GROUP)] == ["hello", "and more", "in General"]
    assert fake.bot_replies_in(GROUP, thread=7) == [] and fake.bot_replies_in(-5) == []

    assert (sent.message_thread_id, sent.is_topic_message) == (42, True)
    assert sent.chat.type == "supergroup" and sent.chat.is_forum
    assert sent.reply_to_message is not None
    assert sent.reply_to_message.message_id == asked["message_id"]
    assert sent.reply_to_message.text == "@fake_bot hi"
    # In a topic, a message that replies to nothing replies to the topic's creation.
    assert plain.reply_to_message is not None and plain.reply_to_message.message_id == 42
    assert plain.reply_to_message.forum_topic_created is not None
    assert elsewhere.message_thread_id is None and elsewhere.reply_to_message is None

    stored = {m["message_id"]: m for m in fake.messages_in(GROUP)}
    assert stored[sent.message_id]["message_thread_id"] == 42
    assert stored[sent.message_id]["reply_to_message"]["message_id"] == asked["message_id"]
    assert stored[sent.message_id]["from"]["id"] == bot.id


async def test_a_reply_to_a_missing_message_is_refused_unless_allowed(
    fake: FakeTelegram, bot: Bot
) -> None:
    fake.group_text_update(-100, 5, "hi")
    with pytest.raises(BadRequest, match=r"(?i)^message to be replied not found$"):
        await bot.send_message(-100, "answer", reply_parameters=ReplyParameters(message_id=99))
    with pytest.raises(BadRequest, match=r"(?i)message to be replied not found"):
        await bot.send_message(-100, "answer", reply_to_message_id=99)
    sent = await bot.send_message(
        -100,
        "answer anyway",
        reply_parameters=ReplyParameters(message_id=99, allow_sending_without_reply=True),
    )
    assert sent.reply_to_message is None
    assert sent.message_id == 2  # the refused calls made no message

    # Over a JSON body, reply_parameters may come as an object or as its JSON text.
    url = f"{fake.api_url}/bot{fake.token}/sendMessage"
    refused = {"chat_id": -100, "text": "x", "reply_parameters": json.dumps({"message_id": 99})}
    allowed = {
        "chat_id": -100,
        "text": "y",
        "reply_parameters": json.dumps({"message_id": 99, "allow_sending_without_reply": True}),
    }
    async with aiohttp.ClientSession() as session:
        async with session.post(url, json=refused) as response:
            assert response.status == 400
            assert (await response.json())["description"] == (
                "Bad Request: message to be replied not found"
            )
        async with session.post(url, json=allowed) as response:
            assert response.status == 200
            assert "reply_to_message" not in (await response.json())["result"]

    calls = fake.calls_to("sendMessage")
    assert [(c.status, c.reply_to_message_id) for c in calls] == [
        (400, 99),
        (400, 99),
        (200, 99),
        (400, 99),
        (200, 99),
    ]
    assert [c.text for c in fake.bot_replies_in(-100)] == ["answer anyway", "y"]


async def test_a_draft_in_a_group_is_refused_and_in_private_still_shown(
    fake: FakeTelegram, bot: Bot
) -> None:
    # PTB strips "Bad Request: " and capitalizes what is left.
    with pytest.raises(BadRequest, match=r"(?i)^textdraft_peer_invalid$"):
        await bot.send_message_draft(-100, 1, "thinking")
    with pytest.raises(BadRequest, match=r"(?i)^textdraft_peer_invalid$"):
        await bot.send_message_draft(GROUP, 1, "thinking", message_thread_id=42)
    assert await bot.send_message_draft(5, 1, "thinking")
    assert [(c.chat_id, c.status, c.description) for c in fake.calls_to("sendMessageDraft")] == [
        (-100, 400, "Bad Request: TEXTDRAFT_PEER_INVALID"),
        (GROUP, 400, "Bad Request: TEXTDRAFT_PEER_INVALID"),
        (5, 200, None),
    ]
    assert fake.messages_in(-100) == []  # a draft is no message


async def test_get_me_reports_whether_privacy_mode_is_off(fake: FakeTelegram, bot: Bot) -> None:
    assert (await bot.get_me()).can_read_all_group_messages is False
    async with (
        FakeTelegram(can_read_all_group_messages=True) as open_fake,
        make_bot(open_fake) as open_bot,
    ):
        me = await open_bot.get_me()
        assert me.can_read_all_group_messages is True
        assert open_bot.bot.can_read_all_group_messages is True  # what initialize() saw
