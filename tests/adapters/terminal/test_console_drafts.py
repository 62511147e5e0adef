"""The console's live draft: the line it is drawn on, and where it is not drawn at all. Piped
output never carries a draft or an escape sequence, nor does a dumb terminal. How it looks on
a real terminal, above the line being typed, is tests/adapters/terminal/test_console_pty.py's.
"""

from __future__ import annotations

import unicodedata
from pathlib import Path

import pytest

from adapters.console import _cells, _draft_line
from tests.support.console import run_bot
from tests.support.terminal import Terminal

pytestmark = pytest.mark.timeout(60)

ERASE_LINE = b"\r\x1b[2K"
DIM = b"\x1b[2m"
NORMAL = b"\x1b[0m"
THINKING = "Thinking…".encode()
COLUMNS = 80


def test_after_end_of_input_the_draft_is_drawn_in_place_then_erased(data_dir: Path) -> None:
    # Enter and Ctrl-D at once: the reply is owed, and drafted, once the prompt is gone.
    terminal = Terminal(
        data_dir,
        TERM="xterm-256color",
        LASTWORD_DEBOUNCE__QUIET_MS="500",
        LASTWORD_LLM__ECHO_DELAY_MS="300",
    )
    try:
        terminal.wait_for(lambda: terminal.input_line() == ">", "the prompt")
        terminal.type(b"hello\r\x04")
        code = terminal.wait_exit(15)
    finally:
        terminal.kill()
    assert code == 0, terminal.stderr()
    reply = b"bot> You said: hello\r\n"
    before, _, _ = terminal.output.partition(reply)
    # The first draft says the bot is thinking, drawn over a freshly erased line, dimmed...
    draft = before.index(ERASE_LINE + DIM + THINKING)
    assert draft == before.index(ERASE_LINE + DIM)
    # ...and the draft line is erased right before the reply, which is in normal style.
    assert before.endswith(ERASE_LINE)
    assert before.rfind(NORMAL) > before.rfind(DIM)
    assert terminal.output.count(reply) == 1
    assert terminal.shown() == ["> hello", ">", "bot> You said: hello"]


def test_a_dumb_terminal_gets_no_drafts(data_dir: Path) -> None:
    terminal = Terminal(data_dir, TERM="dumb")
    try:
        terminal.type(b"hello\r")
        terminal.wait_for_bytes(b"bot> You said: hello\r\n")
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
