"""The README's install section, followed as a new admin would, with a token that Telegram
refuses: the check it tells them to run and the unit's own start both end in a line that
names the fix, and the unit never reports itself ready.

The machine is a temporary root (`--root`, as `systemctl --root` reads one); the steps are
those of docs/operating.md, read from it, so a page that drifts from what works fails here. The
env file is config/example.env edited as the admin would (the lines it names uncommented and
filled in); Telegram is the loopback fake, answering 401 to every call.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bot.ops import unit
from bot.store.embedded import EmbeddedRedis
from tests.support.console import clean_env
from tests.support.fakes.telegram_server import FakeTelegram

pytestmark = pytest.mark.timeout(90)

PROJECT = Path(__file__).resolve().parents[2]
SCRIPT = str(Path(sys.executable).parent / "lastword")
# What the admin pasted: shaped like a token, but not this bot's (one digit off).
WRONG_TOKEN = "123456789:AAFakeTelegramTokenForTests0123456788"


def install_steps() -> list[str]:
    """The commands of the "Install the units" block of docs/operating.md, one per line."""
    page = (PROJECT / "docs/operating.md").read_text()
    section = page.split("## Install the units\n", 1)[1]
    block = section.split("```sh", 1)[1].split("```", 1)[0]
    return [line.split("#", 1)[0].strip() for line in block.strip().splitlines()]


@pytest.fixture
async def telegram() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(bot_username="walkthrough_bot") as fake:
        fake.refuse_token()
        yield fake


def follow(steps: list[str], root: Path, edits: dict[str, str], added: dict[str, str]) -> None:
    """Carry out the file steps under `root`: the env file copied from config/ and edited
    (each `edits` setting, which the file names, uncommented and filled in; each `added`
    one, which it leaves to docs/settings.md, appended), the units copied."""
    for step in steps:
        if "config/example.env" in step:
            target = root / step.split()[-1].lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(PROJECT / "config/example.env", target)
            target.chmod(0o600)
            text = target.read_text()
            for name, value in edits.items():
                line = re.compile(rf"^(# )?{name}=.*$", re.MULTILINE)
                assert line.search(text), f"example.env has no line for {name} to edit"
                text = line.sub(f"{name}={value}", text, count=1)
            target.write_text(text + "".join(f"{name}={value}\n" for name, value in added.items()))
        elif step.startswith("sudo cp systemd/"):
            *units, folder = step.split()[2:]
            for name in units:
                shutil.copy(PROJECT / name, root / folder.lstrip("/"))
        elif step.startswith("sudo mkdir"):
            for folder in step.split()[3:]:
                (root / folder.lstrip("/")).mkdir(parents=True, exist_ok=True)


async def lastword(*args: str, tmp: Path, env: dict[str, str]) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        SCRIPT,
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_the_install_steps_with_a_refused_token_end_in_one_line_naming_the_fix(
    telegram: FakeTelegram, server: EmbeddedRedis, short_dir: Path
) -> None:
    steps = install_steps()
    doctor = next(step for step in steps if " doctor" in step)
    assert doctor.endswith("lastword doctor --unit lastword"), doctor
    root = short_dir / "root"
    # What every machine with systemd has already.
    (root / "etc/systemd/system").mkdir(parents=True)
    follow(
        steps,
        root,
        {
            "LASTWORD_PLATFORM": "telegram",
            "LASTWORD_TELEGRAM__TOKEN": WRONG_TOKEN,
            "LASTWORD_REDIS_URL": server.url,
        },
        # Not an admin's choice: the test's own, to reach the fake instead of Telegram.
        {"LASTWORD_TELEGRAM__API_URL": telegram.api_url},
    )
    shell = clean_env(short_dir / "shell-data")

    # The check the README says to run before starting the unit.
    code, out, err = await lastword(
        "doctor", "--unit", "lastword", "--root", str(root), tmp=short_dir, env=shell
    )
    assert err.startswith("reading lastword.service as systemd would:"), err
    assert code == 1, out
    platform = out.splitlines().index(
        next(line for line in out.splitlines() if line.startswith("✗ platform:"))
    )
    assert "Telegram refused LASTWORD_TELEGRAM__TOKEN" in out.splitlines()[platform]
    assert "@BotFather" in out.splitlines()[platform + 1]
    assert WRONG_TOKEN.split(":")[1] not in out + err

    # Started anyway: the unit's process, with what systemd gives it, and its notify socket.
    view = unit.build_view(unit.from_files(root, "lastword"), root, [])
    notify_path = short_dir / "notify"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify:
        notify.bind(str(notify_path))
        notify.setblocking(False)
        env = {k: v for k, v in shell.items() if not k.startswith("LASTWORD_")}
        env |= view.environment | {"NOTIFY_SOCKET": str(notify_path)}
        code, out, err = await lastword("run", tmp=short_dir, env=env)
        said = []
        while True:
            try:
                said.append(notify.recv(4096).decode())
            except BlockingIOError:
                break
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    # In the journal's shape, as every line the unit writes (LASTWORD_LOG_FORMAT=logfmt).
    assert " level=error logger=lastword " in lines[0], lines[0]
    assert (
        'msg="configuration error: LASTWORD_TELEGRAM__TOKEN: Telegram refused the bot token'
        in lines[0]
    ), lines[0]
    assert "@BotFather" in lines[0]
    assert not any("READY=1" in message for message in said), said
