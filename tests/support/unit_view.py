"""Running `lastword doctor --unit` and `status --unit` as a unit's process would."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from tests.support.console import clean_env
from tests.support.forked import spawn

SCRIPT = str(Path(sys.executable).parent / "lastword")


async def lastword(*args: str, tmp: Path, **env: str) -> tuple[int, str, str]:
    """The installed script to completion (bounded), with the runner's LASTWORD_* replaced
    by `env` and TMPDIR at `tmp`, so what it leaves there can be seen."""
    process = await spawn(
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=clean_env(tmp / "data", TMPDIR=str(tmp), **env),
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=40)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()
