"""What every benchmark does when run from the command line: warnings and errors logged to
the terminal, and at the very end, after its report, how long the whole run took; and how a
benchmark's worker processes are reaped."""

from __future__ import annotations

import contextlib
import logging
import subprocess
import time
from collections.abc import Iterator


@contextlib.contextmanager
def timed_run() -> Iterator[None]:
    """Around a benchmark's `main`: logging at WARNING, then "(finished in N s)" once done."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    started = time.monotonic()
    yield
    print(f"\n(finished in {time.monotonic() - started:.1f} s)")


def reap(process: subprocess.Popen[str], timeout_s: float) -> None:
    """Wait for a worker process to end (killed past `timeout_s`), then close its pipes,
    which the garbage collector would otherwise close with a ResourceWarning."""
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    for pipe in (process.stdin, process.stdout, process.stderr):
        if pipe is not None:
            pipe.close()
