"""`lastword run` on the console as a child process: its environment, the bot's pipes, the embedded
server's processes and store it leaves behind."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from redis import Redis

from bot.store import HistoryEntry, Keys
from bot.store.embedded import EmbeddedRedis
from tests.support.forked import ForkedPopen, popen

CONVERSATION = "console:local"


# Both ways of starting the bot: the module and the console script installed next to python.
MODULE = [sys.executable, "-m", "bot", "run"]


SCRIPT = [str(Path(sys.executable).parent / "lastword"), "run"]


FAST = {
    "LASTWORD_DEBOUNCE__QUIET_MS": "150",
    "LASTWORD_DEBOUNCE__MAX_WAIT_MS": "1000",
    "LASTWORD_LEASE__TTL_MS": "1500",
    "LASTWORD_SWEEP_INTERVAL_MS": "200",
    "LASTWORD_LLM__RETRIES": "1",
    "LASTWORD_LLM__RETRY_BASE_S": "0.01",
}


def clean_env(data_dir: Path | None, **extra: str) -> dict[str, str]:
    """The test runner's environment minus anything that configures lastword, plus fast
    timings and `data_dir` (None: the default, as a user who never set it has); `extra` wins
    over both."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("LASTWORD_") and name != "NOTIFY_SOCKET"
    }
    env.update(FAST)
    if data_dir is not None:
        env["LASTWORD_DATA_DIR"] = str(data_dir)
    env.update(extra)
    return env


class Collected:
    """A running process whose output reader threads collect, so a test waits for what it
    wants with a deadline instead of blocking on a read. A subclass reads its main output in
    `_read_output` (under `_changed`, notifying it) and says what it has so far in
    `_received`; stderr is collected here, line by line."""

    def __init__(self, process: subprocess.Popen[bytes] | ForkedPopen) -> None:
        """Start the readers: what `_read_output` fills must be set up before this."""
        self.process = process
        self._stderr: list[bytes] = []
        self._changed = threading.Condition()
        self._readers = [
            threading.Thread(target=self._read_output, daemon=True),
            threading.Thread(target=self._read_stderr, daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    def _read_output(self) -> None:
        raise NotImplementedError

    def _received(self) -> object:
        raise NotImplementedError

    def _read_stderr(self) -> None:
        assert self.process.stderr is not None
        for raw in iter(self.process.stderr.readline, b""):
            self._stderr.append(raw)

    def _join_readers(self) -> None:
        for reader in self._readers:
            reader.join(5)
        if not any(reader.is_alive() for reader in self._readers):
            # Read to the end: closed here, as the garbage collector would with a warning.
            for pipe in (self.process.stdin, self.process.stdout, self.process.stderr):
                if pipe is not None:
                    pipe.close()

    def _wait_until(self, done: Callable[[], bool], timeout: float, what: str) -> None:
        """Until `done()` (checked under `_changed`); fails the test after `timeout`."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not done():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        f"waited {timeout}s for {what}, got {self._received()!r}; "
                        f"stderr: {self.stderr()!r}"
                    )
                self._changed.wait(left)

    @property
    def pid(self) -> int:
        return self.process.pid

    def stderr(self) -> str:
        return b"".join(self._stderr).decode("utf-8", "replace")

    def kill(self) -> None:
        """Kill the process if it still runs, and close its pipes once they are read to the
        end (left to the garbage collector, they warn in whichever test runs next)."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._join_readers()


class Bot(Collected):
    """A running `lastword run` with its pipes; stdout is collected line by line."""

    def __init__(
        self,
        data_dir: Path,
        *,
        command: list[str] | None = None,
        env: Mapping[str, str] | None = None,
        new_session: bool = False,
        default_dir: bool = False,
        **more_env: str,
    ) -> None:
        """`default_dir`: LASTWORD_DATA_DIR left unset, `data_dir` only where the bot runs."""
        self.data_dir = data_dir
        self._lines: list[str] = []
        environ = clean_env(None if default_dir else data_dir, **{**(env or {}), **more_env})
        # Away from the repository: no ./.env or ./lastword.toml of the developer's; and its
        # own process group if asked, so a test can signal the group as a terminal does.
        where: dict[str, Any] = {"cwd": data_dir.parent, "start_new_session": new_session}
        if command is None:
            # `python -m bot run`, forked from the zygote (`tests.support.forked`).
            process: subprocess.Popen[bytes] | ForkedPopen = popen("run", env=environ, **where)
        else:
            process = subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=environ,
                **where,
            )
        super().__init__(process)

    def _read_output(self) -> None:
        assert self.process.stdout is not None
        for raw in iter(self.process.stdout.readline, b""):
            with self._changed:
                self._lines.append(raw.decode("utf-8", "replace").rstrip("\n"))
                self._changed.notify_all()

    def _received(self) -> object:
        return self._lines

    def write(self, data: str | bytes) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(data.encode() if isinstance(data, str) else data)
        self.process.stdin.flush()

    def close_stdin(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()

    def wait_lines(self, count: int, timeout: float = 10.0) -> list[str]:
        """At least `count` lines of stdout; fails the test if they do not come in time."""
        self._wait_until(lambda: len(self._lines) >= count, timeout, f"{count} lines")
        return self.lines()

    def wait(self, timeout: float = 10.0) -> int:
        """The exit status; the process is killed (and the test fails) if it hangs."""
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"lastword did not exit in {timeout}s: {self.stderr()!r}"
            ) from None
        self._join_readers()
        return code

    def lines(self) -> list[str]:
        with self._changed:
            return list(self._lines)


def run_bot(
    data_dir: Path, stdin: str | bytes, *, timeout: float = 10.0, **env: str
) -> tuple[int, list[str], str]:
    """Feed `stdin` then end of input; (exit status, stdout lines, stderr)."""
    bot = Bot(data_dir, env=env)
    try:
        bot.write(stdin)
        bot.close_stdin()
        code = bot.wait(timeout)
    finally:
        bot.kill()
    return code, bot.lines(), bot.stderr()


def server_pids(data_dir: Path) -> list[int]:
    """Processes working in `data_dir`: the embedded server of that directory (it chdirs to
    its `--dir`; its command line is no help, as the server rewrites its process title)."""
    wanted = data_dir.resolve()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cwd = (entry / "cwd").readlink()
        except OSError:
            continue
        if cwd == wanted:
            pids.append(int(entry.name))
    return pids


def assert_no_server(data_dir: Path, timeout: float = 0.0) -> None:
    """No embedded server is left for `data_dir` (after `timeout` at most)."""
    deadline = time.monotonic() + timeout
    while server_pids(data_dir) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server_pids(data_dir) == []
    assert not (data_dir / "redis.sock").exists()


def read_store(data_dir: Path) -> tuple[tuple[int, int], list[HistoryEntry], bool]:
    """Open the data directory the bot left behind with a fresh server (which replays the
    AOF) and read (V, W), the history and whether a lease is held."""
    server = EmbeddedRedis(data_dir)
    server.start()
    client = Redis(unix_socket_path=str(server.socket))
    try:
        keys = Keys(CONVERSATION)
        v, w = client.hmget(keys.state, ["v", "w"])
        history = [
            HistoryEntry.from_json(raw.decode() if isinstance(raw, bytes) else raw)
            for raw in client.lrange(keys.history, 0, -1)
        ]
        leased = bool(client.exists(keys.lease))
        return (int(v or 0), int(w or 0)), history, leased
    finally:
        client.close()
        server.stop()


def wait_ready(sock: socket.socket) -> None:
    """Block until the bot says READY=1 (fails after the socket's timeout)."""
    while True:
        if b"READY=1" in sock.recv(4096).split(b"\n"):
            return
