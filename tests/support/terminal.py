"""A terminal emulator over a pseudo-terminal, for the console tests that read what a user
would see."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import termios
import threading
from collections.abc import Callable
from pathlib import Path

import pyte

from tests.support.console import Collected, clean_env
from tests.support.forked import popen

COLUMNS = 80
# How long a wait for what the terminal shows may take before the test fails: a bound on a
# hang, not a speed (a bot's start, a prompt, a reply): a loaded laptop took more than 10 s to
# show the first prompt. What a test claims of time it checks by events.
HANG_S = 30.0


ROWS = 24


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
            # `python -m bot run`, forked from the zygote (`tests.support.forked`).
            process = popen(
                "run",
                stdin=slave,
                stdout=slave,
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

    def wait_for(self, done: Callable[[], bool], what: str, timeout: float = HANG_S) -> None:
        self._wait_until(done, timeout, what)

    def wait_for_bytes(self, wanted: bytes, timeout: float = HANG_S) -> bytes:
        """Everything received, once it contains `wanted`."""
        self._wait_until(lambda: wanted in self.output, timeout, repr(wanted))
        with self._changed:
            return self.output

    def wait_exit(self, timeout: float = HANG_S) -> int:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            # Said with what the bot logged and showed, the only traces a hang leaves.
            self.kill()
            raise AssertionError(
                f"the bot did not exit within {timeout} s; its screen:\n"
                + "\n".join(self.shown())
                + f"\nits log:\n{self.stderr()}"
            ) from None
        finally:
            self.kill()

    def close(self, timeout: float = HANG_S) -> tuple[int, bytes]:
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
        os.close(self._master)
