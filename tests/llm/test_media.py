"""Media, piece by piece: images scaled and re-encoded, PDFs and text files read, the folded
turn's content parts in order, and the history's placeholders. End to end (processes, fakes)
in tests/e2e/test_media_e2e.py."""

from __future__ import annotations

import base64
import dataclasses
import io
import json

import pytest
from PIL import Image as Pillow
from redis.asyncio import Redis

from bot.config.settings import MediaSettings
from bot.llm.heavy import Unreadable, encode_image, pdf_text
from bot.llm.media import Media, decode_text, image_tokens
from bot.llm.prompt import FOLD_HEADER, Image, Turn, estimated_tokens, fit
from bot.message import GROUP_FIELDS, Attachment, InboundMessage
from bot.store import HistoryEntry, Keys, Store
from bot.tokens import Counter
from tests.support.fakes import files
from tests.support.fakes.outbound import RecordingOutbound

CONV = "telegram:77"


def encoded(data: bytes, max_edge: int = 1568) -> Image:
    """What the image worker makes of `data`, as the model is shown it."""
    made = encode_image(data, max_edge, 85, MediaSettings().max_image_pixels)
    return Image(made["url"], image_tokens(made["width"], made["height"]))


def decoded(url: str) -> Pillow.Image:
    assert url.startswith("data:image/jpeg;base64,")
    return Pillow.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))


def test_an_image_is_scaled_to_the_edge_and_sent_as_jpeg() -> None:
    image = encoded(files.photo(3000, 2000, fmt="PNG"))
    picture = decoded(image.url)
    assert picture.format == "JPEG"
    assert picture.size == (1568, 1045)
    # Not cropped or flipped: the blue corner is still top-left.
    r, _, b = picture.convert("RGB").getpixel((10, 10))  # type: ignore[misc]
    assert b > 200 and r < 60
    assert image.tokens == image_tokens(1568, 1045)


def test_a_small_image_keeps_its_size_and_an_exif_turn_is_applied() -> None:
    assert decoded(encoded(files.photo(300, 200)).url).size == (300, 200)
    assert decoded(encoded(files.rotated_photo(400, 200)).url).size == (200, 400)


def test_transparency_becomes_white() -> None:
    picture = decoded(encoded(files.transparent_png()).url).convert("RGB")
    assert min(picture.getpixel((5, 5))) > 240  # type: ignore[arg-type]


def test_image_tokens_follow_the_published_tiling() -> None:
    assert image_tokens(512, 512) == 85 + 170
    # 1568x1045 -> short side to 768: 1152x768 -> 3x2 tiles.
    assert image_tokens(1568, 1045) == 85 + 170 * 6
    assert image_tokens(4000, 4000) == 85 + 170 * 4


@pytest.mark.parametrize("data", [files.corrupt_photo(), b"", b"GIF89a broken", files.pdf("x")])
def test_what_is_not_an_image_is_refused_with_a_reason(data: bytes) -> None:
    with pytest.raises(Unreadable, match="not a readable image"):
        encoded(data)


def test_pdf_text_is_read_page_by_page() -> None:
    assert pdf_text(files.pdf("Hello world", "Page (two)")) == "Hello world\n\nPage (two)"


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"not a pdf at all", "not a PDF"),
        (files.pdf("ok")[:60], "damaged|no text"),
        (files.pdf(""), "no text"),
    ],
)
def test_a_bad_pdf_is_refused_with_a_reason(data: bytes, why: str) -> None:
    with pytest.raises(Unreadable, match=why):
        pdf_text(data)


def test_text_files_decode_leniently_but_binaries_are_refused() -> None:
    assert decode_text("print('héllo')\n".encode()) == "print('héllo')\n"
    assert decode_text(b"\xef\xbb\xbfwith a BOM") == "with a BOM"
    assert decode_text("utf16".encode("utf-16")) == "utf16"
    assert decode_text(b"bad \xff byte") == "bad \ufffd byte"
    with pytest.raises(Unreadable, match="not a text file"):
        decode_text(b"\x7fELF\x00\x00\x01")


def test_the_folded_turn_puts_each_image_after_its_message_text() -> None:
    red, blue = Image("data:image/jpeg;base64,AAAA", 100), Image("data:image/jpeg;base64,BBBB", 100)
    prompt = fit(
        "system",
        [Turn("user", "[photo] earlier"), Turn("assistant", "ok")],
        ["look at this", "[photo] what is it?", "and this [photo] [photo]"],
        4000,
        Counter(),
        [(), (red,), (blue, red)],
    )
    turn = prompt.messages()[-1]
    assert turn["role"] == "user"
    kinds = [(p["type"], p.get("text") or p["image_url"]["url"]) for p in turn["content"]]
    assert kinds == [
        ("text", f"{FOLD_HEADER}\n1. look at this\n2. [photo] what is it?"),
        ("image_url", red.url),
        ("text", "3. and this [photo] [photo]"),
        ("image_url", blue.url),
        ("image_url", red.url),
    ]
    # History stays text: a past image is its label, never its bytes.
    assert prompt.messages()[1] == {"role": "user", "content": "[photo] earlier"}
    assert estimated_tokens(prompt, Counter()) >= 300


def test_without_images_the_turn_stays_plain_text() -> None:
    prompt = fit("system", [], ["one", "two"], 4000, Counter(), [(), ()])
    assert prompt.messages()[-1]["content"] == f"{FOLD_HEADER}\n1. one\n2. two"
    assert prompt.images == ()


def test_images_count_against_the_budget_and_leave_with_their_message() -> None:
    big = Image("data:image/jpeg;base64,AAAA", 990)
    prompt = fit(
        "s", [Turn("user", "old")], ["[photo] first", "second"], 1000, Counter(), [(big,), ()]
    )
    # The older message and its image do not fit beside the newest: both are left out.
    assert prompt.unanswered == ("second",)
    assert prompt.left_out == 1
    assert not any(prompt.images)


def test_labels_sit_where_the_platform_puts_the_text() -> None:
    caption_after = Attachment("photo", "f1")
    text_first = Attachment("photo", "https://cdn/x.png", name="x.png", text_first=True)
    telegram = InboundMessage("telegram", "1", "1", "m1", "my cat", attachments=(caption_after,))
    discord = InboundMessage("discord", "1", "1", "m2", "look", attachments=(text_first,))
    assert telegram.prompt_text() == "[photo] my cat"
    assert discord.prompt_text() == "look [photo: x.png]"
    sticker = InboundMessage(
        "telegram", "1", "1", "m3", "", attachments=(Attachment("sticker", "s", name="👍"),)
    )
    assert sticker.prompt_text() == "[sticker: 👍]"


def test_attachments_survive_the_store_round_trip_whole() -> None:
    voice = Attachment("voice", "fid", "audio/ogg", 2048, "voice.ogg", "uniq", False)
    message = InboundMessage("telegram", "1", "1", "m1", "", attachments=(voice,))
    assert InboundMessage.from_json(message.to_json()).attachments == (voice,)
    # Messages stored before attachments had more than a kind and a ref still load.
    old = (
        message.to_json()
        .replace(
            '"mime": "audio/ogg", "size": 2048, "name": "voice.ogg", "file_key": "uniq", '
            '"text_first": false',
            "",
        )
        .replace('"ref": "fid", ', '"ref": "fid"')
    )
    assert InboundMessage.from_json(old).attachments == (Attachment("voice", "fid"),)


async def test_history_shows_a_past_voice_note_as_its_cached_transcript(
    store: Store, redis: Redis
) -> None:
    voice = Attachment("voice", "fid", "audio/ogg", 2048, "voice.ogg", "uniq-1")
    photo = Attachment("photo", "pid", file_key="uniq-2")
    entries = [
        HistoryEntry("user", 1, voice.label(), (voice,)),
        HistoryEntry("user", 2, "[photo] my garden", (photo,)),
        HistoryEntry("assistant", 2, "Nice garden."),
    ]
    media = Media(MediaSettings(), "gpt-4o", RecordingOutbound(), store, None)
    before = await media.history(CONV, entries)
    assert [t.text for t in before] == ["[voice note]", "[photo] my garden", "Nice garden."]
    await store.keep_transcript(CONV, "uniq-1", "see you at five")
    after = await media.history(CONV, entries)
    assert after[0] == Turn("user", '[voice note, transcribed: "see you at five"]')
    assert after[1:] == before[1:]
    # Cached for the conversation's retention, in the conversation's slot.
    key = Keys(CONV).transcript("uniq-1")
    assert key.startswith(Keys(CONV).base)
    assert 0 < await redis.pttl(key) <= store.settings.retention_ms


def test_a_stored_message_is_laid_out_as_it_always_was() -> None:
    """`to_json` skips `dataclasses.asdict` (a deep copy per message) and must still write
    the very same text: every field, in declaration order, attachments as objects; a DM's
    without the group fields, as before groups existed (a replica of that version reads it)."""
    photo = Attachment("photo", "ref", "image/png", 5, "a.png", "k", True)
    message = InboundMessage(
        "telegram", "1", "2", "m1", "héllo", "Ann", 1.5, "m0", (photo, Attachment("voice", "v"))
    )
    laid_out = dataclasses.asdict(message)
    for name in GROUP_FIELDS:
        del laid_out[name]
    assert message.to_json() == json.dumps(laid_out, ensure_ascii=False)
    assert InboundMessage.from_json(message.to_json()) == message
    in_group = dataclasses.replace(message, is_dm=False, topic="7", mentioned=True)
    assert InboundMessage.from_json(in_group.to_json()) == in_group
