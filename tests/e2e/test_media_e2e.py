"""Media in the burst, end to end: `lastword run` processes with the real Telegram adapter
(python-telegram-bot) and the real OpenAI client, against the loopback fakes of the Bot API
(getFile, downloads) and of the provider (content parts, /audio/transcriptions), with a real
server. Discord's signed, expiring attachment URLs at the end."""

from __future__ import annotations

import pytest

from bot.store import Keys
from tests.support.fakes import files
from tests.support.fakes.discord_server import FakeDiscord
from tests.support.running import Running, run_env
from tests.support.waits import settled
from tests.support.world import CHAT, CONVERSATION, World

pytestmark = pytest.mark.timeout(60)


def kinds(parts: list[tuple[str, str]]) -> list[str]:
    return [kind for kind, _ in parts]


async def test_a_photo_between_two_texts_is_one_image_part_between_them(world: World) -> None:
    telegram, provider = world.telegram, world.provider
    photo = telegram.add_file(files.photo(3000, 2000))
    async with world.bot() as bot:
        await bot.post(telegram.private_text_update(CHAT, CHAT, "look at this"))
        await bot.post(telegram.photo_update(CHAT, CHAT, "my garden", photo=photo))
        await bot.post(telegram.private_text_update(CHAT, CHAT, "the left one"))
        reply = await world.one_reply()
    [request] = provider.requests
    parts = request.user_parts()
    assert kinds(parts) == ["text", "image", "text"]
    assert "1. look at this" in parts[0][1] and "2. [photo] my garden" in parts[0][1]
    assert parts[2][1] == "3. the left one"
    assert parts[1][1].startswith("data:image/jpeg;base64,")
    assert "the left one" in reply
    # The largest size was fetched once, by id; never by a URL the store kept.
    assert [c.file_id for c in telegram.get_file_calls] == [photo]


async def test_an_album_of_three_photos_is_one_request_with_three_images(world: World) -> None:
    telegram, provider = world.telegram, world.provider
    ids = [telegram.add_file(files.photo(800, 600, color)) for color in ("red", "green", "white")]
    async with world.bot() as bot:
        for update in telegram.album_updates(CHAT, CHAT, ids, caption="our trip"):
            await bot.post(update)
        await world.one_reply()
    [request] = provider.requests
    assert kinds(request.user_parts()).count("image") == 3
    assert len(request.image_urls()) == 3


async def test_a_voice_note_is_transcribed_once_even_when_the_reply_is_interrupted(
    world: World,
) -> None:
    telegram, provider = world.telegram, world.provider
    voice = telegram.add_file(files.voice(10))
    provider.transcribe = lambda request: "meet me at the station at five"
    # The first generation is slow, so a newer message interrupts it.
    provider.delay_for = lambda request: 3.0 if len(provider.requests) == 1 else 0.0
    async with world.bot() as bot:
        await bot.post(telegram.voice_update(CHAT, CHAT, duration=10, file_id=voice))
        await bot.post(telegram.private_text_update(CHAT, CHAT, "sorry, noisy here"))
        first = await provider.wait_for_request(timeout=15)
        await bot.post(telegram.private_text_update(CHAT, CHAT, "which station?"))
        await provider.wait_for_request(lambda r: r is first and r.cancelled, timeout=10)
        reply = await world.one_reply()
    assert len(provider.transcriptions) == 1
    [transcription] = provider.transcriptions
    assert transcription.model == "whisper-1" and transcription.size == len(files.voice(10))
    last = provider.requests[-1]
    assert 'transcribed: "meet me at the station at five"' in last.last_user_text
    assert "which station?" in reply
    assert len(provider.requests) == 2


async def test_a_source_file_and_a_pdf_reach_the_model_as_text_within_the_limit(
    world: World,
) -> None:
    telegram, provider = world.telegram, world.provider
    source = "def greet(name):\n    return f'hello {name}'\n" + "# padding\n" * 100
    code = telegram.add_file(source.encode())
    paper = telegram.add_file(files.pdf("Quarterly results: revenue up", "Page two"))
    async with world.bot(LASTWORD_MEDIA__MAX_DOCUMENT_CHARS="200") as bot:
        await bot.post(
            telegram.document_update(CHAT, CHAT, "greet.py", "review this", file_id=code)
        )
        await bot.post(telegram.document_update(CHAT, CHAT, "report.pdf", file_id=paper))
        await world.one_reply()
    text = provider.requests[0].last_user_text
    assert "def greet(name):" in text and "review this" in text
    assert "more characters of greet.py were cut" in text
    assert "Quarterly results: revenue up" in text and "Page two" in text


async def test_files_that_cannot_be_read_leave_the_text_and_a_note(world: World) -> None:
    telegram, provider = world.telegram, world.provider
    big = telegram.add_file(files.photo(64, 64), declared_size=30_000_000)
    broken = telegram.add_file(files.corrupt_photo())
    gone = telegram.add_file(files.photo(64, 64))
    telegram.make_unreachable(gone)
    async with world.bot() as bot:
        await bot.post(telegram.photo_update(CHAT, CHAT, "too big", photo=big))
        await bot.post(telegram.photo_update(CHAT, CHAT, "broken", photo=broken))
        await bot.post(telegram.photo_update(CHAT, CHAT, "gone", photo=gone))
        await bot.post(telegram.private_text_update(CHAT, CHAT, "did you get them?"))
        await world.one_reply()
        assert bot.running.process.returncode is None
        log = bot.log
    [request] = provider.requests
    text = request.last_user_text
    assert request.image_urls() == []
    assert text.count("could not be read") == 3
    assert "over the limit" in text and "not a readable image" in text and "404" in text
    for caption in ("too big", "broken", "gone", "did you get them?"):
        assert caption in text
    assert log.count("could not read a photo") == 3


async def test_with_vision_off_no_image_is_sent_and_the_model_is_told(world: World) -> None:
    telegram, provider = world.telegram, world.provider
    photo = telegram.add_file(files.photo(640, 480))
    async with world.bot(LASTWORD_MEDIA__VISION="off") as bot:
        await bot.post(telegram.photo_update(CHAT, CHAT, "what is this?", photo=photo))
        await world.one_reply()
    [request] = provider.requests
    assert request.image_urls() == []
    assert request.last_user_text == "[photo] what is this?"
    system = request.messages[0]["content"]
    assert "You cannot see or open those" in system
    assert telegram.get_file_calls == []  # nothing fetched that is not shown


async def test_the_bot_token_reaches_no_provider_request_log_line_or_key(world: World) -> None:
    telegram, provider = world.telegram, world.provider
    photo = telegram.add_file(files.photo(640, 480))
    voice = telegram.add_file(files.voice(3))
    gone = telegram.add_file(files.photo(64, 64))
    telegram.make_unreachable(gone)
    async with world.bot() as bot:
        await bot.post(telegram.photo_update(CHAT, CHAT, "a photo", photo=photo))
        await bot.post(telegram.voice_update(CHAT, CHAT, file_id=voice))
        await bot.post(telegram.photo_update(CHAT, CHAT, "a lost one", photo=gone))
        await world.one_reply()
        log = bot.log
    # The bot did fetch with the token (the downloads' paths carry it)...
    assert any(telegram.token in d.path for d in telegram.downloads)
    # ...and it appears nowhere else.
    token = telegram.token
    assert token not in log
    for request in provider.requests:
        assert token not in str(request.body)
    for transcription in provider.transcriptions:
        assert token not in repr(transcription)
    async for key in world.redis.scan_iter(count=1000):
        assert token.encode() not in key
        dumped = await world.redis.dump(key)
        assert dumped is None or token.encode() not in dumped
    assert await world.redis.exists(Keys(CONVERSATION).history)


async def test_the_replica_that_took_the_photo_in_is_killed_and_the_other_answers(
    world: World,
) -> None:
    telegram, provider = world.telegram, world.provider
    photo = telegram.add_file(files.photo(640, 480))
    slow = {"LASTWORD_DEBOUNCE__QUIET_MS": "1500"}
    async with (
        world.bot("a", **slow) as first,
        world.bot("b", **slow) as second,
    ):
        await first.post(telegram.photo_update(CHAT, CHAT, "what is this?", photo=photo))
        await first.running.kill()
        assert telegram.downloads == []
        await world.one_reply()
        assert second.running.said("media for telegram:") >= 1
    [request] = provider.requests
    assert len(request.image_urls()) == 1
    assert [d.file_id for d in telegram.downloads] == [photo]


async def test_discord_attachments_are_fetched_from_their_signed_urls_and_expiry_is_a_note(
    world: World,
) -> None:
    provider = world.provider
    user = 7101
    async with FakeDiscord() as discord:
        channel = discord.dm_channel(user)
        env = run_env("discord", world.server.url, world.data_dir) | {
            "LASTWORD_DISCORD__TOKEN": discord.token,
            "LASTWORD_DISCORD__API_URL": discord.api_url,
            "LASTWORD_DISCORD__GATEWAY_URL": discord.gateway_url,
            "LASTWORD_LLM__PROVIDER": "openai",
            "LASTWORD_LLM__BASE_URL": provider.base_url,
            "LASTWORD_LLM__API_KEY": "sk-media-test",
            "LASTWORD_DEBOUNCE__QUIET_MS": "600",
        }
        running = await Running.start(env)
        try:
            await discord.wait_for_sessions(1, timeout=20)
            photo = discord.add_attachment(files.photo(900, 600), "desk.jpg", "image/jpeg")
            expired = discord.add_attachment(files.photo(64, 64), "old.png", "image/png")
            await discord.user_sends(user, "which lamp?", attachments=[photo, expired])
            discord.expire(int(expired["id"]))
            await discord.user_sends_voice(user, files.voice(4))
            await discord.wait_for_bot_messages(channel, 1, timeout=15)
            await settled(world.redis, f"discord:{channel}", within_s=10)
            assert running.process.returncode is None
        finally:
            await running.stop()
    [request] = provider.requests
    parts = request.user_parts()
    assert kinds(parts) == ["text", "image", "text"]
    assert "which lamp? [photo: desk.jpg]" in parts[0][1]
    assert "old.png) that could not be read: its link has expired" in parts[0][1]
    assert "transcribed:" in parts[2][1]
    assert len(provider.transcriptions) == 1
    assert len(discord.bot_messages(channel)) == 1
