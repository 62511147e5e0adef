"""The suite's forked `lastword` processes (`tests.support.forked`) behave as `python -m bot`
would: their own process, their own environment, working directory and files, their exit status and
the signal that ended them as asyncio reports them; an interpreter set up otherwise is not
forked."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from tests.support.forked import Forked, spawn
from tests.support.running import clean_environ

pytestmark = pytest.mark.timeout(60)


async def test_a_forked_command_reads_its_own_folder_and_says_its_exit_status(
    short_dir: Path,
) -> None:
    # The folder it runs in has a `.env` with a wrong setting: read there, it is refused.
    (short_dir / ".env").write_text("LASTWORD_DEBOUNCE__QUIET_MS=later\n")
    env = clean_environ() | {"LASTWORD_DATA_DIR": str(short_dir / "data")}
    process = await spawn(
        "run",
        env=env,
        cwd=short_dir,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert isinstance(process, Forked)
    assert process.pid != os.getpid()
    out, err = await process.communicate()
    assert process.returncode == 2, err.decode()
    assert "LASTWORD_DEBOUNCE__QUIET_MS" in err.decode() and ".env" in err.decode()
    assert out == b""


async def test_a_wrong_setting_exits_2_and_says_so_on_stderr(short_dir: Path) -> None:
    env = clean_environ() | {"LASTWORD_DEBOUNCE__QUIET_MS": "soon"}
    process = await spawn(
        "doctor",
        env=env,
        cwd=short_dir,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await process.communicate()
    assert process.returncode == 2, out.decode()
    assert "LASTWORD_DEBOUNCE__QUIET_MS" in out.decode()


async def test_a_signal_ends_it_as_it_would_any_process(short_dir: Path) -> None:
    env = clean_environ() | {"LASTWORD_DATA_DIR": str(short_dir / "data")}
    # The console reads stdin: a pipe nobody writes to keeps it waiting.
    read, write = os.pipe()
    try:
        process = await spawn("run", env=env, cwd=short_dir, stdin=read, start_new_session=True)
        assert isinstance(process, Forked)
        assert os.getpgid(process.pid) == process.pid  # a session, and a group, of its own
        process.kill()
        assert await asyncio.wait_for(process.wait(), 20) == -signal.SIGKILL
    finally:
        os.close(read)
        os.close(write)


async def test_another_python_path_is_not_forked(short_dir: Path) -> None:
    env = clean_environ() | {"PYTHONPATH": str(short_dir)}
    process = await spawn("--help", env=env, cwd=short_dir, stdout=asyncio.subprocess.DEVNULL)
    assert not isinstance(process, Forked)
    assert await process.wait() == 0
