"""A third-party platform with settings of its own, installed from tests/plugins as pip would
leave it (its package and its dist-info): configured by `LASTWORD_ECHOCHAT__*` variables,
checked by `lastword doctor`, its token masked in the logs. Nothing in bot/ knows it.

Each test runs lastword in a process of its own with tests/plugins on its path: the settings
find the installed platforms when they are imported, as they would after a `pip install`.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

from bot.store.embedded import EmbeddedRedis
from tests.support.running import Running, run_env

PLUGINS = Path(__file__).resolve().parents[1] / "plugins"
TOKEN = "ec-SECRET-token-9f8e7d"


def plugin_env(server: EmbeddedRedis, data_dir: Path, **settings: str) -> dict[str, str]:
    """A `lastword` process's environment on the echochat platform, with these of its own
    settings (`room="lounge"` is `LASTWORD_ECHOCHAT__ROOM=lounge`)."""
    path = os.pathsep.join(filter(None, (str(PLUGINS), os.environ.get("PYTHONPATH"))))
    own = {f"LASTWORD_ECHOCHAT__{name.upper()}": value for name, value in settings.items()}
    return run_env("echochat", server.url, data_dir) | {"PYTHONPATH": path} | own


def doctor(env: dict[str, str]) -> tuple[int, str]:
    done = subprocess.run(
        [sys.executable, "-m", "bot", "doctor"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done.returncode, done.stdout + done.stderr


def test_doctor_shows_and_checks_the_plugins_own_settings(
    server: EmbeddedRedis, short_dir: Path
) -> None:
    _code, report = doctor(plugin_env(server, short_dir, token=TOKEN, room="lounge"))
    lines = report.splitlines()
    shown = f"✓ settings: platform echochat (token ***, room lounge), store {server.url}, "
    assert lines[0].startswith(shown), report
    platform = next(line for line in lines if line.startswith(("✓ platform", "✗ platform")))
    # The plug-in's check quotes its URL, token and all: doctor scrubs it.
    assert (
        platform
        == "✓ platform: echochat: room lounge at https://echochat.invalid/api/bot***/rooms/lounge"
    )
    assert TOKEN not in report


def test_the_plugins_settings_are_validated_and_their_names_checked(
    server: EmbeddedRedis, short_dir: Path
) -> None:
    code, report = doctor(plugin_env(server, short_dir))
    assert (code, report.strip()) == (
        2,
        "✗ settings: LASTWORD_ECHOCHAT__TOKEN is required when platform is echochat",
    )
    code, report = doctor(plugin_env(server, short_dir, token=TOKEN, room="Lounge 2"))
    assert code == 2
    assert report.startswith("✗ settings: LASTWORD_ECHOCHAT__ROOM: expected text matching")
    assert "given 'Lounge 2'" in report
    code, report = doctor(plugin_env(server, short_dir, token=TOKEN, rooom="lounge"))
    assert (code, report.strip()) == (
        2,
        "✗ settings: LASTWORD_ECHOCHAT__ROOOM: no such setting "
        "(did you mean LASTWORD_ECHOCHAT__ROOM?)",
    )


async def test_run_masks_the_plugins_token_in_its_logs(
    server: EmbeddedRedis, short_dir: Path
) -> None:
    bot = await Running.start(plugin_env(server, short_dir, token=TOKEN, room="lounge"))
    try:
        deadline = time.monotonic() + 30
        while not bot.said("echochat: connecting to"):
            assert bot.process.returncode is None, "".join(bot.log)
            assert time.monotonic() < deadline, "".join(bot.log)
            await asyncio.sleep(0.05)
    finally:
        await bot.stop()
    log = "".join(bot.log)
    assert "echochat: connecting to https://echochat.invalid/api/bot***/rooms/lounge" in log
    assert TOKEN not in log
