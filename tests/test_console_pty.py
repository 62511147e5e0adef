"""The console on a terminal: the line being typed is never written over.

The real `lastword run` runs on a pseudo-terminal (stdin and stdout on its slave side, stderr
on a pipe for the logs), and everything it writes is fed to a terminal emulator (pyte), so the
tests look at the screen the user would see, whatever escape sequences drew it. The emulator
answers the terminal's queries (the cursor position prompt_toolkit asks for) as a real
terminal does. Every chunk of output gives a frame, the screen as it stood then; the checks
that nothing ever collided run over all of them.
"""

from __future__ import annotations

import fcntl
import itertools
import os
import pty
import select
import signal
import struct
import subprocess
import termios
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pyte
import pytest

from tests.test_console import MODULE, Collected, clean_env, run_bot, server_pids

pytestmark = pytest.mark.timeout(60)

COLUMNS = 80
ROWS = 24
TYPING = "bot is typing…"
THINKING = "Thinking…"
DRAFT = "… "
# Slow enough that the draft is seen growing word by word and a line can be typed meanwhile.
SLOW_ECHO = {"LASTWORD_LLM__ECHO_WORD_MS": "300", "LASTWORD_LLM__ECHO_DELAY_MS": "300"}


@pytest.fixture
def data_dir(short_dir: Path) -> Iterator[Path]:
    path = short_dir / "data"
    yield path
    # A bot killed by a failing test takes its server down with it, though not at once.
    deadline = time.monotonic() + 5
    while server_pids(path) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server_pids(path) == [], "an embedded server outlived its test"


class _AnsweringScreen(pyte.Screen):
    """A screen that sends the terminal's answers (cursor position, status) back to the
    program, as a real terminal does."""

    def __init__(self, answer: Callable[[bytes], None]) -> None:
        super().__init__(COLUMNS, ROWS)
        self._answer = answer

    def write_process_input(self, data: str) -> None:
        self._answer(data.encode())


class Terminal(Collected):
    """A running `lastword run` whose stdin and stdout are a pseudo-terminal of ROWS x COLUMNS.
    A reader thread collects every byte the terminal receives, feeds it to the emulator and
    keeps each frame, so a test waits for what it wants with a deadline."""

    def __init__(self, data_dir: Path, **env: str) -> None:
        self._master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLUMNS, 0, 0))
        try:
            process = subprocess.Popen(
                MODULE,
                stdin=slave,
                stdout=slave,
                stderr=subprocess.PIPE,
                # COLUMNS and LINES would win over the terminal's own size.
                env={
                    k: v
                    for k, v in clean_env(data_dir, **env).items()
                    if k not in ("COLUMNS", "LINES")
                },
                cwd=data_dir.parent,
            )
        finally:
            # Only the bot holds the slave now: once it exits, reading the master ends.
            os.close(slave)
        self._closed = False
        self._hanging_up = threading.Event()
        self.output = b""
        self.frames: list[list[str]] = []
        self._screen = _AnsweringScreen(self.type)
        self._stream = pyte.ByteStream(self._screen)
        super().__init__(process)

    def _read_output(self) -> None:
        while not self._hanging_up.is_set():
            # Never blocked in a read for long: closing the terminal under a blocked read
            # would hang it up only once that read returned.
            if not select.select([self._master], [], [], 0.05)[0]:
                continue
            try:
                chunk = os.read(self._master, 4096)
            except OSError:  # EIO: every slave descriptor is closed
                return
            if not chunk:
                return
            with self._changed:
                self.output += chunk
                self._stream.feed(chunk)
                self.frames.append(self._lines())
                self._changed.notify_all()

    def _lines(self) -> list[str]:
        return [line.rstrip() for line in self._screen.display]

    def _received(self) -> object:
        return "\n".join(self._lines())

    def type(self, keys: bytes) -> None:
        os.write(self._master, keys)

    def shown(self) -> list[str]:
        """The screen's lines, without the blank ones at the bottom."""
        with self._changed:
            lines = self._lines()
        while lines and not lines[-1]:
            lines.pop()
        return lines

    def input_line(self) -> str:
        """The line the cursor is on: where the user types."""
        with self._changed:
            return self._lines()[self._screen.cursor.y]

    def wait_for(self, done: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
        self._wait_until(done, timeout, what)

    def wait_for_bytes(self, wanted: bytes, timeout: float = 10.0) -> bytes:
        """Everything received, once it contains `wanted`."""
        self._wait_until(lambda: wanted in self.output, timeout, repr(wanted))
        with self._changed:
            return self.output

    def wait_exit(self, timeout: float = 10.0) -> int:
        try:
            return self.process.wait(timeout)
        finally:
            self.kill()

    def close(self, timeout: float = 10.0) -> tuple[int, bytes]:
        """End of input (Ctrl-D), then the exit status and everything received."""
        self.type(b"\x04")
        return self.wait_exit(timeout), self.output

    def hang_up(self) -> None:
        """Close the terminal, as when its window is closed: the bot's reads and writes on
        it fail from now on."""
        self._hanging_up.set()
        output_reader = self._readers[0]  # stderr's ends only with the bot
        output_reader.join(5)
        self._closed = True
        os.close(self._master)

    def kill(self) -> None:
        """Kill the bot if it still runs, and let go of the terminal (once)."""
        super().kill()
        if self._closed:
            return
        self._closed = True
        self._join_readers()
        os.close(self._master)


def lines_with(frame: list[str], prefix: str) -> list[str]:
    return [line for line in frame if line.startswith(prefix)]


def test_a_line_typed_while_the_bot_drafts_stays_intact(data_dir: Path) -> None:
    typed = "I have a question about cats"
    first, second = "You said: hello", f"You said: {typed}"
    terminal = Terminal(data_dir, TERM="xterm-256color", **SLOW_ECHO)
    try:
        terminal.wait_for(lambda: terminal.input_line() == ">", "the prompt")
        terminal.type(b"hello\r")
        # The answer's first word in the draft: the bot is writing. Type, without Enter.
        terminal.wait_for(lambda: bool(lines_with(terminal.frames[-1], DRAFT)), "a draft")
        terminal.type(typed.encode())
        terminal.wait_for(lambda: terminal.input_line() == f"> {typed}", "the typed line")
        terminal.wait_for(lambda: f"bot> {first}" in terminal.shown(), "the first reply")
        # The reply went above the line being typed, which is still there, as typed, and the
        # status line is gone with the draft ("typing" lapses within seconds).
        terminal.wait_for(
            lambda: terminal.shown() == ["> hello", f"bot> {first}", f"> {typed}"],
            "the first reply above the typed line, and no status line",
        )
        assert terminal.input_line() == f"> {typed}"
        drafted = [frame for frame in terminal.frames if lines_with(frame, DRAFT)]
        # Enter sends it; Ctrl-D at once: the reply still owed comes before the exit.
        terminal.type(b"\r\x04")
        code = terminal.wait_exit(15)
    finally:
        terminal.kill()
    assert code == 0, terminal.stderr()
    assert terminal.shown() == ["> hello", f"bot> {first}", f"> {typed}", ">", f"bot> {second}"]

    # The draft grew word by word on screen before the first reply.
    shown: list[str] = []
    for frame in drafted:
        (line,) = lines_with(frame, DRAFT)
        text = line.removeprefix(DRAFT)
        if not shown or shown[-1] != text:
            shown.append(text)
    assert len(shown) >= 2, shown
    assert all(first.startswith(text) for text in shown), shown
    assert all(len(a) < len(b) for a, b in itertools.pairwise(shown)), shown

    # Never, in any frame, did a status share a line with anything else.
    replies = (first, second)
    for frame in terminal.frames:
        for line in frame:
            assert_not_collided(line, replies, ("hello", typed))


def assert_not_collided(line: str, replies: tuple[str, ...], typed: tuple[str, ...]) -> None:
    """`line` is one thing only: a status, a draft, a reply or an input line."""
    if TYPING in line or THINKING in line:
        assert line in (TYPING, THINKING), line
    elif line.startswith(DRAFT):
        assert any(reply.startswith(line.removeprefix(DRAFT)) for reply in replies), line
    elif line.startswith("bot> "):
        assert line.removeprefix("bot> ") in replies, line
    elif line.startswith(">"):
        assert any(text.startswith(line.removeprefix(">").lstrip()) for text in typed), line
    else:
        assert line == "", line


def test_the_draft_shows_thinking_then_the_reply_replaces_it(data_dir: Path) -> None:
    terminal = Terminal(data_dir, TERM="xterm-256color", **SLOW_ECHO)
    try:
        terminal.wait_for(lambda: terminal.input_line() == ">", "the prompt")
        terminal.type(b"hello\r")
        terminal.wait_for(lambda: THINKING in terminal.shown(), "Thinking…")
        # Above the (empty) input line, where the cursor waits.
        assert terminal.shown()[-2:] == [THINKING, ">"]
        terminal.wait_for(
            lambda: terminal.shown() == ["> hello", "bot> You said: hello", ">"], "the reply"
        )
        code, output = terminal.close()
    finally:
        terminal.kill()
    assert code == 0, terminal.stderr()
    # The status line is dimmed (SGR 2).
    assert b"\x1b[0;2m" + THINKING.encode() in output


def test_typing_is_shown_above_the_line_being_typed(data_dir: Path) -> None:
    # A long window: "typing" is all the bot shows until it closes.
    terminal = Terminal(
        data_dir,
        TERM="xterm-256color",
        LASTWORD_DEBOUNCE__QUIET_MS="3000",
        LASTWORD_DEBOUNCE__MAX_WAIT_MS="6000",
    )
    try:
        terminal.wait_for(lambda: terminal.input_line() == ">", "the prompt")
        terminal.type(b"hello\rmore")
        terminal.wait_for(lambda: terminal.shown()[-2:] == [TYPING, "> more"], "typing")
        terminal.type(b"\r\x04")
        code = terminal.wait_exit(15)
    finally:
        terminal.kill()
    assert code == 0, terminal.stderr()
    assert terminal.shown() == ["> hello", "> more", ">", "bot> You said: hello / more"]


# The window after each message is the floor (0.4 s): the platform reports typing. A signal
# holds the window 4 s, and the core counts one a second: typing holds it with room to spare.
# Between the two lines, 2.5 s: longer than the quiet window (1.5 s), so where keystrokes are
# not seen the first line gets a reply of its own; shorter than a signal's hold, so a signal
# sent where no key was pressed would hold the window over the pause.
TYPING_WINDOWS = {
    "LASTWORD_DEBOUNCE__QUIET_MS": "1500",
    "LASTWORD_DEBOUNCE__FLOOR_MS": "400",
    "LASTWORD_DEBOUNCE__TYPING_MS": "4000",
    "LASTWORD_DEBOUNCE__MAX_WAIT_MS": "10000",
}
# The user's pause between one key and the next while typing slowly.
KEY_GAP_S = 0.25
SECOND = "second line"


def two_lines(terminal: Terminal, typing_between: bool) -> None:
    """Enter "first line", then, 2.5 s later, the second line: typed slowly from the moment
    the first is entered, or all at once after that long a pause."""
    terminal.wait_for(lambda: terminal.input_line() == ">", "the prompt")
    pause_s = KEY_GAP_S * (len(SECOND) - 1)
    if typing_between:
        # The user goes on at once, a key at a time: each keystroke holds the window.
        terminal.type(b"first line\r" + SECOND[0].encode())
        for key in SECOND[1:]:
            time.sleep(KEY_GAP_S)
            terminal.type(key.encode())
    else:
        terminal.type(b"first line\r")
        time.sleep(pause_s)
        terminal.type(SECOND.encode())
    terminal.wait_for(lambda: terminal.input_line() == f"> {SECOND}", "the second line typed")
    terminal.type(b"\r")


def replies(lines: list[str]) -> list[str]:
    return [line.removeprefix("bot> ") for line in lines_with(lines, "bot> ")]


def session(data_dir: Path, typing_between: bool, last_reply: str) -> Terminal:
    """A run of the console in which the two lines are entered, ended once `last_reply` shows."""
    terminal = Terminal(data_dir, TERM="xterm-256color", **TYPING_WINDOWS)
    try:
        two_lines(terminal, typing_between)
        terminal.wait_for(lambda: f"bot> {last_reply}" in terminal.shown(), last_reply)
        code, _ = terminal.close()
    finally:
        terminal.kill()
    assert code == 0, terminal.stderr()
    return terminal


def test_keystrokes_hold_the_window_open_between_two_lines(data_dir: Path) -> None:
    both = "You said: first line / second line"
    terminal = session(data_dir, typing_between=True, last_reply=both)
    # One reply, covering both lines: 2.5 s of typing after a line whose window is 0.4 s.
    assert replies(terminal.shown()) == [both], terminal.shown()
    assert all(len(replies(frame)) <= 1 for frame in terminal.frames)


def test_without_keystrokes_between_two_lines_each_gets_a_reply(data_dir: Path) -> None:
    first, second = "You said: first line", f"You said: {SECOND}"
    terminal = session(data_dir, typing_between=False, last_reply=second)
    # The same gap between the lines, with no key pressed in it: the window after the first
    # closed, and neither the line entered nor its emptied prompt held it.
    assert replies(terminal.shown()) == [first, second], terminal.shown()


def test_ctrl_c_at_the_prompt_stops_the_bot_cleanly(data_dir: Path) -> None:
    terminal = Terminal(data_dir, TERM="xterm-256color")
    try:
        terminal.wait_for(lambda: terminal.input_line() == ">", "the prompt")
        terminal.type(b"half a line\x03")
        code = terminal.wait_exit()
    finally:
        terminal.kill()
    assert code == 0, terminal.stderr()
    assert "Traceback" not in terminal.stderr()
    assert "KeyboardInterrupt" not in terminal.stderr()


def test_sigterm_at_the_prompt_stops_the_bot_cleanly(data_dir: Path) -> None:
    terminal = Terminal(data_dir, TERM="xterm-256color")
    try:
        terminal.wait_for(lambda: terminal.input_line() == ">", "the prompt")
        terminal.type(b"half a line")
        terminal.wait_for(lambda: terminal.input_line() == "> half a line", "the typed text")
        os.kill(terminal.pid, signal.SIGTERM)
        code = terminal.wait_exit()
    finally:
        terminal.kill()
    assert code == 0, terminal.stderr()
    assert "Traceback" not in terminal.stderr()
    # The terminal is left as it was found: the cursor shown again and bracketed paste off
    # (prompt_toolkit's switches, the last it wrote), the typed text where it was.
    output = terminal.output
    assert output.rfind(b"\x1b[?25h") > output.rfind(b"\x1b[?25l")
    assert output.rfind(b"\x1b[?2004l") > output.rfind(b"\x1b[?2004h") >= 0
    assert terminal.shown() == ["> half a line"]


def test_a_terminal_closed_mid_reply_ends_the_run_and_the_reply_is_kept(data_dir: Path) -> None:
    terminal = Terminal(data_dir, TERM="xterm-256color", LASTWORD_LLM__ECHO_DELAY_MS="1000")
    try:
        terminal.wait_for(lambda: terminal.input_line() == ">", "the prompt")
        terminal.type(b"hello\r")
        terminal.wait_for(lambda: THINKING in terminal.shown(), "Thinking…")
        terminal.hang_up()
        code = terminal.wait_exit()
    finally:
        terminal.kill()
    assert code == 0, terminal.stderr()
    assert "stdout was closed" in terminal.stderr()
    assert "Traceback" not in terminal.stderr()
    # Nothing could be shown: the next run owes the reply and delivers it.
    code, lines, stderr = run_bot(data_dir, "")
    assert (code, lines) == (0, ["You said: hello"]), stderr
