"""`lastword doctor --unit` and `status --unit`: the settings as a systemd unit's process sees
them, not as the admin's shell does; and the command line's own manners (--version, help,
one summary line from migrate-shards).

The unit files are the shipped ones, copied under a temporary root as `systemctl --root` would
read them; the store is the test's real server; Telegram is the loopback fake. `systemctl` and
`busctl` (outsiders: no systemd runs here) are small scripts on PATH that print what systemd
252 prints.
"""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import AsyncIterator, Iterator
from importlib import metadata
from pathlib import Path

import pytest

from bot.ops import unit, unit_syntax
from bot.service import cli
from bot.store.embedded import EmbeddedRedis
from tests.support.fakes.telegram_server import FakeTelegram
from tests.support.unit_view import lastword

pytestmark = pytest.mark.timeout(60)

UNITS = Path(__file__).resolve().parents[2] / "systemd"
TOKEN = "777000111:SECRET-unit-token-Pq4w"


@pytest.fixture
async def telegram() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(TOKEN, bot_username="unit_bot") as fake:
        yield fake


@pytest.fixture
def shell(monkeypatch: pytest.MonkeyPatch, short_dir: Path) -> Iterator[None]:
    """An admin's shell that says something else: the console, a store nowhere."""
    for name in list(os.environ):
        if name.startswith("LASTWORD_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("LASTWORD_PLATFORM", "console")
    monkeypatch.setenv("LASTWORD_REDIS_URL", "redis://127.0.0.1:1/0")
    monkeypatch.chdir(short_dir)
    yield


async def test_doctor_checks_what_the_unit_is_given_not_the_shell(
    root: Path, server: EmbeddedRedis, telegram: FakeTelegram, short_dir: Path
) -> None:
    (root / "etc/lastword/lastword.env").write_text(
        "# as the README's install steps leave it\n"
        "LASTWORD_PLATFORM=telegram\n"
        f"LASTWORD_TELEGRAM__TOKEN={TOKEN}\n"
        f"LASTWORD_TELEGRAM__API_URL={telegram.api_url}\n"
        f"LASTWORD_REDIS_URL={server.url}\n"
    )
    tmp = short_dir / "tmp"
    tmp.mkdir()
    status, out, err = await lastword(
        "doctor", "--unit", "lastword@1", "--root", str(root), tmp=tmp, LASTWORD_PLATFORM="console"
    )
    assert status == 0, out + err
    etc = root / "etc/lastword"
    assert err.splitlines()[0].startswith(
        f"reading lastword@1.service as systemd would: env files {etc}/lastword.env (read), "
        f"{etc}/lastword-1.env (missing); 0 credentials; state {root}/var/lib/lastword-1"
    )
    assert "platform telegram" in out
    assert f"telegram: @unit_bot ({telegram.bot_user['id']})" in out
    assert [call.method for call in telegram.calls] == ["getMe"]
    assert TOKEN.split(":")[1] not in out + err


async def test_a_credential_and_the_instance_env_file(
    root: Path, server: EmbeddedRedis, telegram: FakeTelegram, short_dir: Path
) -> None:
    # The shared file points at nothing; the replica's own file, read last, at the fake.
    (root / "etc/lastword/lastword.env").write_text(
        f"LASTWORD_PLATFORM=telegram\nLASTWORD_TELEGRAM__API_URL=http://127.0.0.1:1\n"
        f"LASTWORD_REDIS_URL='{server.url}'\n"
    )
    (root / "etc/lastword/lastword-1.env").write_text(
        f'LASTWORD_TELEGRAM__API_URL="{telegram.api_url}"\n'
    )
    (root / "etc/credstore").mkdir(mode=0o700)
    (root / "etc/credstore/LASTWORD_TELEGRAM__TOKEN").write_text(TOKEN + "\n")
    tmp = short_dir / "tmp"
    tmp.mkdir()
    status, out, err = await lastword(
        "doctor", "--unit", "lastword@1", "--root", str(root), tmp=tmp
    )
    assert status == 0, out + err
    assert "1 credential (LASTWORD_TELEGRAM__TOKEN)" in err.splitlines()[0]
    assert f"{root}/etc/lastword/lastword-1.env (read)" in err.splitlines()[0]
    assert "@unit_bot" in out
    # The private copy of the credentials is gone with the process.
    assert list(tmp.iterdir()) == []


def test_the_credentials_directory_is_private_and_removed(root: Path) -> None:
    dropins = root / "etc/systemd/system/lastword.service.d"
    dropins.mkdir()
    (dropins / "secret.conf").write_text(
        "[Service]\nSetCredential=LASTWORD_LLM__API_KEY:sk-\\x41bc\nEnvironment=LASTWORD_X=%N\n"
    )
    view = unit.read_view("lastword", root, [])
    before = dict(os.environ)
    with unit.applied(view):
        folder = Path(os.environ["CREDENTIALS_DIRECTORY"])
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        assert (folder / "LASTWORD_LLM__API_KEY").read_bytes() == b"sk-Abc"
        assert os.environ["LASTWORD_X"] == "lastword"
        assert os.environ["STATE_DIRECTORY"] == f"{root}/var/lib/lastword"
        # WorkingDirectory=-/etc/lastword exists under the root.
        assert Path.cwd() == root / "etc/lastword"
    assert not folder.exists()
    assert dict(os.environ) == before


def test_status_finds_the_units_embedded_store(
    root: Path, shell: None, capsys: pytest.CaptureFixture[str]
) -> None:
    # With --root, /var/lib/<StateDirectory> is taken under the root as well.
    store = EmbeddedRedis(root / "var/lib/lastword-2")
    store.start()
    try:
        status = cli.main(["status", "--unit", "lastword@2", "--root", str(root)])
    finally:
        store.stop()
    captured = capsys.readouterr()
    assert status == 0, captured.err
    assert captured.out.startswith("lastword status at ")
    assert f"state {root}/var/lib/lastword-2" in captured.err.splitlines()[0]


def test_env_file_replaces_the_shell(
    server: EmbeddedRedis, shell: None, short_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    env_file = short_dir / "prod.env"
    env_file.write_text(f"LASTWORD_REDIS_URL={server.url}\n")
    assert cli.main(["status", "--json", "--env-file", str(env_file)]) == 0
    captured = capsys.readouterr()
    assert '"replicas": []' in captured.out
    assert captured.err.splitlines() == [
        f"reading as these env files say: env files {env_file} (read)"
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--unit", "nosuch"], "lastword: no unit nosuch.service in "),
        (["--unit", "lastword@"], "lastword: lastword@.service is a template: name an instance"),
        (["--env-file", "/nonexistent/x.env"], "lastword: env file /nonexistent/x.env: no such"),
        (["--root", "/"], "lastword: --root needs --unit"),
    ],
    ids=["missing-unit", "template", "missing-env-file", "root-alone"],
)
def test_what_cannot_be_read_is_one_line(
    root: Path,
    shell: None,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    message: str,
) -> None:
    if "--unit" in args:
        args = [*args, "--root", str(root)]
    assert cli.main(["doctor", *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(message)


def test_env_file_syntax_as_systemd_reads_it() -> None:
    text = (
        "# comment\n"
        "; another\n"
        "A=plain value  \n"
        "B='single $HOME \\n'\n"
        'C="double \\"quoted\\" \\$x \\q"\n'
        "D=continued \\\n"
        "line\n"
        "  E = spaced\n"
        "export F=1\n"
        "no equals sign\n"
        "G=\n"
        "H=a#not-a-comment\n"
    )
    values, ignored = unit_syntax.read_env_file(text)
    assert values == {
        "A": "plain value",
        "B": "single $HOME \\n",
        "C": 'double "quoted" $x \\q',
        "D": "continued line",
        "E": "spaced",
        "G": "",
        "H": "a#not-a-comment",
    }
    assert ignored == ["export F"]


def test_unit_lines_as_systemd_reads_them(root: Path) -> None:
    # Each line as systemd's parser takes it (extract_first_word(), cunescape(),
    # credential_name_valid(), path_simplify_and_warn()): what it ignores is ignored here
    # too, with a note that names the file and line and never the value.
    unit_file = root / "etc/systemd/system/demo.service"
    unit_file.write_text(
        "[Service]\n"
        'Environment="A=two words" B=\\x41\\s\\101 C=\'single "q"\' D=\\u00e9\n'
        'Environment=E=1 F=%N "G=unclosed\n'
        "Environment=H=\\000 I=not-reached\n"
        "Environment=nonsense 1X=2 J=ok\n"
        "EnvironmentFile=relative.env\n"
        "EnvironmentFile=-/etc/demo/../x.env\n"
        "EnvironmentFile=-/etc//demo/./*.env\n"
        "LoadCredential=TOKEN\n"
        "LoadCredential=KEY:key-file\n"
        "LoadCredential=SUB:sub/file\n"
        "LoadCredential=ABS:/etc//x\n"
        "LoadCredential=a\\:b:/etc/x\n"
        "LoadCredential=TOKEN:/etc/demo/token\n"
        "SetCredential=PLAIN:line\\n\n"
        "SetCredential=NUL:a\\000b\n"
        "SetCredential=ESCAPE:secret\\q\n"
        "SetCredential=NODATA\n"
        "SetCredential=PLAIN:%%kept\n"
        "StateDirectory=demo-%N ../up private/x\n"
        "WorkingDirectory=/etc/demo/\n"
        "WorkingDirectory=-relative\n"
    )
    config = unit.from_files(root, "demo")
    assert config.environment == {
        "A": "two words",
        "B": "A A",
        "C": 'single "q"',
        "D": "é",
        "E": "1",
        "F": "demo",
        "J": "ok",
    }
    assert config.env_files == [("/etc/demo/*.env", True)]
    assert config.load_credentials == [
        ("KEY", "key-file"),
        ("TOKEN", "/etc/demo/token"),
    ]
    assert config.set_credentials == [("NUL", b"a\x00b"), ("PLAIN", b"%%kept")]
    assert config.state_directories == ["demo-demo"]
    assert (config.working_directory, config.working_directory_optional) == ("/etc/demo", False)
    ignores = "systemd ignores"
    assert [note.removeprefix(f"{unit_file}:") for note in config.notes] == [
        f"3: Environment= has an unbalanced quote: {ignores} the rest of the line",
        f"4: Environment= has a NUL escape: {ignores} the rest of the line",
        f"5: Environment= has a word that is no NAME=VALUE: {ignores} it",
        f"5: Environment= has a word that is no NAME=VALUE: {ignores} it",
        f"6: EnvironmentFile= names no absolute, normalized path: {ignores} this line",
        f"7: EnvironmentFile= names no absolute, normalized path: {ignores} this line",
        f"11: LoadCredential= names the source 'sub/file', no normalized path or credential "
        f"name: {ignores} this line",
        f"12: LoadCredential= names the source '/etc//x', no normalized path or credential "
        f"name: {ignores} this line",
        f"13: LoadCredential= names the ID 'a:b', no valid file name: {ignores} this line",
        f"17: SetCredential= has an unknown escape: {ignores} this line",
        f"18: SetCredential= has no ID:DATA: {ignores} this line",
        f"20: StateDirectory= names '../up', no relative, normalized path outside private/: "
        f"{ignores} that name",
        f"20: StateDirectory= names 'private/x', no relative, normalized path outside "
        f"private/: {ignores} that name",
        f"22: WorkingDirectory= names no absolute, normalized path: {ignores} this line",
    ]
    assert "secret" not in "\n".join(config.notes)


@pytest.mark.parametrize(
    ("name", "valid"),
    [
        ("LASTWORD_REDIS_URL", True),
        ("a b~", True),
        ("x" * 255, True),
        ("x" * 256, False),
        ("", False),
        (".", False),
        ("..", False),
        ("../x", False),
        ("a/b", False),
        ("a:b", False),
        ("tab\there", False),
        ("é", False),
    ],
)
def test_credential_ids_are_file_names(name: str, valid: bool) -> None:
    assert unit_syntax.credential_name_valid(name) is valid
    if not valid:
        # Nothing can carry one to the credentials folder.
        with pytest.raises(ValueError, match="not a credential ID"):
            unit.View({}, {name: b"data"}, None, "")


def test_an_env_file_glob_matches_only_what_exists(root: Path) -> None:
    # glob(3) returns existing paths only: a folder without the file is no match.
    (root / "etc/systemd/system/demo.service").write_text(
        "[Service]\nEnvironmentFile=/etc/demo/*/app.env\n"
    )
    (root / "etc/demo/a").mkdir(parents=True)
    (root / "etc/demo/b").mkdir()
    (root / "etc/demo/b/app.env").write_text("FROM=b\n")
    view = unit.build_view(unit.from_files(root, "demo"), root, [])
    assert view.environment == {"FROM": "b"}
    assert f"env files {root}/etc/demo/b/app.env (read);" in view.summary


def test_specifiers_templates_and_drop_ins(root: Path) -> None:
    template = root / "usr/lib/systemd/system"
    template.mkdir(parents=True)
    (template / "demo@.service").write_text(
        "[Unit]\nEnvironment=NOT_SERVICE=1\n[Service]\n"
        'Environment="A=%i %I" B=%n C=%N D=%p E=%%i \\\n  F=%H\n'
        "EnvironmentFile=-/etc/demo/%i.env\nStateDirectory=demo-%i\n"
    )
    dropins = root / "etc/systemd/system/demo@.service.d"
    dropins.mkdir()
    (dropins / "10-reset.conf").write_text("[Service]\nEnvironmentFile=\nStateDirectory=\n")
    (dropins / "20-own.conf").write_text("[Service]\nEnvironmentFile=/etc/demo/own.env\n")
    config = unit.from_files(root, "demo@a-b")
    assert config.environment == {
        "A": "a-b a/b",
        "B": "demo@a-b.service",
        "C": "demo@a-b",
        "D": "demo",
        "E": "%i",
        "F": socket.gethostname(),
    }
    assert config.env_files == [("/etc/demo/own.env", False)]
    assert config.state_directories == []


def test_the_managers_view_through_systemctl_show(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What systemd 252 prints for the shipped lastword@.service (systemctl-show.c: one line
    # per env file; strv properties shell-quoted; "!" for a directory that may be missing;
    # credentials as "[unprintable]", so they come from busctl's JSON).
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    show = (
        "LoadState=loaded\n"
        'Environment=LASTWORD_LOG_FORMAT=logfmt LASTWORD_REPLICA_ID=h-3 "LASTWORD_X=a b"\n'
        "EnvironmentFiles=/etc/lastword/lastword.env (ignore_errors=yes)\n"
        "EnvironmentFiles=/etc/lastword/lastword-3.env (ignore_errors=no)\n"
        "StateDirectory=lastword-3\n"
        "WorkingDirectory=!/etc/lastword\n"
    )
    (bin_dir / "systemctl").write_text(f"#!/bin/sh\ncat <<'EOF'\n{show}EOF\n")
    (bin_dir / "busctl").write_text(
        '#!/bin/sh\ncase "$*" in\n'
        '*LoadCredential) echo \'{"type":"a(ss)","data":[["LASTWORD_REDIS_URL",'
        '"LASTWORD_REDIS_URL"]]}\' ;;\n'
        '*SetCredential) echo \'{"type":"a(say)","data":[["LASTWORD_LLM__API_KEY",'
        "[107,49]]]}' ;;\n"
        "esac\n"
    )
    for script in bin_dir.iterdir():
        script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    config = unit.from_systemctl("lastword@3")
    assert config.environment == {
        "LASTWORD_LOG_FORMAT": "logfmt",
        "LASTWORD_REPLICA_ID": "h-3",
        "LASTWORD_X": "a b",
    }
    assert config.env_files == [
        ("/etc/lastword/lastword.env", True),
        ("/etc/lastword/lastword-3.env", False),
    ]
    assert config.state_directories == ["lastword-3"]
    assert (config.working_directory, config.working_directory_optional) == ("/etc/lastword", True)
    assert config.load_credentials == [("LASTWORD_REDIS_URL", "LASTWORD_REDIS_URL")]
    assert config.set_credentials == [("LASTWORD_LLM__API_KEY", b"k1")]
    assert unit.bus_path("lastword@3.service") == (
        "/org/freedesktop/systemd1/unit/lastword_403_2eservice"
    )


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"lastword {metadata.version('lastword')}\n"


@pytest.mark.parametrize(
    ("command", "says"),
    [
        ("run", "Start the bot"),
        ("status", "Show what the store says"),
        ("doctor", "Check a deployment"),
        ("migrate-shards", "Move the conversations"),
    ],
)
def test_every_subcommand_says_what_it_does(
    command: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        cli.main([command, "--help"])
    text = capsys.readouterr().out
    # The description sits between the usage and the options.
    description = text.split("\n\n", 1)[1].split("options:", 1)[0]
    assert says in " ".join(description.split())


def test_migrate_shards_on_an_empty_store_is_one_line(
    server: EmbeddedRedis,
    shell: None,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LASTWORD_REDIS_URL", server.url)
    assert cli.main(["migrate-shards"]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    assert captured.out.splitlines() == [
        "nothing to migrate: the store is laid out in 64 shards, in stored format 2 (recorded)"
    ]
