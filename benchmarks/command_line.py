"""What every benchmark does when run from the command line: warnings and errors logged to
the terminal, and at the very end, after its report, how long the whole run took."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator


@contextlib.contextmanager
def timed_run() -> Iterator[None]:
    """Around a benchmark's `main`: logging at WARNING, then "(finished in N s)" once done."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    started = time.monotonic()
    yield
    print(f"\n(finished in {time.monotonic() - started:.1f} s)")
