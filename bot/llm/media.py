"""Photos, files and voice notes, folded into the one turn.

The store keeps only references (`Attachment`); the replica that answers fetches the bytes
through the platform (`Outbound.fetch`), inside its cycle and under its lease, so any replica
can answer and a newer message still interrupts. Each file becomes what the model can take:

- an image: scaled down to `max_edge_px`, turned upright and re-encoded as JPEG, then shown
  as a `data:` URL right after the text of its message (if the model can see images);
- a voice note or audio file: transcribed;
- a text file or a PDF: its text, cut at `max_document_chars` with a note;
- a sticker: its emoji; anything else (a video): its label, and the model is told it cannot
  open it.

Each file is read once: a newer message interrupts the cycle but not the reading of a file,
which the next cycle awaits (by file key) instead of starting again; what a voice note or a
document came to is cached by file key for the conversation's retention (the store's
transcript cache; a document's key is prefixed), an image in the replica for a while. PDF
text and image encoding run in worker processes (bot/llm/heavy.py), a few per replica, each try
killed at `work_timeout_s` and a job whose worker died or overran tried once more in a fresh
one: a hostile file costs at most twice that CPU per burst, and never the event loop. Only
the reader's own verdict is cached (its text, or the reason it gave for refusing the file):
a worker killed by the OOM killer or starved of CPU says nothing about the file, so that note
stands for its burst only and the next burst that carries the file reads it again.

A file that cannot be read (too large, corrupt, encrypted, too slow to read, gone, a failing
service, or an error nobody foresaw) never costs the text around it nor the reply: the model
is told "the user sent a file that could not be read (why)", and the log says which. Bounds:
bytes per file, files per burst, bytes per burst, pixels per image, and time per fetch, per
transcription and per file read.
"""

from __future__ import annotations

import asyncio
import fnmatch
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import PurePosixPath

from bot.blame import FILES, blames
from bot.config.settings import MediaSettings
from bot.llm.heavy import NONSENSE, ReaderUnavailable, Unreadable, Workers
from bot.llm.prompt import Image, Turn, used_of
from bot.llm.transcribe import Transcriber, TranscriptionFailed
from bot.loop_lag import watch
from bot.message import Attachment, FetchFailed, InboundMessage, Outbound
from bot.store import HistoryEntry, Store, StoreUnavailable

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
# The media cache shares the transcripts' keys (a file key each, the conversation's slot and
# retention); a document's entry is told apart by this prefix.
DOCUMENT_PREFIX = "doc:"
# Images kept in the replica for the cycle after an interrupt (each up to ~1 MB encoded).
IMAGES_KEPT = 16


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


@dataclass(frozen=True)
class _Outcome:
    """What one file came to: its text for the turn, its image, whether the model was shown
    what it is, and the bytes fetched for it (they count against the burst)."""

    piece: str
    image: Image | None
    seen: bool
    size: int = 0


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
        self.workers = Workers(settings.workers, settings.work_timeout_s, settings.worker_memory_mb)
        # Each file's reading (download, then the worker or the transcription), by
        # conversation and file key, while it runs: a cycle that a newer message interrupted
        # leaves it running (bounded by the fetch and work time limits), and the next cycle
        # awaits it instead of paying for it again.
        self._inflight: dict[tuple[str, str], asyncio.Task[_Outcome]] = {}
        # Every reading task, keyed or not, held so none is collected mid-flight.
        self._running: set[asyncio.Task[_Outcome]] = set()
        # Images read lately, for the cycle after an interrupt: an encoded image is up to a
        # megabyte, too much to keep in the store for the conversation's retention.
        self._images: OrderedDict[tuple[str, str], _Outcome] = OrderedDict()
        self.configure(settings, model, can_see=can_see)

    def configure(self, settings: MediaSettings, model: str, *, can_see: bool = True) -> None:
        """Take on reloaded settings. `can_see` is False for a model that cannot be shown
        images whatever the settings say (the offline echo)."""
        self.settings = settings
        self.workers.configure(settings.work_timeout_s, settings.worker_memory_mb)
        self.vision = can_see and (
            settings.vision == "on"
            or (
                settings.vision == "auto"
                and any(fnmatch.fnmatch(model.lower(), p.lower()) for p in settings.vision_models)
            )
        )

    async def close(self) -> None:
        """Stop the worker processes (they also exit on their own when the replica does)."""
        await self.workers.close()

    @blames(FILES)
    async def prepare(self, conversation: str, messages: Sequence[InboundMessage]) -> Prepared:
        """Each message's text with what its files said, and its images, in order. A file
        that cannot be read, for whatever reason, becomes a note: this never raises but for
        cancellation."""
        budget = _Budget(self.settings.max_files, self.settings.max_burst_bytes)
        timings = Timings()
        if any(m.attachments for m in messages):
            # A stall while files are read is logged with its figure (the loop's one watcher).
            watch()
        cached = await self._cached(conversation, messages)
        texts: list[str] = []
        images: list[tuple[Image, ...]] = []
        unseen = False
        for message in messages:
            pieces: list[str] = []
            shown: list[Image] = []
            for attachment in message.attachments:
                outcome = await self._read(conversation, attachment, budget, timings, cached)
                pieces.append(outcome.piece)
                if outcome.image is not None:
                    shown.append(outcome.image)
                unseen = unseen or not outcome.seen
            texts.append(message.text_with(pieces))
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

    @blames(FILES)
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
            turns.append(Turn(entry.role, text, used_of(entry.tools)))
        return turns

    async def _cached(
        self, conversation: str, messages: Sequence[InboundMessage]
    ) -> dict[str, str]:
        """What the cache holds for the burst's voice notes and documents, by cache key."""
        keys = [
            key
            for m in messages
            for a in m.attachments
            if (key := self._cache_key(a, _kind_of(a))) is not None
        ]
        if not keys:
            return {}
        try:
            found = await self.store.transcripts(conversation, keys)
        except StoreUnavailable as exc:
            log.warning("could not read the media cache of %s: %s", conversation, exc)
            return {}
        return {key: text for key, text in zip(keys, found, strict=True) if text is not None}

    def _cache_key(self, attachment: Attachment, kind: str) -> str | None:
        if not attachment.file_key:
            return None
        if kind == "audio" and self.transcriber is not None:
            return attachment.file_key
        if kind in ("pdf", "text"):
            return DOCUMENT_PREFIX + attachment.file_key
        return None

    async def _read(
        self,
        conversation: str,
        attachment: Attachment,
        budget: _Budget,
        timings: Timings,
        cached: dict[str, str],
    ) -> _Outcome:
        """What one file says, from the cache, from a reading already under way, or read now."""
        label = attachment.label()
        kind = _kind_of(attachment)
        if kind == "sticker":
            return _Outcome(label, None, bool(attachment.name))
        if kind == "other" or (kind == "image" and not self.vision):
            return _Outcome(label, None, False)
        if kind == "audio" and self.transcriber is None:
            return self._note(conversation, attachment, "no transcription service is configured")
        key = self._cache_key(attachment, kind)
        if key is not None and key in cached:
            timings.cached += 1
            return _from_cache(attachment, kind, cached[key])
        limit = min(self.settings.max_file_bytes, budget.bytes)
        try:
            self._spend(attachment, budget, limit)
        except Unreadable as exc:
            return self._note(conversation, attachment, str(exc))
        remembered = self._images.get((conversation, attachment.file_key))
        if kind == "image" and remembered is not None:
            outcome = remembered
        else:
            # Shielded: if a newer message interrupts this cycle, the reading still finishes
            # (within its time limits) and the next cycle takes its result.
            outcome = await asyncio.shield(
                self._reading(conversation, attachment, kind, limit, timings)
            )
        budget.bytes -= outcome.size
        return outcome

    def _spend(self, attachment: Attachment, budget: _Budget, limit: int) -> None:
        if budget.files <= 0:
            raise Unreadable(f"more than {self.settings.max_files} files came at once")
        budget.files -= 1
        if attachment.size > self.settings.max_file_bytes:
            raise Unreadable(
                f"it is {_mb(attachment.size)}, over the limit of "
                f"{_mb(self.settings.max_file_bytes)}"
            )
        if attachment.size > limit:
            raise Unreadable(
                f"the files sent together are over {_mb(self.settings.max_burst_bytes)}"
            )

    def _reading(
        self, conversation: str, attachment: Attachment, kind: str, limit: int, timings: Timings
    ) -> asyncio.Task[_Outcome]:
        """The task reading this file: the one under way for it, or a new one."""
        key = (conversation, attachment.file_key)
        if attachment.file_key and (running := self._inflight.get(key)) is not None:
            return running
        task = asyncio.ensure_future(self._work(conversation, attachment, kind, limit, timings))
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        if attachment.file_key:
            self._inflight[key] = task
            task.add_done_callback(lambda _: self._inflight.pop(key, None))
        return task

    async def _work(
        self, conversation: str, attachment: Attachment, kind: str, limit: int, timings: Timings
    ) -> _Outcome:
        """Download the file and read it. Every failure becomes a note: a file must never
        cost the text around it, nor the conversation its reply."""
        try:
            data = await self._fetch(attachment, limit, timings)
        except (FetchFailed, Unreadable) as exc:
            return self._note(conversation, attachment, str(exc))
        except Exception as exc:
            why = f"the download failed ({type(exc).__name__})"
            return self._note(conversation, attachment, why, exc)
        try:
            outcome = await self._use(conversation, attachment, kind, data, timings)
        except (TranscriptionFailed, Unreadable) as exc:
            # Not transcribed, or the reader came to no verdict (no worker, or its workers died
            # or overran twice): the next burst may succeed. The reader's own verdict, that the
            # content is unreadable, stays so, and is remembered.
            outcome = self._note(conversation, attachment, str(exc))
            if kind != "audio" and not isinstance(exc, ReaderUnavailable):
                await self._keep(conversation, attachment, kind, outcome)
        except Exception as exc:
            why = f"it could not be read ({type(exc).__name__})"
            return self._note(conversation, attachment, why, exc)
        return replace(outcome, size=len(data))

    async def _use(
        self, conversation: str, attachment: Attachment, kind: str, data: bytes, timings: Timings
    ) -> _Outcome:
        if kind == "audio":
            text = await self._transcript(conversation, attachment, data, timings)
            return _Outcome(_transcribed(attachment, text), None, True)
        if kind == "image":
            outcome = _Outcome(attachment.label(), await self._image(data, timings), True)
        else:
            outcome = _Outcome(await self._document(attachment, data, kind, timings), None, True)
        await self._keep(conversation, attachment, kind, outcome)
        return outcome

    async def _keep(
        self, conversation: str, attachment: Attachment, kind: str, outcome: _Outcome
    ) -> None:
        """Remember what a file came to: an image in this replica, a document's text (or why
        it could not be read) in the store, for the conversation's retention."""
        if not attachment.file_key:
            return
        if kind == "image":
            self._images[(conversation, attachment.file_key)] = outcome
            while len(self._images) > IMAGES_KEPT:
                self._images.popitem(last=False)
            return
        value = ("+" if outcome.seen else "-") + outcome.piece
        try:
            await self.store.keep_transcript(
                conversation, DOCUMENT_PREFIX + attachment.file_key, value
            )
        except StoreUnavailable as exc:
            log.warning("could not cache a document for %s: %s", conversation, exc)

    def _note(
        self,
        conversation: str,
        attachment: Attachment,
        why: str,
        unexpected: Exception | None = None,
    ) -> _Outcome:
        """The note the model gets for a file it cannot be shown, and the log line."""
        what = (attachment.kind, attachment.name or attachment.mime or "no name", conversation)
        if unexpected is None:
            log.warning("could not read a %s (%s) from %s: %s", *what, why)
        else:
            log.error("could not read a %s (%s) from %s: %s", *what, why, exc_info=unexpected)
        return _Outcome(_failed(attachment, why), None, False)

    async def _fetch(self, attachment: Attachment, limit: int, timings: Timings) -> bytes:
        began = time.monotonic()
        try:
            async with asyncio.timeout(self.settings.fetch_timeout_s):
                data = await self.outbound.fetch(attachment, limit)
        except TimeoutError:
            raise Unreadable(
                f"the download took over {self.settings.fetch_timeout_s:g} s"
            ) from None
        finally:
            timings.download_s += time.monotonic() - began
        if len(data) > limit:
            raise Unreadable(f"it is over the limit of {_mb(limit)}")
        return data

    async def _image(self, data: bytes, timings: Timings) -> Image:
        began = time.monotonic()
        try:
            encoded = await self.workers.run(
                "image",
                data,
                max_edge=self.settings.max_edge_px,
                quality=self.settings.jpeg_quality,
                max_pixels=self.settings.max_image_pixels,
            )
        finally:
            timings.encoding_s += time.monotonic() - began
        url, width, height = encoded.get("url"), encoded.get("width"), encoded.get("height")
        if not (isinstance(url, str) and isinstance(width, int) and isinstance(height, int)):
            raise ReaderUnavailable(NONSENSE)
        return Image(url, image_tokens(width, height))

    async def _transcript(
        self, conversation: str, attachment: Attachment, data: bytes, timings: Timings
    ) -> str:
        assert self.transcriber is not None
        began = time.monotonic()
        try:
            async with asyncio.timeout(self.settings.transcription_timeout_s):
                text = await self.transcriber.transcribe(data, attachment.name, attachment.mime)
        except TimeoutError:
            raise TranscriptionFailed(
                f"the transcription took over {self.settings.transcription_timeout_s:g} s"
            ) from None
        finally:
            timings.transcription_s += time.monotonic() - began
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
                read = await self.workers.run("pdf", data, enough=self.settings.max_document_chars)
                text = read.get("text")
                if not isinstance(text, str):
                    raise ReaderUnavailable(NONSENSE)
            else:
                text = decode_text(data)
        finally:
            timings.encoding_s += time.monotonic() - began
        name = attachment.name or attachment.kind
        text = _cut(text, self.settings.max_document_chars, name)
        return f"{attachment.label()}\n{text}\n[end of {name}]\n"


def _from_cache(attachment: Attachment, kind: str, text: str) -> _Outcome:
    if kind == "audio":
        return _Outcome(_transcribed(attachment, text), None, True)
    return _Outcome(text[1:], None, text.startswith("+"))


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
        raise Unreadable("it is not a text file")
    return data.decode("utf-8-sig", "replace")


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
