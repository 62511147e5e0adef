"""A process that stands in for a module forked from the test's zygote (`tests.support.forked`).

Run as `python -m tests.support.zygote_child <zygote socket> <module> [args...]` by whoever
starts a program itself and expects a process of its own: lastword starting an MCP server
over stdio. It asks the zygote to fork `python -m <module> args` with this process's standard
files, environment and working directory, then stays as the child's stand-in: a signal sent
to it (or to its process group) is passed on, and it exits as the child did, by the same
signal if one ended it. Its own start imports the standard library only (through
`tests.support.forked`, about 0.1 s), none of the child's libraries, which the zygote has
already: the test MCP server, started some sixty times in a run, would otherwise spend
about 1.2 s of CPU importing the `mcp` SDK each time.

If the zygote cannot be reached, it becomes `python -m <module>` itself (exec).

What it cannot stand in for: a child that outlives a SIGKILL sent to the stand-in (the child
is the zygote's, in another session) while it still has its stdin open. The fake MCP server
ends when its stdin does; one told to linger (`LW_LINGER`) is started as itself.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys

from tests.support import forked


def main(address: str, module: str, *argv: str) -> None:
    try:
        connection, pid = _fork(address, module, argv)
    except (OSError, ValueError, TimeoutError):
        # No zygote (or a child that could not start): as itself, which says why.
        os.execv(sys.executable, [sys.executable, "-m", module, *argv])
    # The child has the standard files now: this process keeps none of them open, so their
    # ends (EOF on stdin, on stdout) are the child's alone.
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(signum, lambda number, _: _pass_on(pid, number))
    said = b""
    while not said.endswith(b"\n"):
        chunk = connection.recv(64)
        if not chunk:
            break  # the zygote itself was killed, and the child with it
        said += chunk
    words = said.split()
    code = int(words[1]) if words[:1] == [b"exit"] else -signal.SIGKILL
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code)


def _fork(address: str, module: str, argv: tuple[str, ...]) -> tuple[socket.socket, int]:
    """Ask the zygote for the child: the connection its exit status comes on, and its pid."""
    connection, pid = forked.ask(address, forked.request(module, argv, os.environ), [0, 1, 2])
    connection.setblocking(True)
    return connection, pid


def _pass_on(pid: int, number: int) -> None:
    # Once it has exited there is no one to tell: its status is on its way.
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, number)


if __name__ == "__main__":
    main(*sys.argv[1:])
