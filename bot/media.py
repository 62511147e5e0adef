"""Photos, files and voice notes, folded into the one turn.

The store keeps only references (`Attachment`); the replica that answers fetches the bytes
through the platform (`Outbound.fetch`), inside its cycle and under its lease, so any replica
can answer and a newer message still interrupts. Each file becomes what the model can take:

- an image: decoded, turned upright, scaled down to `max_edge_px` and re-encoded as JPEG, then
  shown as a `data:` URL right after the text of its message (if the model can see images);
- a voice note or audio file: transcribed, and cached by its file key, so a generation that
  is interrupted and started again does not pay for it twice;
- a text file or a PDF: its text, cut at `max_document_chars` with a note;
- a sticker: its emoji; anything else (a video): its label, and the model is told it cannot
  open it.

A file that cannot be read (too large, corrupt, gone, a failing service) never costs the text
around it: the model is told "the user sent a file that could not be read (why)", and the log
says which. Bounds: bytes per file, files per burst, bytes per burst, and time per fetch and
per transcription.
"""

from __future__ import annotations

import asyncio
import base64
import fnmatch
import io
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from bot.message import Attachment, FetchFailed, InboundMessage, Outbound
from bot.prompt import Image, Turn
from bot.settings import MediaSettings
from bot.store import HistoryEntry, Store, StoreUnavailable
from bot.transcribe import Transcriber, TranscriptionFailed

log = logging.getLogger(__name__)

# Told to the model whenever the turn carries something it is shown only as a label.
UNSEEN_NOTE = (
    "Some things the user sent appear only as labels such as [photo], [video] or [sticker: 😀], "
    "or as a note that a file could not be read. You cannot see or open those: say so "
    "politely where it matters, and answer everything else."
)

# Files read as text, by extension, besides every text/* MIME type: what users send as
# "here is my code / my data".
# fmt: off
TEXT_SUFFIXES = frozenset((
    ".txt", ".md", ".markdown", ".rst", ".csv", ".tsv", ".json", ".jsonl", ".yaml", ".yml",
    ".toml", ".ini", ".cfg", ".conf", ".log", ".xml", ".html", ".htm", ".css", ".py", ".pyi",
    ".js", ".mjs", ".ts", ".tsx", ".jsx", ".java", ".kt", ".kts", ".c", ".h", ".cc", ".cpp",
    ".hpp", ".cs", ".go", ".rs", ".rb", ".php", ".swift", ".scala", ".sh", ".bash", ".zsh",
    ".ps1", ".sql", ".r", ".lua", ".pl", ".dart", ".vue", ".svelte", ".tex", ".diff", ".patch",
    ".env", ".gitignore", ".dockerfile",
))
# fmt: on
TEXT_MIME_TYPES = frozenset(
    (
        "application/json",
        "application/xml",
        "application/x-yaml",
        "application/yaml",
        "application/javascript",
        "application/x-sh",
        "application/sql",
        "application/toml",
    )
)  # fmt: skip
# Pixels a decoded image may have; past this a file is refused rather than decoded (a
# "decompression bomb" of a few kilobytes can claim billions of pixels).
MAX_PIXELS = 50_000_000
PDF_MAGIC = b"%PDF-"


@dataclass
class Timings:
    """Where a burst's media time went, in seconds: for the log and the benchmark."""

    download_s: float = 0.0
    transcription_s: float = 0.0
    encoding_s: float = 0.0
    # Transcripts taken from the cache instead of the service.
    cached: int = 0


@dataclass(frozen=True)
class Prepared:
    """The unanswered messages as the model will see them."""

    texts: tuple[str, ...]
    images: tuple[tuple[Image, ...], ...]
    # Something was shown only as a label, or could not be read: the model gets UNSEEN_NOTE.
    unseen: bool
    timings: Timings = field(default_factory=Timings)


@dataclass
class _Budget:
    """What is left of the burst's bounds."""

    files: int
    bytes: int


class Media:
    """Turns a burst's files into text and images for the model."""

    def __init__(
        self,
        settings: MediaSettings,
        model: str,
        outbound: Outbound,
        store: Store,
        transcriber: Transcriber | None,
        *,
        can_see: bool = True,
    ) -> None:
        self.outbound = outbound
        self.store = store
        self.transcriber = transcriber
        # Transcriptions carried on after their cycle was interrupted, so their result is
        # cached for the next one; held here so they are not collected mid-flight.
        self._finishing: set[asyncio.Task[str]] = set()
        self.configure(settings, model, can_see=can_see)

    def configure(self, settings: MediaSettings, model: str, *, can_see: bool = True) -> None:
        """Take on reloaded settings. `can_see` is False for a model that cannot be shown
        images whatever the settings say (the offline echo)."""
        self.settings = settings
        self.vision = can_see and (
            settings.vision == "on"
            or (
                settings.vision == "auto"
                and any(fnmatch.fnmatch(model.lower(), p.lower()) for p in settings.vision_models)
            )
        )

    async def prepare(self, conversation: str, messages: Sequence[InboundMessage]) -> Prepared:
        """Each message's text with what its files said, and its images, in order."""
        budget = _Budget(self.settings.max_files, self.settings.max_burst_bytes)
        timings = Timings()
        heard = await self._cached_transcripts(conversation, messages)
        timings.cached = len(heard)
        texts: list[str] = []
        images: list[tuple[Image, ...]] = []
        unseen = False
        for message in messages:
            said: list[str] = []
            shown: list[Image] = []
            for attachment in message.attachments:
                piece, image, seen = await self._read(
                    conversation, attachment, budget, timings, heard
                )
                said.append(piece)
                if image is not None:
                    shown.append(image)
                unseen = unseen or not seen
            texts.append(message.text_with(said))
            images.append(tuple(shown))
        if any(m.attachments for m in messages):
            log.info(
                "media for %s: download %.0f ms, transcription %.0f ms (%d cached), "
                "encoding %.0f ms",
                conversation,
                timings.download_s * 1000,
                timings.transcription_s * 1000,
                timings.cached,
                timings.encoding_s * 1000,
            )
        return Prepared(tuple(texts), tuple(images) if any(images) else (), unseen, timings)

    async def history(self, conversation: str, entries: Sequence[HistoryEntry]) -> list[Turn]:
        """History turns: a past image as its label ("[photo] the caption"), never its bytes
        again; a past voice note as its transcript, when it is still cached."""
        voiced = [
            a
            for e in entries
            for a in e.attachments
            if _is_audio(a) and e.role == "user" and a.file_key
        ]
        transcripts: dict[str, str] = {}
        if voiced:
            try:
                found = await self.store.transcripts(conversation, [a.file_key for a in voiced])
            except StoreUnavailable as exc:
                log.warning("could not read the transcripts of %s: %s", conversation, exc)
                found = []
            transcripts = {a.file_key: t for a, t in zip(voiced, found, strict=False) if t}
        turns = []
        for entry in entries:
            text = entry.text
            for a in entry.attachments:
                if a.file_key in transcripts and _is_audio(a):
                    text = text.replace(a.label(), _transcribed(a, transcripts[a.file_key]), 1)
            turns.append(Turn(entry.role, text))
        return turns

    async def _cached_transcripts(
        self, conversation: str, messages: Sequence[InboundMessage]
    ) -> dict[str, str]:
        keys = [a.file_key for m in messages for a in m.attachments if _is_audio(a) and a.file_key]
        if not keys or self.transcriber is None:
            return {}
        try:
            found = await self.store.transcripts(conversation, keys)
        except StoreUnavailable as exc:
            log.warning("could not read the transcript cache of %s: %s", conversation, exc)
            return {}
        return {key: text for key, text in zip(keys, found, strict=True) if text is not None}

    async def _read(
        self,
        conversation: str,
        attachment: Attachment,
        budget: _Budget,
        timings: Timings,
        heard: dict[str, str],
    ) -> tuple[str, Image | None, bool]:
        """What one file says: (its text for the turn, its image, whether the model was shown
        what it is)."""
        label = attachment.label()
        kind = _kind_of(attachment)
        if kind == "sticker":
            return label, None, bool(attachment.name)
        if kind == "other" or (kind == "image" and not self.vision):
            return label, None, False
        if kind == "audio" and attachment.file_key in heard:
            return _transcribed(attachment, heard[attachment.file_key]), None, True
        if kind == "audio" and self.transcriber is None:
            return _failed(attachment, "no transcription service is configured"), None, False
        try:
            data = await self._fetch(attachment, budget, timings)
            if kind == "image":
                return label, await self._image(data, timings), True
            if kind == "audio":
                text = await self._transcript(conversation, attachment, data, timings)
                return _transcribed(attachment, text), None, True
            return await self._document(attachment, data, kind, timings), None, True
        except (FetchFailed, TranscriptionFailed, _Unreadable) as exc:
            log.warning(
                "could not read a %s (%s) from %s: %s",
                attachment.kind,
                attachment.name or attachment.mime or "no name",
                conversation,
                exc,
            )
            return _failed(attachment, str(exc)), None, False

    async def _fetch(self, attachment: Attachment, budget: _Budget, timings: Timings) -> bytes:
        limit = min(self.settings.max_file_bytes, budget.bytes)
        if budget.files <= 0:
            raise _Unreadable(f"more than {self.settings.max_files} files came at once")
        budget.files -= 1
        if attachment.size > self.settings.max_file_bytes:
            raise _Unreadable(
                f"it is {_mb(attachment.size)}, over the limit of "
                f"{_mb(self.settings.max_file_bytes)}"
            )
        if attachment.size > limit:
            raise _Unreadable(
                f"the files sent together are over {_mb(self.settings.max_burst_bytes)}"
            )
        began = time.monotonic()
        try:
            async with asyncio.timeout(self.settings.fetch_timeout_s):
                data = await self.outbound.fetch(attachment, limit)
        except TimeoutError:
            raise _Unreadable(
                f"the download took over {self.settings.fetch_timeout_s:g} s"
            ) from None
        finally:
            timings.download_s += time.monotonic() - began
        if len(data) > limit:
            raise _Unreadable(f"it is over the limit of {_mb(limit)}")
        budget.bytes -= len(data)
        return data

    async def _image(self, data: bytes, timings: Timings) -> Image:
        began = time.monotonic()
        try:
            # Decoding and scaling are CPU work: off the event loop, which serves every
            # other conversation meanwhile.
            return await asyncio.to_thread(
                encode_image, data, self.settings.max_edge_px, self.settings.jpeg_quality
            )
        finally:
            timings.encoding_s += time.monotonic() - began

    async def _transcript(
        self, conversation: str, attachment: Attachment, data: bytes, timings: Timings
    ) -> str:
        assert self.transcriber is not None
        began = time.monotonic()
        task = asyncio.ensure_future(self._transcribe_and_keep(conversation, attachment, data))
        self._finishing.add(task)
        task.add_done_callback(self._finishing.discard)
        # Its failure is the awaiting cycle's to report; if that cycle was interrupted, the
        # failure is collected here instead of warned about as never retrieved.
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
        try:
            # Shielded: if a newer message interrupts the cycle now, the transcription still
            # finishes and is cached for the cycle that follows.
            return await asyncio.shield(task)
        finally:
            timings.transcription_s += time.monotonic() - began

    async def _transcribe_and_keep(
        self, conversation: str, attachment: Attachment, data: bytes
    ) -> str:
        assert self.transcriber is not None
        try:
            async with asyncio.timeout(self.settings.transcription_timeout_s):
                text = await self.transcriber.transcribe(data, attachment.name, attachment.mime)
        except TimeoutError:
            raise TranscriptionFailed(
                f"the transcription took over {self.settings.transcription_timeout_s:g} s"
            ) from None
        text = _cut(text, self.settings.max_document_chars, "the transcript")
        if attachment.file_key:
            try:
                await self.store.keep_transcript(conversation, attachment.file_key, text)
            except StoreUnavailable as exc:
                log.warning("could not cache a transcript for %s: %s", conversation, exc)
        return text

    async def _document(
        self, attachment: Attachment, data: bytes, kind: str, timings: Timings
    ) -> str:
        began = time.monotonic()
        try:
            if kind == "pdf":
                text = await asyncio.to_thread(pdf_text, data, self.settings.max_document_chars)
            else:
                text = decode_text(data)
        finally:
            timings.encoding_s += time.monotonic() - began
        name = attachment.name or attachment.kind
        text = _cut(text, self.settings.max_document_chars, name)
        return f"{attachment.label()}\n{text}\n[end of {name}]\n"


class _Unreadable(Exception):
    """A file the bounds or its content keep from the model; the reason is shown to it."""


def _kind_of(attachment: Attachment) -> str:
    """image, audio, pdf, text, sticker or other."""
    mime = attachment.mime.lower().split(";")[0].strip()
    suffix = PurePosixPath(attachment.name.lower()).suffix
    if attachment.kind == "sticker":
        return "sticker"
    if attachment.kind == "photo" or mime.startswith("image/"):
        return "image"
    if _is_audio(attachment):
        return "audio"
    if mime == "application/pdf" or suffix == ".pdf":
        return "pdf"
    if attachment.kind == "document" and (
        mime.startswith("text/") or mime in TEXT_MIME_TYPES or suffix in TEXT_SUFFIXES
    ):
        return "text"
    return "other"


def _is_audio(attachment: Attachment) -> bool:
    return attachment.kind in ("voice", "audio") or attachment.mime.lower().startswith("audio/")


def _transcribed(attachment: Attachment, text: str) -> str:
    what = "voice note" if attachment.kind == "voice" else f"audio {attachment.name}".strip()
    return f'[{what}, transcribed: "{text}"]'


def _failed(attachment: Attachment, why: str) -> str:
    what = attachment.kind.replace("_", " ")
    named = f" ({attachment.name})" if attachment.name and attachment.kind != "sticker" else ""
    return f"[the user sent a {what}{named} that could not be read: {why}]"


def _mb(size: int) -> str:
    return f"{size / 1024 / 1024:.1f} MB"


def _cut(text: str, limit: int, what: str) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[… {len(text) - limit} more characters of {what} were cut]"


def decode_text(data: bytes) -> str:
    """A text file's text: UTF-8 (with or without a BOM), else UTF-16 with a BOM; a file with
    NUL bytes is binary whatever its name says."""
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        return data.decode("utf-16", "replace")
    if b"\x00" in data[:8192]:
        raise _Unreadable("it is not a text file")
    return data.decode("utf-8-sig", "replace")


def pdf_text(data: bytes, enough: int | None = None) -> str:
    """The text of a PDF's pages, separated by a blank line; pages past the first `enough`
    characters are not read (extraction is CPU work in a thread that cannot be cancelled, so
    a thousand-page file must not cost a thousand pages when only the start is shown)."""
    from pypdf import PdfReader
    from pypdf.errors import PyPdfError

    if not data.startswith(PDF_MAGIC):
        raise _Unreadable("it is not a PDF")
    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted:
            raise _Unreadable("the PDF is encrypted")
        pages: list[str] = []
        read = 0
        for page in reader.pages:
            pages.append(page.extract_text() or "")
            read += len(pages[-1])
            if enough is not None and read > enough:
                break
    except (PyPdfError, ValueError, KeyError, TypeError) as exc:
        raise _Unreadable(f"the PDF is damaged ({type(exc).__name__})") from None
    text = "\n\n".join(p.strip() for p in pages if p.strip())
    if not text:
        raise _Unreadable("the PDF has no text (a scan?)")
    return text


def encode_image(data: bytes, max_edge: int, quality: int) -> Image:
    """The image upright, within `max_edge` on its longest side, as a JPEG `data:` URL, with
    its estimated prompt tokens."""
    from PIL import Image as Pillow
    from PIL import ImageOps, UnidentifiedImageError

    try:
        with Pillow.open(io.BytesIO(data)) as opened:
            if opened.width * opened.height > MAX_PIXELS:
                raise _Unreadable(f"the image is too large ({opened.width}x{opened.height})")
            picture = ImageOps.exif_transpose(opened)
            picture.thumbnail((max_edge, max_edge))
            if picture.mode != "RGB":
                # JPEG has no alpha: transparent parts become white, as most viewers show them.
                background = Pillow.new("RGB", picture.size, "white")
                background.paste(picture, mask=picture.convert("RGBA").getchannel("A"))
                picture = background
            out = io.BytesIO()
            picture.save(out, "JPEG", quality=quality)
    except (UnidentifiedImageError, OSError, ValueError, Pillow.DecompressionBombError) as exc:
        raise _Unreadable(f"it is not a readable image ({type(exc).__name__})") from None
    url = "data:image/jpeg;base64," + base64.b64encode(out.getvalue()).decode("ascii")
    return Image(url, image_tokens(picture.width, picture.height))


def image_tokens(width: int, height: int) -> int:
    """Prompt tokens an image of this size costs, by OpenAI's published rule for detail
    "high" (scaled to fit 2048 px, then its short side to 768 px; 170 per 512 px tile plus
    85). Other providers count differently but similarly; the history budget only needs an
    estimate."""
    scale = min(1.0, 2048 / max(width, height))
    w, h = width * scale, height * scale
    scale = min(1.0, 768 / min(w, h))
    w, h = w * scale, h * scale
    return 85 + 170 * math.ceil(w / 512) * math.ceil(h / 512)
