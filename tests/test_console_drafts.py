"""The console's live draft: on a terminal the reply is shown as it is written, on one line
that is erased before the reply; piped output never carries a draft or an escape sequence.

The terminal tests run the real `lastword run` on a pseudo-terminal (stdin and stdout on its
slave side, stderr on a pipe for the logs) and read what the terminal received.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import termios
import unicodedata
from collections.abc import Iterator
from pathlib import Path

import pytest

from adapters.console import _cells, _draft_line
from tests.test_console import MODULE, Collected, clean_env, run_bot, server_pids

pytestmark = pytest.mark.timeout(60)

ERASE_LINE = b"\r\x1b[2K"
DIM = b"\x1b[2m"
NORMAL = b"\x1b[0m"
THINKING = "Thinking…".encode()
COLUMNS = 80


@pytest.fixture
def data_dir(short_dir: Path) -> Iterator[Path]:
    path = short_dir / "data"
    yield path
    assert server_pids(path) == [], "an embedded server outlived its test"


class Terminal(Collected):
    """A running `lastword run` whose stdin and stdout are a pseudo-terminal; a reader thread
    collects every byte the terminal receives, so a test waits with a deadline."""

    def __init__(self, data_dir: Path, **env: str) -> None:
        self._master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, COLUMNS, 0, 0))
        try:
            process = subprocess.Popen(
                MODULE,
                stdin=slave,
                stdout=slave,
                stderr=subprocess.PIPE,
                # COLUMNS would win over the terminal's own width.
                env={k: v for k, v in clean_env(data_dir, **env).items() if k != "COLUMNS"},
                cwd=data_dir.parent,
            )
        finally:
            # Only the bot holds the slave now: once it exits, reading the master ends.
            os.close(slave)
        self._closed = False
        self._output = b""
        super().__init__(process)

    def _read_output(self) -> None:
        while True:
            try:
                chunk = os.read(self._master, 4096)
            except OSError:  # EIO: every slave descriptor is closed
                return
            if not chunk:
                return
            with self._changed:
                self._output += chunk
                self._changed.notify_all()

    def _received(self) -> object:
        return self._output

    def type(self, keys: bytes) -> None:
        os.write(self._master, keys)

    def wait_for(self, wanted: bytes, timeout: float = 10.0) -> bytes:
        """Everything received, once it contains `wanted`; fails the test if it does not come."""
        self._wait_until(lambda: wanted in self._output, timeout, repr(wanted))
        with self._changed:
            return self._output

    def close(self, timeout: float = 10.0) -> tuple[int, bytes]:
        """End of input (Ctrl-D), then the exit status and everything received."""
        self.type(b"\x04")
        try:
            code = self.process.wait(timeout)
        finally:
            self.kill()
        return code, self._output

    def kill(self) -> None:
        """Kill the bot if it still runs, and let go of the terminal (once)."""
        super().kill()
        if self._closed:
            return
        self._closed = True
        self._join_readers()
        os.close(self._master)


def screen(raw: bytes) -> list[str]:
    """The lines a terminal shows after `raw`, for output that only moves the cursor to the
    start of a line or down and erases whole lines (any other escape fails the test)."""
    rows: list[list[str]] = [[]]
    column = 0
    for token in re.split(r"(\x1b\[[0-9;]*[A-Za-z]|\r|\n)", raw.decode()):
        if token == "\r":
            column = 0
        elif token == "\n":
            rows.append([])
        elif token == "\x1b[2K":
            rows[-1] = []
        elif token.startswith("\x1b["):
            assert token.endswith("m"), f"unexpected escape sequence {token!r}"
        else:
            row = rows[-1]
            row.extend(" " * (column + len(token) - len(row)))
            row[column : column + len(token)] = token
            column += len(token)
    lines = ["".join(row).rstrip() for row in rows]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def test_the_draft_is_shown_then_erased_before_the_reply(data_dir: Path) -> None:
    # No settings: the echo model answers at once, and still the draft shows first.
    terminal = Terminal(data_dir, TERM="xterm-256color")
    try:
        terminal.type(b"hello\r")
        reply = b"bot> You said: hello\r\n"
        before, _, _ = terminal.wait_for(reply).partition(reply)
        code, output = terminal.close()
    finally:
        terminal.kill()
    assert code == 0, output
    # The first draft says the bot is thinking, drawn over a freshly erased line, dimmed.
    assert ERASE_LINE + DIM in before, output
    assert before.index(ERASE_LINE + DIM) == before.index(ERASE_LINE + DIM + THINKING)
    # The draft line is erased right before the reply, which is printed in normal style.
    assert before.endswith(ERASE_LINE)
    assert before.rfind(NORMAL) > before.rfind(DIM)
    assert output.count(reply) == 1
    # What stays on the terminal: what was typed, and the reply; no draft beside it.
    assert screen(output) == ["hello", "bot> You said: hello"]


def test_a_dumb_terminal_gets_no_drafts(data_dir: Path) -> None:
    terminal = Terminal(data_dir, TERM="dumb")
    try:
        terminal.type(b"hello\r")
        terminal.wait_for(b"bot> You said: hello\r\n")
        code, output = terminal.close()
    finally:
        terminal.kill()
    assert code == 0, output
    assert output == b"hello\r\nbot> You said: hello\r\n"


def test_piped_output_has_no_draft_and_no_escape_sequence(data_dir: Path) -> None:
    # A slow answer: on a terminal this would surely be drafted.
    code, lines, stderr = run_bot(data_dir, "hello\n", LASTWORD_LLM__ECHO_DELAY_MS="500")
    assert code == 0, stderr
    assert lines == ["You said: hello"]
    assert "\x1b" not in stderr


def test_the_draft_line_shows_thinking_until_there_is_text() -> None:
    assert _draft_line("", COLUMNS) == "Thinking…"


def test_the_draft_line_marks_newlines_and_blanks_control_characters() -> None:
    assert _draft_line("one\ntwo\r\nthree", COLUMNS) == "… one ⏎ two ⏎ three"
    assert _draft_line("\x1b[31mred\tx", COLUMNS) == "…  [31mred x"


@pytest.mark.parametrize(
    "text",
    ["word " * 50, "日本語のテキスト" * 10, "e\u0301" * 100, "👍" * 60],
    ids=["ascii", "wide", "combining", "emoji"],
)
def test_a_long_draft_shows_its_end_within_the_width(text: str) -> None:
    line = _draft_line(text, 40)
    shown = line.removeprefix("… ")
    assert line.startswith("… ")
    assert text.rstrip().endswith(shown.rstrip())
    # Cut before a character, not between it and its accent.
    assert unicodedata.category(shown[0]) != "Mn"
    # One column short of the width: the line never wraps, so erasing one line erases it.
    assert 38 <= _cells(line) <= 39
