"""The console on a terminal: the line being typed is never written over.

The real `lastword run` runs on a pseudo-terminal (stdin and stdout on its slave side, stderr
on a pipe for the logs), and everything it writes is fed to a terminal emulator (pyte), so the
tests look at the screen the user would see, whatever escape sequences drew it. The emulator
answers the terminal's queries (the cursor position prompt_toolkit asks for) as a real
terminal does. Every chunk of output gives a frame, the screen as it stood then; the checks
that nothing ever collided run over all of them.
"""

from __future__ import annotations

import itertools
import os
import signal
import time
from pathlib import Path

import pytest

from tests.support.console import run_bot
from tests.support.terminal import Terminal

pytestmark = pytest.mark.timeout(60)

TYPING = "bot is typing…"
THINKING = "Thinking…"
DRAFT = "… "
# Slow enough that the draft is seen growing word by word and a line can be typed meanwhile.
SLOW_ECHO = {"LASTWORD_LLM__ECHO_WORD_MS": "300", "LASTWORD_LLM__ECHO_DELAY_MS": "300"}


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
