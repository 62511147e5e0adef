"""Poison files against Media and its worker processes, in process with a real server (issue
19): each one becomes a note for the model and never an exception; heavy reading runs in
workers that are killed at the time limit and replaced, the job tried once more in a fresh
one; a file is read once however often its cycle is interrupted. End to end (lastword run) in
tests/e2e/test_poison_media_e2e.py; workers that die for reasons of their own in
tests/e2e/test_reader_deaths.py."""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
from pydantic import SecretStr

from bot.config.settings import LLMSettings, MediaSettings
from bot.llm.heavy import Unreadable, Workers, encode_image
from bot.llm.media import Media, Prepared
from bot.llm.transcribe import OpenAITranscriber
from bot.loop_lag import LoopWatch
from bot.message import Attachment, InboundMessage
from bot.store import Store
from tests.support.fakes import files
from tests.support.fakes.openai_server import FakeOpenAI

pytestmark = pytest.mark.timeout(60)

CONV = "telegram:1919"


def media(store: Store, shelf: files.Shelf, **settings: object) -> Media:
    return Media(MediaSettings.model_validate(settings), "gpt-4o", shelf, store, None)


def document(ref: str, name: str, mime: str = "") -> Attachment:
    return Attachment("document", ref, mime, 1000, name, f"uniq-{ref}")


def burst(*attachments: Attachment, text: str = "") -> list[InboundMessage]:
    return [InboundMessage("telegram", "1919", "1919", "m1", text, attachments=attachments)]


async def read_one(m: Media, attachment: Attachment) -> Prepared:
    try:
        return await m.prepare(CONV, burst(attachment, text="and a follow-up"))
    finally:
        await m.close()


async def test_an_owner_password_pdf_opens_and_a_user_password_one_is_a_note(
    store: Store,
) -> None:
    shelf = files.Shelf(
        shelved={"aes": files.encrypted_pdf(), "locked": files.encrypted_pdf("secret")}
    )
    m = media(store, shelf)
    try:
        said = await m.prepare(
            CONV,
            burst(document("aes", "statement.pdf"), document("locked", "private.pdf")),
        )
    finally:
        await m.close()
    [text] = said.texts
    assert "Statement: balance 42.00 EUR" in text
    assert (
        "[the user sent a document (private.pdf) that could not be read: "
        "it is password-protected]" in text
    )
    assert said.unseen


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (files.broken_png, "it is not a readable image (SyntaxError)"),
        # Made by the test, not at collection: its ~1 s of compression would otherwise be
        # paid by every worker of the suite, whichever test it runs.
        (files.huge_png, "the image is too large (7000x7000)"),
        (lambda: b"\x89PNG\r\n\x1a\n" + b"\x00" * 50, "it is not a readable image"),
    ],
    ids=["broken", "huge", "header-only"],
)
async def test_a_broken_or_oversized_image_is_a_note(
    store: Store, make: Callable[[], bytes], why: str
) -> None:
    data = make()
    photo = Attachment("photo", "p", "", len(data), "", "uniq-p")
    said = await read_one(media(store, files.Shelf(shelved={"p": data})), photo)
    assert f"could not be read: {why}" in said.texts[0]
    assert "and a follow-up" in said.texts[0]
    assert said.images == ()


async def test_an_eps_named_png_is_refused_and_ghostscript_never_runs(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A `gs` first on PATH that leaves a mark if anything runs it.
    mark = tmp_path / "gs-ran"
    gs = tmp_path / "gs"
    gs.write_text(f"#!/bin/sh\ntouch {mark}\nexit 1\n")
    gs.chmod(gs.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    eps = Attachment("document", "x", "image/png", len(files.eps()), "x.png", "uniq-x")
    said = await read_one(media(store, files.Shelf(shelved={"x": files.eps()})), eps)
    assert "(x.png) that could not be read: it is not a readable image" in said.texts[0]
    assert not mark.exists()


def test_an_image_is_reduced_before_it_is_turned_and_a_jpeg_decoded_at_a_fraction() -> None:
    # Stored 4000x2000, EXIF 6: upright it is 2000x4000, scaled to the 1568 px edge.
    made = encode_image(files.huge_png(4000, 2000), 1568, 85, 24_000_000)
    assert (made["width"], made["height"]) == (784, 1568)
    # 7000x4000 is 28 M pixels, over the limit, but a JPEG decoded at half size is 7 M.
    made = encode_image(files.photo(7000, 4000), 1568, 85, 24_000_000)
    assert (made["width"], made["height"]) == (1568, 896)
    with pytest.raises(Unreadable, match="too large"):
        encode_image(files.photo(7000, 4000, fmt="PNG"), 1568, 85, 24_000_000)


async def test_an_error_nobody_foresaw_is_a_note_not_a_failed_cycle(store: Store) -> None:
    shelf = files.Shelf(shelved={"boom": RuntimeError("a platform library bug")})
    said = await read_one(media(store, shelf), document("boom", "notes.txt"))
    assert "could not be read: the download failed (RuntimeError)" in said.texts[0]


async def test_a_pdf_that_takes_too_long_is_killed_twice_and_its_worker_replaced(
    store: Store,
) -> None:
    shelf = files.Shelf(shelved={"slow": files.hostile_pdf(), "fine": files.pdf("Fine")})
    m = media(store, shelf, work_timeout_s=1.0, workers=1)
    watch = LoopWatch(interval_s=0.02)
    watch.start()
    try:
        said = await m.prepare(CONV, burst(document("slow", "slow.pdf")))
        assert "could not be read: it took too long to read (over 1 s)" in said.texts[0]
        # Tried once more in a fresh worker, in case the first was starved of CPU.
        assert m.workers.overran == 2
        # A fresh worker reads the next file.
        said = await m.prepare(CONV, burst(document("fine", "fine.pdf")))
        assert "Fine" in said.texts[0]
        assert m.workers.started == 3
    finally:
        await m.close()
    # The loop kept its timers while workers burned two seconds of CPU.
    assert watch.worst_s < 0.25


async def test_an_interrupted_read_is_awaited_by_the_next_cycle_not_started_again(
    store: Store,
) -> None:
    shelf = files.Shelf(shelved={"slow": files.hostile_pdf()})
    m = media(store, shelf, work_timeout_s=1.5, workers=2)
    try:
        for _ in range(3):
            interrupted = asyncio.create_task(m.prepare(CONV, burst(document("slow", "a.pdf"))))
            await asyncio.sleep(0.2)
            interrupted.cancel()
            with pytest.raises(asyncio.CancelledError):
                await interrupted
        said = await m.prepare(CONV, burst(document("slow", "a.pdf")))
        assert "it took too long to read" in said.texts[0]
        # One fetch, and the job's two tries.
        assert shelf.fetches == ["slow"] and m.workers.started == 2
    finally:
        await m.close()


async def test_concurrent_reads_wait_for_the_replicas_few_workers(store: Store) -> None:
    pdfs = {f"p{i}": files.pdf(f"Report {i}") for i in range(5)}
    m = media(store, files.Shelf(shelved=dict(pdfs)), workers=2)
    try:
        said = await asyncio.gather(
            *(m.prepare(f"telegram:{ref}", burst(document(ref, f"{ref}.pdf"))) for ref in pdfs)
        )
    finally:
        await m.close()
    for i, one in enumerate(said):
        assert f"Report {i}" in one.texts[0]
    assert m.workers.started == 2


async def test_a_voice_note_interrupted_five_times_is_transcribed_once(store: Store) -> None:
    voice = files.voice(5)
    note = Attachment("voice", "v", "audio/ogg", len(voice), "voice.ogg", "uniq-v")
    async with FakeOpenAI() as provider:
        # In flight until all five interruptions are done, however slow the machine.
        provider.hold_transcriptions()
        provider.transcribe = lambda request: "see you at the station"
        llm = LLMSettings(
            provider="openai", base_url=provider.base_url, api_key=SecretStr("sk-test")
        )
        transcriber = OpenAITranscriber(MediaSettings(), llm)
        shelf = files.Shelf(shelved={"v": voice})
        m = Media(MediaSettings(), "gpt-4o", shelf, store, transcriber)
        for _ in range(5):
            interrupted = asyncio.create_task(m.prepare(CONV, burst(note)))
            await asyncio.sleep(0.1)
            interrupted.cancel()
            with pytest.raises(asyncio.CancelledError):
                await interrupted
        provider.release_transcriptions()
        said = await m.prepare(CONV, burst(note))
        await m.close()
    assert said.texts[0] == '[voice note, transcribed: "see you at the station"]'
    assert len(provider.transcriptions) == 1
    assert shelf.fetches == ["v"]


async def test_a_refused_file_does_not_cost_a_worker_process() -> None:
    workers = Workers(1, 5.0, 512)
    try:
        with pytest.raises(Unreadable, match="not a PDF"):
            await workers.run("pdf", b"GIF89a", enough=100)
        # The same worker serves the next job: a refusal does not cost a process.
        assert (await workers.run("pdf", files.pdf("ok"), enough=100)) == {"text": "ok"}
        assert workers.started == 1
    finally:
        await workers.close()
