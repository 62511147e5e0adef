"""The bounds on what a burst's files may cost: how many files are read, how many bytes the
burst may fetch in all, and a file's size checked after the download too (a platform may not
say how large a file is, or say it wrongly). A file past a bound becomes a note saying why;
it is never fetched, or never read, whole.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from bot.config.settings import MediaSettings
from bot.llm.media import Media
from bot.message import Attachment, InboundMessage
from bot.store import Store
from tests.support.fakes.files import Shelf

CONV = "telegram:1"
FILE_LIMIT = 4096
BURST_LIMIT = 6000


@pytest.fixture
async def shelf() -> Shelf:
    return Shelf()


@pytest.fixture
async def media(store: Store, shelf: Shelf) -> AsyncIterator[Media]:
    settings = MediaSettings(max_files=2, max_file_bytes=FILE_LIMIT, max_burst_bytes=BURST_LIMIT)
    reader = Media(settings, "gpt-4o", shelf, store, None)
    yield reader
    await reader.close()


def shelved(shelf: Shelf, name: str, size: int, *, declared: int | None = None) -> Attachment:
    """A text file of `size` bytes on the shelf, the platform saying it is `declared` bytes
    (its true size unless given; 0: the platform does not say)."""
    shelf.shelved[name] = b"x" * (size - 1) + b"\n"
    return Attachment(
        "document", name, "text/plain", size if declared is None else declared, name, name
    )


def burst(*attachments: Attachment) -> list[InboundMessage]:
    return [InboundMessage("telegram", "1", "1", "m1", "look", attachments=attachments)]


async def test_files_past_the_count_are_neither_fetched_nor_read(
    media: Media, shelf: Shelf
) -> None:
    files = [shelved(shelf, f"f{i}.txt", 100) for i in range(3)]
    prepared = await media.prepare(CONV, burst(*files))
    assert shelf.fetches == ["f0.txt", "f1.txt"]
    assert "more than 2 files came at once" in prepared.texts[0]


async def test_the_burst_s_bytes_are_bounded_across_its_files(media: Media, shelf: Shelf) -> None:
    """Each file is under the per-file limit; together they are over the burst's, so the
    second, which would take the burst past it, is refused before it is fetched."""
    first, second = shelved(shelf, "a.txt", 3500), shelved(shelf, "b.txt", 3500)
    prepared = await media.prepare(CONV, burst(first, second))
    assert shelf.fetches == ["a.txt"]
    assert prepared.texts[0].count("could not be read") == 1
    assert "the files sent together are over" in prepared.texts[0]


async def test_a_file_larger_than_the_platform_said_is_refused_after_the_download(
    media: Media, shelf: Shelf
) -> None:
    unknown = shelved(shelf, "big.txt", FILE_LIMIT + 1000, declared=0)
    prepared = await media.prepare(CONV, burst(unknown))
    assert shelf.fetches == ["big.txt"]
    assert "over the limit of" in prepared.texts[0]
    assert "x" * 100 not in prepared.texts[0]
