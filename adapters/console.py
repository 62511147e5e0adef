"""The console: a terminal chat with the bot, and a scriptable one over pipes.

Each line on stdin is one message; each reply goes to stdout. Typing several lines while the
bot is "thinking" shows the burst handling: one reply covers all of them. At end of input
(Ctrl-D) the replies still owed are delivered first, then `run` returns.

On a terminal (stdin and stdout both, and not a dumb one) the line being typed is edited with
prompt_toolkit, and nothing the bot shows ever lands on it: "bot is typing…" and the reply
as it is written (one dimmed line) are drawn above the "> " input line, and replies are
printed above it too, while the text being typed stays where it is, editable. After end of
input the draft is drawn in place on a line of its own, erased just before the reply. Piped
output gets only the replies; piped input with a terminal for output gets that same in-place
draft. A dumb terminal gets plain lines. On a terminal the keystrokes are the user typing
(`bot.message.SeesTyping`): while the next line is being typed, the window stays open.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import shutil
import signal
import sys
import threading
import time
import unicodedata
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

from adapters import Platform
from adapters.base import Identity, Sink, until_stored
from bot.cancel import cancel_and_wait
from bot.config.settings import Settings
from bot.message import InboundMessage, NoFiles, Place, Unavailable
from bot.ops.check import Check

if TYPE_CHECKING:
    from prompt_toolkit.buffer import Buffer
    from prompt_toolkit.formatted_text import StyleAndTextTuples

log = logging.getLogger(__name__)

CONVERSATION_CHAT = "local"

# A local terminal has no rate limit: ten redraws a second read as live, and the loop is not
# spent redrawing for every streamed token.
DRAFT_INTERVAL_S = 0.1
# Back to the start of the line and erase it, whatever was drawn there.
ERASE_LINE = "\r\033[2K"
DIM = "\033[2m"
NORMAL = "\033[0m"
DRAFT_PREFIX = "… "
THINKING = "Thinking…"
TYPING = "bot is typing…"
NEWLINE_MARK = " ⏎ "
PROMPT = "> "
REPLY_PREFIX = "bot> "
# How long "bot is typing…" stays without being repeated. The core repeats it every
# `typing_interval_s` until the reply, so it lapses only once the bot has stopped: one that
# lands just after the reply must not stay above the input line until the next message.
TYPING_SHOWN_S = 3.0
# Keystrokes are passed on as the user typing at most this often: the core counts one a
# second, and a key held down must not cost a store call per repeat.
KEYSTROKE_EVERY_S = 0.25
# Keystrokes waiting to be passed on, at most: one behind the line just entered and one before
# it, still not taken; more only while the store is slow, and those are dropped.
KEYSTROKES_QUEUED_CAP = 2


class ConsoleAdapter(NoFiles):
    platform = "console"
    max_message_chars = 100_000
    typing_interval_s = 1.0

    def __init__(self) -> None:
        self.interactive = _isatty(sys.stdin) and _isatty(sys.stdout)
        # Drafts and the input line are redrawn with escape sequences, which a dumb terminal
        # would print as is.
        drafts = _isatty(sys.stdout) and os.environ.get("TERM") != "dumb"
        self.draft_interval_s = DRAFT_INTERVAL_S if drafts else None
        self.screen = self.interactive and drafts
        # The input line while it is being typed (the terminal, until end of input).
        self._prompt: _Prompt | None = None
        # Whether a draft is on the current line, to be erased before anything else is shown.
        self._draft_shown = False
        # Message ids must never repeat across runs, or the persistent dedupe would drop them.
        self.run_id = uuid.uuid4().hex[:12]
        # Set when stdout is gone (the reader closed the pipe): nothing more can be shown.
        self._output_gone = asyncio.Event()
        # Where the user types and every line is said: the console has one conversation.
        self.place = Place(self.platform, CONVERSATION_CHAT, CONVERSATION_CHAT)
        self.conversation = self.place.conversation
        # Keystrokes waiting to be passed on, and when (monotonic) the last one was queued.
        self._keystrokes_queued = 0
        self._keystroke_at = 0.0

    def connected(self) -> bool:
        return not self._output_gone.is_set()

    def identity(self) -> Identity:
        """The console is this terminal: the start-up log says so, and how to talk to it."""
        return Identity("the console", "type in this terminal, each line a message")

    def sees_typing(self, place: Place) -> bool:
        # Keystrokes are seen at the prompt only: a pipe brings whole lines.
        return self.screen

    async def run(self, sink: Sink) -> None:
        if self.interactive:
            print("lastword console: type messages, Ctrl-D to finish.", file=sys.stderr)
        chatting = asyncio.create_task(self._chat(sink))
        gone = asyncio.create_task(self._output_gone.wait())
        try:
            await asyncio.wait({chatting, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            await cancel_and_wait(chatting, retry_s=0.1)
        if chatting.done() and not chatting.cancelled() and chatting.exception() is not None:
            raise chatting.exception()  # type: ignore[misc]
        if self._output_gone.is_set():
            log.warning(
                "stdout was closed: stopping; replies still owed are delivered by the next run"
            )

    async def _chat(self, sink: Sink) -> None:
        # Each line typed or piped in; the place, for a keystroke (in order: a keystroke passed
        # on before the line it came after would be taken for the typing of that line, and
        # hold nothing); None at end of input; what ended the prompt, if it failed, so that it
        # ends the chat too rather than leave it waiting for input.
        lines: asyncio.Queue[str | Place | Exception | None] = asyncio.Queue()
        # Lines are taken in apart from their ingestion: a slow store never stops the typing.
        reading = self._start_reading(lines.put_nowait)
        numbers = itertools.count(1)
        try:
            while True:
                text = await lines.get()
                if isinstance(text, Exception):
                    raise text
                if text is None:
                    break
                if isinstance(text, Place):
                    self._keystrokes_queued -= 1
                    # Best effort, bounded in time, never raises: one at a time.
                    await sink.user_typing(text)
                    continue
                if text.strip():
                    await self._ingest_until_stored(sink, text, next(numbers))
            await sink.settled(self.conversation)
        finally:
            if reading is not None:
                await cancel_and_wait(reading)

    def _start_reading(
        self, put: Callable[[str | Place | Exception | None], None]
    ) -> asyncio.Task[None] | None:
        """Start handing each line typed or piped in to `put` (on a terminal, the console's
        place for a keystroke too), then None at end of input; the task that reads, when
        there is one to stop."""
        if self.screen:
            self._prompt = _Prompt(lambda: self._keystroke(put))
            reading = asyncio.create_task(self._ask(self._prompt, put), name="console prompt")
            reading.add_done_callback(lambda task: _pass_on_failure(task, put))
            return reading
        loop = asyncio.get_running_loop()

        def put_raw(raw: bytes) -> None:
            # Invalid UTF-8 becomes U+FFFD here: the core only ever sees valid text.
            line = raw.decode("utf-8", "replace").rstrip("\r\n") if raw else None
            # After shutdown the loop is closed; input that arrives then is simply not read.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(put, line)

        # A daemon thread: a blocked read must never keep the process from exiting.
        threading.Thread(target=_read_lines, args=(put_raw,), name="stdin", daemon=True).start()
        return None

    def _keystroke(self, put: Callable[[Place], None]) -> None:
        """The user typed at the prompt: queue their typing behind the lines before it, unless
        one was queued less than KEYSTROKE_EVERY_S ago or the store is slow to take them."""
        now = time.monotonic()
        if (
            now - self._keystroke_at < KEYSTROKE_EVERY_S
            or self._keystrokes_queued >= KEYSTROKES_QUEUED_CAP
        ):
            return
        self._keystroke_at = now
        self._keystrokes_queued += 1
        put(self.place)

    async def _ask(self, prompt: _Prompt, put: Callable[[str | None], None]) -> None:
        """Read lines at the prompt until Ctrl-D; Ctrl-C stops the bot, as it does when the
        terminal turns it into SIGINT. A terminal that hangs up ends the run as a closed
        stdout does: nothing more can be shown there."""
        try:
            while True:
                try:
                    put(await prompt.ask())
                    # The first keystroke after a line is not held back by those before it:
                    # it is what tells the core that the user follows up rather than pauses.
                    self._keystroke_at = 0.0
                except EOFError:
                    break
                except KeyboardInterrupt:
                    # The prompt reads keys raw, so the terminal sends no SIGINT: send it here,
                    # for the same graceful stop (replies owed are handed back, not awaited).
                    signal.raise_signal(signal.SIGINT)
                    return
                except OSError:
                    _silence_stdout()
                    self._output_gone.set()
                    return
        finally:
            self._prompt = None
        put(None)

    async def _ingest_until_stored(self, sink: Sink, text: str, number: int) -> None:
        message = InboundMessage.at(self.place, f"{self.run_id}:{number}", text, display_name="you")
        # stdin cannot redeliver, so the line is held here until the store is back.
        await until_stored(lambda: sink.ingest(message), f"line {number}", first_s=0.1, cap_s=2.0)

    async def send(
        self, conversation: str, text: str, idempotency_key: str, reply_to: str | None = None
    ) -> None:
        if self._output_gone.is_set():
            # stdout now points at /dev/null: "sending" there would lose the reply.
            raise Unavailable("stdout is closed")
        if self.interactive:
            text = f"{REPLY_PREFIX}{text}"
        try:
            if self._prompt is not None:
                await self._prompt.print_above(text)
                return
            if self._draft_shown:
                # Its own write, flushed with the reply: the reply stays a line of its own.
                sys.stdout.write(ERASE_LINE)
                self._draft_shown = False
            _write_line(text)
        except OSError as exc:
            # A closed pipe (`lastword run | head -1`): retrying can never succeed. The reply
            # stays in the outbox, so the next run delivers it; this run ends.
            _silence_stdout()
            self._output_gone.set()
            raise Unavailable(f"stdout is closed: {exc}") from None

    async def typing(self, conversation: str) -> None:
        # Only above the input line: anywhere else it would land on what is being typed.
        if self._prompt is not None:
            self._prompt.show_typing()

    async def draft(self, conversation: str, draft_id: int, text: str) -> None:
        """Redraw the draft line with the reply so far; "" shows "Thinking…"."""
        if self._output_gone.is_set():
            raise Unavailable("stdout is closed")
        if self._prompt is not None:
            self._prompt.show_draft(text)
            return
        # Set first: a write that fails halfway may still have left part of a draft behind.
        self._draft_shown = True
        line = _draft_line(text, shutil.get_terminal_size().columns)
        # A failed write is left to the drafter (best effort); the next send decides whether
        # stdout is gone.
        _write(f"{ERASE_LINE}{DIM}{line}{NORMAL}")


class _Prompt:
    """The input line on a terminal, with what the bot is doing drawn above it.

    prompt_toolkit owns the lines it draws: each change of the status line is a redraw of
    both, and a reply is printed after erasing them, then they are drawn again below it, so
    the text being typed is never written over. Imported here, on a terminal only: the import
    costs a tenth of a second of start-up that pipes would waste.
    """

    def __init__(self, typed: Callable[[], None]) -> None:
        """`typed` is called for each edit that leaves text on the input line."""
        from prompt_toolkit import PromptSession
        from prompt_toolkit.styles import Style

        # The reply so far (None: no draft), and until when (monotonic) "typing" is shown.
        self._draft: str | None = None
        self._typing_until = 0.0
        self._session: PromptSession[str] = PromptSession(
            self._message,
            style=Style.from_dict({"status": "dim"}),
            # There is no completion menu to make room for: the terminal is not scrolled.
            reserve_space_for_menu=0,
        )
        self._typed = typed
        self._session.default_buffer.on_text_changed += self._edited

    async def ask(self) -> str:
        """One line as typed; raises EOFError on Ctrl-D and KeyboardInterrupt on Ctrl-C."""
        # Neither SIGINT nor the loop's exception handler is the prompt's to take over: the
        # bot's own handlers must stay in place while it reads.
        return await self._session.prompt_async(handle_sigint=False, set_exception_handler=False)

    def _edited(self, buffer: Buffer) -> None:
        # A line emptied (entered, or erased) is not being typed.
        if not buffer.text:
            return
        try:
            self._typed()
        except Exception:
            # Typing is best effort: the line being typed must never fail with it.
            log.exception("a keystroke was not passed on")

    def show_typing(self) -> None:
        self._typing_until = time.monotonic() + TYPING_SHOWN_S
        self._redraw()
        # A redraw once it has lapsed (a little after: timers may fire a hair early), so it
        # disappears unless repeated by then.
        asyncio.get_running_loop().call_later(TYPING_SHOWN_S + 0.05, self._redraw)

    def show_draft(self, text: str) -> None:
        self._draft = text
        self._redraw()

    async def print_above(self, line: str) -> None:
        """Print `line` above the input line, and take the status line away: the reply is
        there. Raises OSError if the terminal is gone."""
        from prompt_toolkit.application import run_in_terminal

        self._draft = None
        self._typing_until = 0.0
        await run_in_terminal(lambda: _write_line(line))

    def _redraw(self) -> None:
        self._session.app.invalidate()

    def _message(self) -> StyleAndTextTuples:
        """The prompt, below the status line if there is one. A line entered leaves no
        status line behind: the final drawing of the prompt, which stays on the terminal
        above the next one, is made once the prompt is done."""
        app = self._session.app
        status = None if app.is_done else self._status(app.output.get_size().columns)
        if status is None:
            return [("", PROMPT)]
        return [("class:status", status), ("", "\n" + PROMPT)]

    def _status(self, columns: int) -> str | None:
        if self._draft is not None:
            return _draft_line(self._draft, columns)
        if time.monotonic() < self._typing_until:
            return _tail(TYPING, columns - 1)
        return None


def _isatty(stream: object) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def _pass_on_failure(task: asyncio.Task[None], put: Callable[[Exception], None]) -> None:
    """Hand what failed `task` on to `put` (taking it from the task, which then logs no
    "exception never retrieved")."""
    failure = None if task.cancelled() else task.exception()
    if isinstance(failure, Exception):
        put(failure)


def _read_lines(put: Callable[[bytes], None]) -> None:
    """Hand each line of stdin to `put`, then b"" at end of input.

    Reads the file descriptor directly rather than `sys.stdin.buffer`: a daemon thread
    blocked inside the buffered reader holds its lock, and the interpreter aborts
    ("could not acquire lock ... at interpreter shutdown") when the process exits on SIGTERM
    while waiting for input.
    """
    try:
        fd = sys.stdin.fileno()
    except (AttributeError, ValueError, OSError):
        fd = -1  # no stdin at all: same as empty input
    partial: list[bytes] = []
    while fd >= 0:
        try:
            chunk = os.read(fd, 65536)
        except InterruptedError:
            continue
        except OSError:
            break
        if not chunk:
            break
        *complete, rest = chunk.split(b"\n")
        for piece in complete:
            partial.append(piece)
            put(b"".join(partial) + b"\n")
            partial = []
        if rest:
            partial.append(rest)
    if partial:
        put(b"".join(partial))
    put(b"")


def _write_line(text: str) -> None:
    """Print one reply."""
    _write(text + "\n")


def _write(text: str) -> None:
    """Write and flush; characters the terminal's encoding cannot show are replaced rather
    than failing the send (which would retry the same reply forever)."""
    stream = sys.stdout
    encoding = getattr(stream, "encoding", None) or "utf-8"
    stream.write(text.encode(encoding, "replace").decode(encoding))
    stream.flush()


def _draft_line(text: str, columns: int) -> str:
    """The draft as one line narrower than the terminal, so erasing one line erases all of
    it: newlines shown as ⏎, and only the end of a long draft (where it grows). The last
    column stays free, as filling it leaves some terminals about to wrap."""
    if not text:
        return _tail(THINKING, columns - 1)
    flat = NEWLINE_MARK.join(text.splitlines())
    # Tabs and escape sequences would move the cursor: the width would no longer hold.
    flat = "".join(" " if unicodedata.category(char) == "Cc" else char for char in flat)
    return DRAFT_PREFIX + _tail(flat, columns - 1 - _cells(DRAFT_PREFIX))


def _tail(text: str, room: int) -> str:
    """The longest end of `text` that takes at most `room` terminal columns."""
    used = 0
    for start in range(len(text) - 1, -1, -1):
        used += _char_cells(text[start])
        if used > room:
            end = start + 1
            # The marks of a character cut off go with it: left first, they would mark the
            # prefix instead.
            while end < len(text) and not _char_cells(text[end]):
                end += 1
            return text[end:]
    return text


def _cells(text: str) -> int:
    return sum(_char_cells(char) for char in text)


def _char_cells(char: str) -> int:
    """Terminal columns `char` takes: two when wide (East Asian, most emoji), none for
    combining marks and format characters."""
    if unicodedata.category(char) in ("Mn", "Me", "Cf"):
        return 0
    return 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1


def _silence_stdout() -> None:
    # Point stdout at /dev/null so the interpreter's final flush does not raise again.
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


async def check(settings: Settings, timeout_s: float) -> Check:
    """The console needs no token and no network: there is nothing to ask."""
    return Check("platform", True, "console: no token needed")


PLUGIN = Platform(create=lambda settings: ConsoleAdapter(), check=check)
