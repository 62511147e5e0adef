"""`lastword doctor --unit --root` against unit files written to do harm: it reads them as
systemd does (a line systemd ignores is ignored, with a note) and writes nothing but its own
private folder, which is gone when it ends, however it ends.

Each test runs the installed script as a subprocess against the shipped units under a
temporary root, with a drop-in of the test's own, the store at the test's real server and
TMPDIR at a fresh folder, the credentials folder's parent: afterwards it must be empty (no
credential written beside the folder, no folder left behind). A file planted beside the root
stands for a host file: whatever a unit says, its content never reaches doctor's output.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bot.store.embedded import EmbeddedRedis
from tests.support.console import clean_env
from tests.support.unit_view import SCRIPT, lastword
from tests.support.waits import eventually

pytestmark = pytest.mark.timeout(60)

CONSOLE_UNIT = "✗ unit: lastword.service would run the console platform"
PLANTED = "HOST-ONLY-3b7f"


@dataclass
class Host:
    """The machine around the root: the root, TMPDIR for doctor, and a folder beside the root
    that holds a planted file (`planted`, PLANTED as its content)."""

    root: Path
    tmp: Path
    outside: Path

    @property
    def planted(self) -> Path:
        return self.outside / "planted"

    def dropin(self, lines: str) -> None:
        """The test's own drop-in for lastword.service: these `[Service]` lines."""
        folder = self.root / "etc/systemd/system/lastword.service.d"
        folder.mkdir(exist_ok=True)
        (folder / "hostile.conf").write_text(f"[Service]\n{lines}\n")

    def env(self, text: str, name: str = "lastword.env") -> None:
        """A file under /etc/lastword (the shipped unit reads lastword.env, if present)."""
        path = self.root / "etc/lastword" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    def link(self, path: str, target: str) -> None:
        """A symlink at `path` under the root."""
        where = self.root / path.lstrip("/")
        where.parent.mkdir(parents=True, exist_ok=True)
        where.symlink_to(target)

    async def doctor(self) -> tuple[int, str, str]:
        """`lastword doctor --unit lastword --root ROOT` to completion, then what no unit may
        do to the host: leave anything in TMPDIR, show the planted file, crash."""
        code, out, err = await lastword(
            "doctor", "--unit", "lastword", "--root", str(self.root), tmp=self.tmp
        )
        assert sorted(self.tmp.iterdir()) == [], err
        assert sorted(self.outside.iterdir()) == [self.planted]
        assert PLANTED not in out + err
        assert "Traceback" not in err, err
        # The shipped unit with this env runs the console, which doctor fails (its ✗ line and
        # fix come first, exit 1) once the settings load: these tests are about everything
        # else it says.
        lines = out.splitlines()
        if not lines or not lines[0].startswith(CONSOLE_UNIT):
            return code, out, err
        assert lines[1].lstrip().startswith("fix:"), out
        assert code == 1, out + err
        rest = lines[2:]
        return (1 if any(line.startswith("✗") for line in rest) else 0), "\n".join(rest), err


@pytest.fixture
def host(root: Path, short_dir: Path, server: EmbeddedRedis) -> Iterator[Host]:
    """The shipped units, lastword.env naming the test's store, a planted file beside the
    root."""
    outside = short_dir / "outside"
    outside.mkdir()
    (outside / "planted").write_text(PLANTED)
    tmp = short_dir / "tmp"
    tmp.mkdir()
    made = Host(root, tmp, outside)
    made.env(f"LASTWORD_REDIS_URL={server.url}\n")
    yield made


def notes(err: str) -> list[str]:
    return [line.removeprefix("note: ") for line in err.splitlines() if line.startswith("note: ")]


async def test_credential_ids_that_are_no_file_names_are_ignored(host: Host) -> None:
    host.dropin(
        "SetCredential=../escaped:written-beside-the-folder\n"
        "LoadCredential=../copied:/../outside/planted\n"
        "SetCredential=..:dots\n"
        "LoadCredential=a/b:/etc/lastword/lastword.env\n"
        "SetCredential=extra:kept"
    )
    code, out, err = await host.doctor()
    assert code == 0, out + err
    assert "; 1 credential (extra);" in err.splitlines()[0]
    dropin = host.root / "etc/systemd/system/lastword.service.d/hostile.conf"
    assert notes(err) == [
        f"{dropin}:2: SetCredential= names the ID '../escaped', no valid file name: "
        "systemd ignores this line",
        f"{dropin}:3: LoadCredential= names the ID '../copied', no valid file name: "
        "systemd ignores this line",
        f"{dropin}:4: SetCredential= names the ID '..', no valid file name: "
        "systemd ignores this line",
        f"{dropin}:5: LoadCredential= names the ID 'a/b', no valid file name: "
        "systemd ignores this line",
    ]


def _dotdot_source(host: Host) -> None:
    host.dropin("LoadCredential=LASTWORD_PLATFORM:/../outside/planted")


def _credstore_link(host: Host) -> None:
    host.dropin("LoadCredential=LASTWORD_PLATFORM")
    host.link("/etc/credstore/LASTWORD_PLATFORM", "../../../outside/planted")


def _folder_link_in_the_path(host: Host) -> None:
    host.dropin("LoadCredential=LASTWORD_PLATFORM:/etc/lastword/up/planted")
    host.link("/etc/lastword/up", "../../../outside")


def _absolute_link_climbing(host: Host) -> None:
    # Under the root, "/" is the root: from there ".." has nowhere to go.
    host.dropin("LoadCredential=LASTWORD_PLATFORM")
    host.link("/etc/credstore/LASTWORD_PLATFORM", "/../outside/planted")


def _link_in_a_credential_folder(host: Host) -> None:
    # systemd takes the regular files of a directory source, never a symlink in it.
    host.dropin("LoadCredential=LASTWORD:/etc/lastword/credentials")
    host.link("/etc/lastword/credentials/PLATFORM", "../../../../outside/planted")


@pytest.mark.parametrize(
    ("hostile", "note"),
    [
        pytest.param(
            _dotdot_source,
            "LoadCredential= names the source '/../outside/planted', no normalized",
            id="dotdot-source",
        ),
        pytest.param(
            _credstore_link, "/etc/credstore/LASTWORD_PLATFORM leads out of ", id="credstore-link"
        ),
        pytest.param(
            _folder_link_in_the_path, "/etc/lastword/up/planted leads out of ", id="folder-link"
        ),
        pytest.param(
            _absolute_link_climbing,
            "/etc/credstore/LASTWORD_PLATFORM leads out of ",
            id="absolute-link-climbing",
        ),
        pytest.param(_link_in_a_credential_folder, None, id="link-in-a-credential-folder"),
    ],
)
async def test_a_credential_source_out_of_the_root_is_never_read(
    host: Host, hostile: Callable[[Host], None], note: str | None
) -> None:
    # Read, the planted file would be the platform, and doctor would say so.
    hostile(host)
    code, out, err = await host.doctor()
    assert code == 0, out + err
    assert "; 0 credentials;" in err.splitlines()[0]
    assert "platform console" in out
    if note is None:
        assert notes(err) == []
    else:
        assert len(notes(err)) == 1, err
        assert note in notes(err)[0]


async def test_an_absolute_link_is_followed_under_the_root(host: Host) -> None:
    # As in a chroot: the target names a file under the root, not the host's.
    host.dropin("LoadCredential=LASTWORD_LOG_FORMAT")
    host.env("json", "log-format")
    host.link("/etc/credstore/LASTWORD_LOG_FORMAT", "/etc/lastword/log-format")
    code, out, err = await host.doctor()
    assert code == 0, out + err
    assert "; 1 credential (LASTWORD_LOG_FORMAT);" in err.splitlines()[0]
    assert notes(err) == []


async def test_env_file_globs_are_read_in_sorted_order(host: Host, server: EmbeddedRedis) -> None:
    host.dropin("EnvironmentFile=/etc/lastword/conf.d/*.env")
    # Read second, the right store wins; a dot file is no match for "*".
    host.env("LASTWORD_REDIS_URL=redis://127.0.0.1:1/0\n", "conf.d/10-first.env")
    host.env(f"LASTWORD_REDIS_URL={server.url}\n", "conf.d/20-second.env")
    host.env("LASTWORD_PLATFROM=console\n", "conf.d/.hidden.env")
    host.env("LASTWORD_PLATFROM=console\n", "conf.d/30-other.conf")
    code, out, err = await host.doctor()
    assert code == 0, out + err
    etc = host.root / "etc/lastword"
    assert (
        f"env files {etc}/lastword.env (read), {etc}/conf.d/10-first.env (read), "
        f"{etc}/conf.d/20-second.env (read);"
    ) in err.splitlines()[0]
    assert "✓ store:" in out


async def test_a_misspelt_name_in_an_optional_glob_fails_as_the_unit_would(host: Host) -> None:
    # The unit would exit 2 on it ("no such setting"): doctor must not say ✓.
    host.dropin("EnvironmentFile=-/etc/lastword/*.env")
    host.env("LASTWORD_PLATFROM=console\n", "local.env")
    code, out, err = await host.doctor()
    assert code != 0, out + err
    assert "✗ settings: LASTWORD_PLATFROM" in out
    assert "no such setting" in out
    assert f"{host.root}/etc/lastword/local.env (read)" in err.splitlines()[0]


@pytest.mark.parametrize("optional", [True, False], ids=["optional", "required"])
async def test_a_glob_that_matches_nothing(host: Host, optional: bool) -> None:
    # systemd fails the unit for a glob without "-" that matches no file, not for one with.
    host.dropin(f"EnvironmentFile={'-' * optional}/etc/lastword/conf.d/*.env")
    host.env("not an env file\n", "conf.d/readme.txt")
    code, out, err = await host.doctor()
    pattern = f"{host.root}/etc/lastword/conf.d/*.env"
    if optional:
        assert code == 0, out + err
        assert f"{pattern} (no match)" in err.splitlines()[0]
    else:
        assert code == 2
        assert out == ""
        assert err.splitlines() == [
            f"lastword: env file {pattern}: matches no file (systemd would not start the unit)"
        ]


async def test_a_glob_in_a_folder_out_of_the_root_is_not_read(host: Host) -> None:
    host.dropin("EnvironmentFile=-/etc/lastword/up/*")
    host.link("/etc/lastword/up", "../../../outside")
    code, out, err = await host.doctor()
    assert code == 0, out + err
    assert f"{host.root}/etc/lastword/up/* (not read)" in err.splitlines()[0]
    assert notes(err) == [f"{host.root}/etc/lastword/up leads out of {host.root}; not read"]


async def test_an_unbalanced_quote_in_environment_is_ignored_from_there_on(
    host: Host, server: EmbeddedRedis
) -> None:
    # The words before the bad one stand, as under systemd: here the store.
    host.env("")
    host.dropin(f'Environment=LASTWORD_REDIS_URL={server.url} "LASTWORD_PLATFROM=console')
    code, out, err = await host.doctor()
    assert code == 0, out + err
    assert "store embedded" not in out
    assert "✓ store:" in out
    dropin = host.root / "etc/systemd/system/lastword.service.d/hostile.conf"
    assert notes(err) == [
        f"{dropin}:2: Environment= has an unbalanced quote: systemd ignores the rest of the line"
    ]


async def test_sigterm_leaves_no_credentials_behind(host: Host) -> None:
    # A store that accepts and never answers holds doctor in its check until the signal.
    with socket.create_server(("127.0.0.1", 0)) as silent:
        host.env(f"LASTWORD_REDIS_URL=redis://127.0.0.1:{silent.getsockname()[1]}/0\n")
        host.dropin("SetCredential=extra:kept")
        process = await asyncio.create_subprocess_exec(
            SCRIPT,
            "doctor",
            "--unit",
            "lastword",
            "--root",
            str(host.root),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
            env=clean_env(host.tmp / "data", TMPDIR=str(host.tmp)),
        )
        try:

            async def credentials_written() -> bool:
                return any((folder / "extra").exists() for folder in host.tmp.iterdir())

            await eventually(credentials_written, 20, what="the private credentials folder")
            process.send_signal(signal.SIGTERM)
            code = await asyncio.wait_for(process.wait(), timeout=20)
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
    assert code == -signal.SIGTERM
    assert sorted(host.tmp.iterdir()) == []
    assert os.listdir(host.outside) == ["planted"]
