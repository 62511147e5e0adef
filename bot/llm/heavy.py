"""Reading a user's file off the event loop: PDF text and image encoding run in worker
processes of their own, a few per replica, each job under a hard time limit.

Why processes, not threads: a thread cannot be stopped, so a cancelled parse ran on for
minutes, and threads shared the default executor that DNS lookups need. A worker that overruns
its limit is killed (SIGKILL) and a fresh one takes its place. A worker may also die or overrun
for reasons that are not the file's (the OOM killer picked it, the host starved it of CPU), so
a job whose worker died or overran is tried once more in a fresh worker; if that fails too,
the file becomes a note that is not the reader's verdict (`ReaderUnavailable`), which the
caller does not remember. A worker that died while idle never costs a job a try. The
workers are started with `python -m bot.llm.heavy` (a clean interpreter, no inherited locks or
sockets), hold a memory limit (RLIMIT_AS), and each job also arms SIGALRM inside the worker,
so a job outlives a replica that died without killing it by a few seconds at most. A worker
reads jobs from its stdin; at end of file (the replica is gone) it exits.

The wire is length-prefixed frames: a JSON header, then the file's bytes; the worker says it
took the job (one JSON frame) before it starts on it, then answers (one more). JSON rather than
pickle: what comes back was made from a stranger's file.

The jobs themselves (`pdf_text`, `encode_image`) are plain functions, also called directly by
tests and benchmarks. They refuse what they cannot read by raising `Unreadable` with a reason
the model is shown, and open only what they are meant to: images in five formats (never
PostScript, which Pillow would hand to Ghostscript), PDFs without external decoders (no
jbig2dec) and with decompression capped.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import logging
import math
import os
import resource
import signal
import struct
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

log = logging.getLogger(__name__)

PDF_MAGIC = b"%PDF-"
# The only image formats decoded: what phones, browsers and screenshots produce. Pillow
# otherwise picks a decoder by content, and a PostScript file named x.png runs Ghostscript.
IMAGE_FORMATS = ("JPEG", "PNG", "WEBP", "GIF", "BMP")
# A JPEG is decoded at 1/2, 1/4 or 1/8 of its size when that is enough (`draft`), so its
# header may claim up to this many times the pixel limit.
JPEG_MOST_REDUCTION = 64
# EXIF orientation -> the transposition that turns the stored pixels upright (as Pillow's
# ImageOps.exif_transpose does, applied here after the image was scaled down).
ORIENTATIONS = {2: 0, 3: 3, 4: 1, 5: 5, 6: 4, 7: 6, 8: 2}
# Decompressed bytes one PDF stream may produce. Page text streams are kilobytes; a "stream"
# that inflates to tens of MB of operators is an attack on the parser's CPU time.
PDF_MAX_STREAM_BYTES = 20_000_000
# An answer from a worker larger than this is a broken worker (an image URL is ~1 MB at most).
MAX_ANSWER_BYTES = 64 * 1024 * 1024
# A worker that does not start (import) in this long is given up on.
START_TIMEOUT_S = 30.0
# Extra seconds the worker's own alarm allows past the parent's limit: the parent kills
# first; the alarm only matters when the parent is gone.
ALARM_SLACK_S = 5
# What a worker says once it has read a job whole, before it starts on it: a worker whose
# output ends before this died without seeing the file.
TOOK = {"took": True}
# The note for a file whose workers died on it.
DIED = "the reader failed on it (it may be too large)"
NONSENSE = "the file reader answered nonsense"
_FRAME = struct.Struct(">I")
# Put first on the workers' import path, so they run this very code whatever the replica's
# working directory.
PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent)


class Unreadable(Exception):
    """A file its bounds or its content keep from the model; the reason is shown to it."""


class ReaderUnavailable(Unreadable):
    """The reader came to no verdict on the file: no worker could be started, or both tries'
    workers died or overran on it, or answered nonsense. The file itself may be fine, so this
    is not remembered."""


class _Lost(Exception):
    """A try that came to no verdict: its worker died, overran or answered nonsense. The
    reason is the note the file gets if no try comes to one."""


class _Gone(_Lost):
    """The worker was dead before it took the job (killed while idle, reaped or not yet): it
    never saw the file, so an idle worker found so does not cost the job its try."""


# -- the jobs ---------------------------------------------------------------------------------


def pdf_text(data: bytes, enough: int | None = None) -> str:
    """The text of a PDF's pages, separated by a blank line; pages past the first `enough`
    characters are not read. An owner-password-only PDF (empty user password, how banks send
    statements) is opened; one that needs a password is refused as password-protected."""
    from pypdf import PdfReader, apply_configuration

    if not data.startswith(PDF_MAGIC):
        raise Unreadable("it is not a PDF")
    limits: dict[str, Any] = {
        "jbig2dec_binary": None,
        "zlib_maximum_output_length": PDF_MAX_STREAM_BYTES,
        "lzw_maximum_output_length": PDF_MAX_STREAM_BYTES,
        "run_length_maximum_output_length": PDF_MAX_STREAM_BYTES,
        "brotli_maximum_output_length": PDF_MAX_STREAM_BYTES,
        "jbig2_maximum_output_length": PDF_MAX_STREAM_BYTES,
        "array_based_stream_maximum_output_length": PDF_MAX_STREAM_BYTES,
        "image_maximum_buffer_size": PDF_MAX_STREAM_BYTES,
        "stream_decoding_work_maximum_length": 3 * PDF_MAX_STREAM_BYTES,
    }
    with apply_configuration(**limits):
        try:
            reader = PdfReader(io.BytesIO(data))
            if reader.is_encrypted:
                _unlock(reader)
            pages = _page_texts(reader, enough)
        except Unreadable:
            raise
        except RecursionError:
            raise Unreadable("the PDF is nested too deeply to read") from None
        except Exception as exc:
            # A stranger's file can make any part of a parser fail; the reason's type is
            # enough for the log and the model.
            raise Unreadable(f"the PDF is damaged ({type(exc).__name__})") from None
    text = "\n\n".join(p.strip() for p in pages if p.strip())
    if not text:
        raise Unreadable("the PDF has no text (a scan?)")
    return text


def _unlock(reader: Any) -> None:
    from pypdf import PasswordType
    from pypdf.errors import DependencyError

    try:
        opened = reader.decrypt("")
    except (DependencyError, NotImplementedError):
        raise Unreadable("it is encrypted in a way the bot cannot open") from None
    if opened == PasswordType.NOT_DECRYPTED:
        raise Unreadable("it is password-protected")


def _page_texts(reader: Any, enough: int | None) -> list[str]:
    pages: list[str] = []
    read = 0
    for page in reader.pages:
        pages.append(page.extract_text() or "")
        read += len(pages[-1])
        if enough is not None and read > enough:
            break
    return pages


def encode_image(data: bytes, max_edge: int, quality: int, max_pixels: int) -> dict[str, Any]:
    """The image upright, within `max_edge` on its longest side, as a JPEG `data:` URL:
    {"url", "width", "height"}. Scaled down before it is turned, and a JPEG decoded at a
    fraction of its size when that is enough, so the memory is that of the small image;
    one over `max_pixels` once decoded is refused before it is."""
    from PIL import Image as Pillow

    Pillow.MAX_IMAGE_PIXELS = max_pixels * JPEG_MOST_REDUCTION
    try:
        with Pillow.open(io.BytesIO(data), formats=IMAGE_FORMATS) as opened:
            if opened.format == "JPEG":
                opened.draft(None, (max_edge, max_edge))
            if opened.width * opened.height > max_pixels:
                raise Unreadable(f"the image is too large ({opened.width}x{opened.height})")
            opened.thumbnail((max_edge, max_edge))
            picture = _upright(opened)
            out = io.BytesIO()
            _flattened(picture).save(out, "JPEG", quality=quality)
    except Unreadable:
        raise
    except Exception as exc:
        # Pillow raises what its decoders raise: OSError, SyntaxError, ValueError,
        # NotImplementedError, struct.error, ...
        raise Unreadable(f"it is not a readable image ({type(exc).__name__})") from None
    url = "data:image/jpeg;base64," + base64.b64encode(out.getvalue()).decode("ascii")
    return {"url": url, "width": picture.width, "height": picture.height}


def _upright(picture: Any) -> Any:
    orientation = picture.getexif().get(0x0112)
    method = ORIENTATIONS.get(orientation) if isinstance(orientation, int) else None
    return picture if method is None else picture.transpose(method)


def _flattened(picture: Any) -> Any:
    """RGB, as JPEG holds: transparent parts become white, as most viewers show them."""
    from PIL import Image as Pillow

    if picture.mode == "RGB":
        return picture
    if picture.mode in ("RGBA", "LA", "PA") or "transparency" in picture.info:
        rgba = picture.convert("RGBA")
        background = Pillow.new("RGB", picture.size, "white")
        background.paste(rgba, mask=rgba.getchannel("A"))
        return background
    return picture.convert("RGB")


JOBS: dict[str, Callable[..., Any]] = {"pdf": pdf_text, "image": encode_image}


# -- the pool, in the replica -------------------------------------------------------------------


class _Worker:
    """One worker process and its pipes."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    @classmethod
    async def start(cls, memory_mb: int) -> _Worker:
        path = os.pathsep.join(p for p in (PACKAGE_ROOT, os.environ.get("PYTHONPATH")) if p)
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bot.llm.heavy",
            str(memory_mb),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=os.environ | {"PYTHONPATH": path},
        )
        worker = cls(process)
        try:
            async with asyncio.timeout(START_TIMEOUT_S):
                ready = await worker.receive()
        except BaseException:
            worker.kill()
            raise
        if ready != {"ready": True}:
            worker.kill()
            raise ReaderUnavailable("the file reader did not start")
        return worker

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.returncode is None

    async def hand(self, header: dict[str, Any], data: bytes) -> None:
        """Give the worker a job, and wait until it says it took it. Raises `_Gone` if it was
        dead before it did: its pipe broke, or its output ended first."""
        stdin = self.process.stdin
        assert stdin is not None
        body = json.dumps(header).encode()
        try:
            stdin.write(_FRAME.pack(len(body)) + body + _FRAME.pack(len(data)))
            stdin.write(data)
            await stdin.drain()
            took = await self.receive()
        except (asyncio.IncompleteReadError, ConnectionError):
            raise _Gone(DIED) from None
        if took != TOOK:
            raise _Lost(NONSENSE)

    async def receive(self) -> dict[str, Any]:
        """The worker's next frame; `asyncio.IncompleteReadError` if it died first."""
        stdout = self.process.stdout
        assert stdout is not None
        (size,) = _FRAME.unpack(await stdout.readexactly(_FRAME.size))
        if size > MAX_ANSWER_BYTES:
            raise _Lost(NONSENSE)
        try:
            answer = json.loads(await stdout.readexactly(size))
        except ValueError:
            raise _Lost(NONSENSE) from None
        if not isinstance(answer, dict):
            raise _Lost(NONSENSE)
        return answer

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()


class Workers:
    """A few worker processes for the heavy reading of files, shared by every conversation of
    the replica: at most `size` jobs at once (the rest wait their turn), each try killed at
    `timeout_s`. Workers start on first use and are kept for the next job."""

    def __init__(self, size: int, timeout_s: float, memory_mb: int) -> None:
        self.size = size
        self._slots = asyncio.Semaphore(size)
        self._idle: list[_Worker] = []
        # Killed workers being reaped, held so their wait is not collected mid-flight.
        self._reaping: set[asyncio.Task[int]] = set()
        self.configure(timeout_s, memory_mb)
        # Tries that ran into the time limit, workers that died (mid-job or idle), and workers
        # started: for logs and tests.
        self.overran = 0
        self.died = 0
        self.started = 0

    def configure(self, timeout_s: float, memory_mb: int) -> None:
        """Take on reloaded limits: the time limit from the next job, the memory limit from
        the next worker started. The number of workers needs a restart."""
        self.timeout_s = timeout_s
        self.memory_mb = memory_mb

    async def run(self, job: str, data: bytes, **params: Any) -> dict[str, Any]:
        """What `JOBS[job](data, **params)` returns, computed in a worker. Raises `Unreadable`
        with the job's reason (the reader's verdict), or `ReaderUnavailable` when the reader
        came to none: "it took too long to read", "the reader failed on it"."""
        header = {"job": job, "params": params, "alarm_s": self._alarm_s()}
        async with self._slots:
            try:
                answer = await self._first_try(header, data)
            except _Lost:
                # Logged where it happened. What stopped the worker (the OOM killer, a host
                # starved of CPU) may have nothing to do with the file.
                answer = await self._last_try(header, data)
        if "unreadable" in answer:
            raise Unreadable(str(answer["unreadable"]))
        result = answer.get("result")
        if not isinstance(result, (dict, str)):
            raise ReaderUnavailable(NONSENSE)
        return result if isinstance(result, dict) else {"text": result}

    async def close(self) -> None:
        """Stop every idle worker (a busy one is killed by its caller's cancellation)."""
        while self._idle:
            self._discard(self._idle.pop())
        await asyncio.gather(*self._reaping, return_exceptions=True)

    async def _first_try(self, header: dict[str, Any], data: bytes) -> dict[str, Any]:
        """The answer of an idle worker, else of a fresh one. An idle worker found dead (even
        one the loop has not reaped yet) never saw the file: it is replaced, and the job is
        handed on without spending its try."""
        while self._idle:
            worker = self._idle.pop()
            if not worker.alive():
                self._died(worker, "while idle")
                continue
            with contextlib.suppress(_Gone):
                return await self._ask(worker, header, data)
        return await self._ask(await self._start(), header, data)

    async def _last_try(self, header: dict[str, Any], data: bytes) -> dict[str, Any]:
        """The answer of a fresh worker, in place of the one lost on the job."""
        try:
            return await self._ask(await self._start(), header, data)
        except _Lost as lost:
            # No verdict on the file: its note stands for this burst only, and the next
            # burst that carries it reads it again.
            raise ReaderUnavailable(str(lost)) from None

    async def _ask(self, worker: _Worker, header: dict[str, Any], data: bytes) -> dict[str, Any]:
        """The worker's answer to the job; it goes back to the idle ones, unless it is
        exiting. Raises `_Lost` (`_Gone` when it was dead before it took the job), the
        worker discarded."""
        job = header["job"]
        try:
            async with asyncio.timeout(self.timeout_s):
                await worker.hand(header, data)
                log.debug("file reader %d took a %s job", worker.pid, job)
                answer = await worker.receive()
        except TimeoutError:
            self.overran += 1
            log.warning(
                "file reader %d took over %g s on a %s job: killed", worker.pid, self.timeout_s, job
            )
            self._discard(worker)
            raise _Lost(f"it took too long to read (over {self.timeout_s:g} s)") from None
        except _Gone:
            self._died(worker, f"before it took a {job} job")
            raise
        except _Lost:
            log.warning("file reader %d answered nonsense to a %s job", worker.pid, job)
            self._discard(worker)
            raise
        except (asyncio.IncompleteReadError, ConnectionError):
            # Its memory limit, its alarm, a crash in a decoder, or a kill from outside.
            self._died(worker, f"during a {job} job")
            raise _Lost(DIED) from None
        except BaseException:
            # Cancelled mid-job (shutdown): the worker's state is unknown, so it goes.
            self._discard(worker)
            raise
        if answer.get("exit"):
            # It ran out of memory and is exiting: no next job must find it half gone.
            self._discard(worker)
        else:
            self._idle.append(worker)
        return answer

    async def _start(self) -> _Worker:
        self.started += 1
        try:
            return await _Worker.start(self.memory_mb)
        except Exception as exc:
            # Whatever went wrong (no interpreter, a crash on import, garbage instead of
            # "ready"), the file itself is not to blame: this must not be remembered as its
            # verdict.
            log.error("could not start a file reader process: %r", exc)
            raise ReaderUnavailable("the file reader could not be started") from None

    def _alarm_s(self) -> int:
        return math.ceil(self.timeout_s) + ALARM_SLACK_S

    def _died(self, worker: _Worker, when: str) -> None:
        self.died += 1
        log.warning("file reader %d died %s", worker.pid, when)
        self._discard(worker)

    def _discard(self, worker: _Worker) -> None:
        worker.kill()
        reaped = asyncio.ensure_future(worker.process.wait())
        self._reaping.add(reaped)
        reaped.add_done_callback(self._reaping.discard)


# -- the worker process -------------------------------------------------------------------------


def _read_frame(source: IO[bytes]) -> bytes | None:
    head = source.read(_FRAME.size)
    if len(head) < _FRAME.size:
        return None
    (size,) = _FRAME.unpack(head)
    body = source.read(size)
    return body if len(body) == size else None


def _answer(job: str, data: bytes, params: dict[str, Any]) -> dict[str, Any]:
    try:
        return {"result": JOBS[job](data, **params)}
    except Unreadable as exc:
        return {"unreadable": str(exc)}
    except MemoryError:
        return {"unreadable": "it is too large to read", "exit": True}
    except Exception as exc:
        return {"unreadable": f"it could not be read ({type(exc).__name__})"}


def serve(memory_mb: int) -> None:
    """A worker's life: answer jobs from stdin until it closes."""
    # The answers go out on a private copy of stdout; anything a library prints goes to
    # stderr instead of into the frames.
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    limit = memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    # The parser's complaints about a stranger's malformed file are not the operator's news.
    logging.disable(logging.CRITICAL)
    warnings.simplefilter("ignore")
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    import PIL.Image
    import pypdf

    del PIL.Image, pypdf  # imported ahead, so the first job's clock does not pay for it
    _send(answers, {"ready": True})
    source = sys.stdin.buffer
    while (header := _read_frame(source)) is not None and (data := _read_frame(source)) is not None:
        request = json.loads(header)
        _send(answers, TOOK)
        signal.alarm(int(request["alarm_s"]))
        answer = _answer(str(request["job"]), data, dict(request["params"]))
        signal.alarm(0)
        _send(answers, answer)
        if answer.get("exit"):
            return


def _send(out: IO[bytes], answer: dict[str, Any]) -> None:
    body = json.dumps(answer).encode()
    out.write(_FRAME.pack(len(body)) + body)
    out.flush()


if __name__ == "__main__":
    serve(int(sys.argv[1]))
