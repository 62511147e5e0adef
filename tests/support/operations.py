"""Running the `lastword` command line as an operator would, in a child process."""

from __future__ import annotations

import subprocess
import sys


def lastword(
    *args: str, env: dict[str, str], timeout: float = 20
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bot", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
