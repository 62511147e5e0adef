"""The line that ends the process reaches the journal as an error.

Under systemd, stderr is the journal: systemd sets `$JOURNAL_STREAM` to its device and
inode, and a line that starts with `<N>` is filed at priority N (sd-daemon(3)). Every line
that ends `lastword` (a configuration error, exit 2, a platform's refused token among them;
a start-up error, exit 1; an unexpected error, exit 1, after its traceback) starts with `<3>`
there, so `journalctl -p err`, which the README recommends, shows why the unit stopped; and
every other line it writes carries its own priority. Elsewhere the lines are as a person at a
terminal reads them.

Each test runs `lastword` (forked from the suite's zygote, `tests.support.forked`) with its
stderr a file, `$JOURNAL_STREAM` naming that file as systemd would name its stream.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.support.fakes.loopback import free_port
from tests.support.fakes.telegram_server import FakeTelegram
from tests.support.forked import spawn
from tests.support.running import clean_environ

pytestmark = pytest.mark.timeout(120)

ERROR = "<3>"
# A line of the journal: its priority first.
PRIORITY_FIRST = tuple(f"<{n}>" for n in range(8))


def environment(work: Path, **settings: str) -> dict[str, str]:
    """A clean environment (no lastword or OpenAI settings, no notify socket) with the data
    directory in `work`, and `settings` (`LASTWORD_` prefixed names)."""
    env = {
        k: v
        for k, v in clean_environ().items()
        if not k.startswith("OPENAI_") and k != "NOTIFY_SOCKET"
    }
    env["XDG_STATE_HOME"] = str(work / "state")
    env["LASTWORD_DATA_DIR"] = str(work / "data")
    return env | settings


async def lastword(
    work: Path, *args: str, env: dict[str, str], journal: bool = True
) -> tuple[int, list[str]]:
    """Run `lastword *args` to its end with its stderr a file that `$JOURNAL_STREAM` names
    (or, with `journal` false, names not): its exit status and the lines of its stderr."""
    stderr = work / "stderr"
    with stderr.open("wb") as file:
        found = os.fstat(file.fileno())
        stream = f"{found.st_dev}:{found.st_ino}" if journal else "0:0"
        process = await spawn(
            *args,
            env=env | {"JOURNAL_STREAM": stream},
            cwd=work,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=file,
        )
        try:
            code = await asyncio.wait_for(process.wait(), 60)
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
    return code, stderr.read_text().splitlines()


def assert_ends_at_error_priority(lines: list[str], start: str) -> None:
    """The last line is the one that ends the process, at error priority; every line has a
    priority of its own."""
    assert lines, "nothing was written"
    assert all(line.startswith(PRIORITY_FIRST) for line in lines), lines
    assert lines[-1].startswith(ERROR + "lastword: " + start), lines
    assert sum(line.startswith(ERROR + "lastword: ") for line in lines) == 1, lines


@pytest.mark.parametrize("command", ["run", "status", "migrate-shards"])
async def test_a_configuration_error_is_one_line_at_error_priority(
    command: str, short_dir: Path
) -> None:
    env = environment(short_dir, LASTWORD_LLM__MODLE="gpt-4o")
    line = (
        "lastword: configuration error: LASTWORD_LLM__MODLE: no such setting "
        "(did you mean LASTWORD_LLM__MODEL?)"
    )
    code, lines = await lastword(short_dir, command, env=env)
    assert (code, lines) == (2, [ERROR + line])
    # Not the journal (a terminal, a redirection): the line as a person reads it.
    code, lines = await lastword(short_dir, command, env=env, journal=False)
    assert (code, lines) == (2, [line])


async def test_under_the_shipped_units_the_line_is_logfmt_as_the_rest(short_dir: Path) -> None:
    # The units set LASTWORD_LOG_FORMAT=logfmt: the line that ends the process has the shape
    # of every other line, whether the settings loaded or not.
    logfmt = {"LASTWORD_LOG_FORMAT": "logfmt", "LASTWORD_REPLICA_ID": "r7"}
    env = environment(short_dir, LASTWORD_LLM__MODLE="gpt-4o", **logfmt)
    code, lines = await lastword(short_dir, "run", env=env)
    assert code == 2, lines
    [line] = lines
    assert line.startswith(ERROR + "ts=") and " level=error logger=lastword " in line, line
    assert 'msg="configuration error: LASTWORD_LLM__MODLE: no such setting' in line, line

    url = f"redis://127.0.0.1:{free_port()}/0"
    env = environment(short_dir, LASTWORD_REDIS_URL=url, **logfmt)
    code, lines = await lastword(short_dir, "run", env=env)
    assert code == 1, lines
    assert all(line.startswith(PRIORITY_FIRST) and " level=" in line for line in lines), lines
    assert lines[-1].startswith(ERROR) and " replica=r7 " in lines[-1], lines
    assert f'msg="cannot reach Redis at LASTWORD_REDIS_URL={url}: ' in lines[-1], lines


@pytest.fixture
async def telegram() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram() as fake:
        yield fake


async def test_a_refused_token_ends_run_at_error_priority(
    short_dir: Path, telegram: FakeTelegram
) -> None:
    telegram.refuse_token()
    env = environment(
        short_dir,
        LASTWORD_PLATFORM="telegram",
        LASTWORD_TELEGRAM__TOKEN=telegram.token,
        LASTWORD_TELEGRAM__API_URL=telegram.api_url,
        LASTWORD_LOG_LEVEL="DEBUG",
    )
    code, lines = await lastword(short_dir, "run", env=env)
    assert code == 2, lines
    assert_ends_at_error_priority(lines, "configuration error: LASTWORD_TELEGRAM__TOKEN: ")
    assert not any(telegram.token in line for line in lines), lines
    assert [call.method for call in telegram.calls] == ["getMe"]


async def test_a_start_up_error_ends_run_at_error_priority(short_dir: Path) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    env = environment(short_dir, LASTWORD_REDIS_URL=url, LASTWORD_LOG_LEVEL="INFO")
    code, lines = await lastword(short_dir, "run", env=env)
    assert code == 1, lines
    assert_ends_at_error_priority(lines, f"cannot reach Redis at LASTWORD_REDIS_URL={url}: ")
    code, lines = await lastword(short_dir, "status", env=env)
    assert code == 1, lines
    assert_ends_at_error_priority(lines, "cannot read the status from Redis at ")


async def test_status_without_a_running_bot_ends_at_error_priority(short_dir: Path) -> None:
    code, lines = await lastword(short_dir, "status", env=environment(short_dir))
    assert code == 1, lines
    assert_ends_at_error_priority(lines, "no bot is running with its embedded store in ")


# A platform plug-in with a bug: making its adapter fails, saying the LLM's key.
CRASHING_PLUGIN = """
from adapters import Platform
from bot.ops.check import Check


def create(settings):
    raise RuntimeError("no adapter today, key " + settings.llm.api_key.get_secret_value())


async def check(settings, timeout_s):
    return Check("platform", True, "crashing")


PLUGIN = Platform(create=create, check=check)
"""


def install_crashing_plugin(folder: Path) -> None:
    """`crashing`, a platform in the `lastword.adapters` group, installed in `folder` as pip
    would leave it (for `PYTHONPATH`)."""
    (folder / "lastword_crashing").mkdir(parents=True)
    (folder / "lastword_crashing" / "__init__.py").write_text(CRASHING_PLUGIN)
    info = folder / "lastword_crashing-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: lastword-crashing\nVersion: 0.1.0\n"
    )
    (info / "entry_points.txt").write_text(
        "[lastword.adapters]\ncrashing = lastword_crashing:PLUGIN\n"
    )


async def test_an_unexpected_error_is_logged_masked_then_ends_run_at_error_priority(
    short_dir: Path,
) -> None:
    """Python's own traceback would be many lines with no priority and no mask."""
    install_crashing_plugin(short_dir / "plugins")
    key = "sk-crash-4f1b-DO-NOT-LOG"
    env = environment(
        short_dir,
        PYTHONPATH=os.pathsep.join(
            filter(None, [str(short_dir / "plugins"), os.environ.get("PYTHONPATH")])
        ),
        LASTWORD_PLATFORM="crashing",
        LASTWORD_LLM__API_KEY=key,
        LASTWORD_LLM__BASE_URL=f"http://127.0.0.1:{free_port()}/v1",
    )
    code, lines = await lastword(short_dir, "run", env=env)
    assert code == 1, lines
    assert_ends_at_error_priority(
        lines, "stopped by an unexpected error: RuntimeError: no adapter today, key ***"
    )
    # The traceback, logged: critical, every line of it.
    traceback = [line for line in lines if line.startswith("<2>")]
    assert any("Traceback (most recent call last)" in line for line in traceback), lines
    assert any("lastword_crashing" in line for line in traceback), lines
    assert not any(key in line for line in lines), lines
