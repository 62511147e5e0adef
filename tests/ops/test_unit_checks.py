"""`lastword doctor --unit` fails a unit that would not work as a service, though every
setting in it is valid: one that would run the console (nothing it reads sets the platform),
and a replica of the template with no shared Redis. And `lastword status` says one thing
about which replica holds which role.

The CLI runs as the installed script, a process of its own; the shipped units are read under
a temporary root, as `systemctl --root` would; the store is the test's real server, Telegram
the loopback fake.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bot.store import Store
from bot.store.embedded import EmbeddedRedis
from tests.support import forked
from tests.support.console import clean_env
from tests.support.fakes.telegram_server import FakeTelegram

pytestmark = pytest.mark.timeout(90)

PROJECT = Path(__file__).resolve().parents[2]
TOKEN = "777000222:SECRET-unit-check-Zx9"
CONSOLE = (
    "✗ unit: lastword.service would run the console platform, which needs a terminal: "
    "nothing it reads sets LASTWORD_PLATFORM"
)
CONSOLE_FIX = (
    "    fix: set LASTWORD_PLATFORM in /etc/lastword/lastword.env to one of: discord, telegram"
)
NO_REDIS = (
    "✗ unit: lastword@1.service is one replica of lastword@.service, but nothing it reads sets "
    "LASTWORD_REDIS_URL: each replica would keep a store of its own"
)


@pytest.fixture
async def telegram() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(TOKEN, bot_username="checked_bot") as fake:
        yield fake


def lastword(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """`lastword` to completion (bounded, forked from the zygote), its environment clean but
    for `env` (the data directory left to the unit's StateDirectory)."""
    return forked.run(*args, env=clean_env(None, **env), cwd=cwd, timeout=60)


async def alastword(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """`lastword`, awaited: the test's fakes answer it meanwhile, on this loop."""
    return await asyncio.to_thread(lastword, *args, cwd=cwd, **env)


def test_the_unedited_example_env_fails_as_a_console_unit(root: Path, short_dir: Path) -> None:
    shutil.copy(PROJECT / "config/example.env", root / "etc/lastword/lastword.env")
    result = lastword("doctor", "--unit", "lastword", "--root", str(root), cwd=short_dir)
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[:2] == [CONSOLE, CONSOLE_FIX]
    # Said once: a failed check, not a warning on stderr besides.
    assert [line for line in lines if line.startswith("✗")] == [CONSOLE]
    assert "warning:" not in result.stderr
    assert result.stderr.startswith("reading lastword.service as systemd would: ")


async def test_a_replica_without_a_shared_redis_fails(
    root: Path, short_dir: Path, telegram: FakeTelegram, server: EmbeddedRedis
) -> None:
    env_file = root / "etc/lastword/lastword.env"
    settings = (
        "LASTWORD_PLATFORM=telegram\n"
        f"LASTWORD_TELEGRAM__TOKEN={TOKEN}\n"
        f"LASTWORD_TELEGRAM__API_URL={telegram.api_url}\n"
    )
    env_file.write_text(settings)
    # The shell's store is not the unit's: the unit's files give none.
    result = await alastword(
        "doctor", "--unit", "lastword@1", "--root", str(root), cwd=short_dir,
        LASTWORD_REDIS_URL=server.url,
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    failed = [line for line in result.stdout.splitlines() if line.startswith("✗")]
    assert len(failed) == 1 and failed[0].startswith(NO_REDIS), result.stdout
    assert "    fix: set LASTWORD_REDIS_URL in /etc/lastword/lastword.env" in result.stdout
    assert "@checked_bot" in result.stdout
    # The single-process unit keeps its embedded store, as it should.
    single = await alastword("doctor", "--unit", "lastword", "--root", str(root), cwd=short_dir)
    assert single.returncode == 0, single.stdout + single.stderr
    assert "✗" not in single.stdout
    # Shared, the replica passes.
    env_file.write_text(settings + f"LASTWORD_REDIS_URL={server.url}\n")
    shared = await alastword("doctor", "--unit", "lastword@1", "--root", str(root), cwd=short_dir)
    assert shared.returncode == 0, shared.stdout + shared.stderr
    assert "✗" not in shared.stdout


def test_status_of_such_a_unit_warns_of_both(root: Path, short_dir: Path) -> None:
    shutil.copy(PROJECT / "config/example.env", root / "etc/lastword/lastword.env")
    store = EmbeddedRedis(root / "var/lib/lastword-2")
    store.start()
    try:
        result = lastword("status", "--unit", "lastword@2", "--root", str(root), cwd=short_dir)
    finally:
        store.stop()
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 2, result.stderr
    assert "would run the console platform" in warnings[0]
    assert "nothing it reads sets LASTWORD_REDIS_URL" in warnings[1]


async def test_status_names_a_replicas_roles_once(
    store: Store, server: EmbeddedRedis, short_dir: Path
) -> None:
    # The replica's last beat was written before it took the role (its list: "-").
    await store.beat("r9", {"platform": "telegram", "cycles": 0, "roles": "-"}, ttl_ms=30_000)
    assert await store.claim_role("telegram:poller", "r9/abcd", 30_000) == 1
    result = lastword("status", cwd=short_dir, LASTWORD_REDIS_URL=server.url)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    header = lines[lines.index("replicas (1)") + 1]
    row = lines[lines.index("replicas (1)") + 2]
    assert row.split()[0] == "r9"
    # The column as aligned under its header.
    assert row[header.index("ROLES") : header.index("INFO")].strip() == "telegram:poller"
    assert "roles=" not in result.stdout
    as_json = lastword("status", "--json", cwd=short_dir, LASTWORD_REDIS_URL=server.url)
    [replica] = json.loads(as_json.stdout)["replicas"]
    assert "roles" not in replica["info"]
    [role] = json.loads(as_json.stdout)["roles"]
    assert (role["name"], role["holder"]) == ("telegram:poller", "r9")
