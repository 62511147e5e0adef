"""Running the `lastword` command line as an operator would, in a child process (forked from
the zygote where it can be: `tests.support.forked`)."""

from __future__ import annotations

import subprocess

from tests.support import forked


def lastword(
    *args: str, env: dict[str, str], timeout: float = 20
) -> subprocess.CompletedProcess[str]:
    return forked.run(*args, env=env, timeout=timeout)
