"""A refused Telegram token at start: how long `lastword run` takes to say so and stop.

    python -m benchmarks.refused_token [--runs 5]

Each run is the installed `lastword run` (platform telegram, the embedded store in a
temporary directory) against the loopback fake of the Bot API answering 401 to every call.
It prints the exit status, the lines on stderr and the median time to exit: before issue 20
it never exited (a traceback per restart, after telling systemd it was ready).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.command_line import timed_run
from tests.support.fakes.telegram_server import FakeTelegram

SCRIPT = str(Path(sys.executable).parent / "lastword")


async def once(fake: FakeTelegram, state: Path) -> tuple[float, int, list[str]]:
    """One `lastword run`: seconds to exit, its exit status, its stderr lines."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("LASTWORD_")}
    env |= {
        "LASTWORD_PLATFORM": "telegram",
        "LASTWORD_TELEGRAM__TOKEN": fake.token,
        "LASTWORD_TELEGRAM__API_URL": fake.api_url,
        "XDG_STATE_HOME": str(state),
    }
    began = time.monotonic()
    process = await asyncio.create_subprocess_exec(
        SCRIPT, "run", stdin=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE, env=env
    )
    _, err = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode is not None
    return time.monotonic() - began, process.returncode, err.decode().splitlines()


async def measure(runs: int) -> None:
    with tempfile.TemporaryDirectory() as state:
        async with FakeTelegram() as fake:
            fake.refuse_token()
            results = [await once(fake, Path(state)) for _ in range(runs)]
    seconds = [result[0] for result in results]
    print("| runs | exit statuses | stderr lines | median s to exit | slowest s |")
    print("|---|---|---|---|---|")
    codes = sorted({result[1] for result in results})
    lines = sorted({len(result[2]) for result in results})
    print(
        f"| {runs} | {', '.join(map(str, codes))} | {', '.join(map(str, lines))} | "
        f"{statistics.median(seconds):.2f} | {max(seconds):.2f} |"
    )
    print("\n" + "\n".join(results[-1][2]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with timed_run():
        asyncio.run(measure(args.runs))


if __name__ == "__main__":
    main()
