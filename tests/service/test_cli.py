"""The command line as an operator meets it: help, configuration errors and secrets.

Each test runs the installed `lastword` console script (or `python -m bot`) as a process with
a clean environment, and checks what a person would read on the terminal and the exit status.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from tests.support import forked
from tests.support.console import MODULE, SCRIPT, clean_env, server_pids
from tests.support.ports import closed_port

# The names SPEC fixes for operators and external rigs; help must list every one.
SPEC_NAMES = [
    "LASTWORD_PLATFORM",
    "LASTWORD_REDIS_URL",
    "LASTWORD_TELEGRAM__TOKEN",
    "LASTWORD_TELEGRAM__API_URL",
    "LASTWORD_TELEGRAM__MODE",
    "LASTWORD_TELEGRAM__WEBHOOK_LISTEN",
    "LASTWORD_TELEGRAM__WEBHOOK_PATH",
    "LASTWORD_TELEGRAM__WEBHOOK_URL",
    "LASTWORD_TELEGRAM__WEBHOOK_SECRET",
    "LASTWORD_DISCORD__TOKEN",
    "LASTWORD_DISCORD__API_URL",
    "LASTWORD_DISCORD__GATEWAY_URL",
    "LASTWORD_LLM__PROVIDER",
    "LASTWORD_LLM__BASE_URL",
    "LASTWORD_LLM__API_KEY",
    "LASTWORD_LLM__MODEL",
    "LASTWORD_DEBOUNCE__QUIET_MS",
    "LASTWORD_DEBOUNCE__MAX_WAIT_MS",
    "LASTWORD_LEASE__TTL_MS",
    "LASTWORD_CONFIG",
    "LASTWORD_DATA_DIR",
]

SECRET = "hunter2-s3cret"


def lastword(
    data_dir: Path,
    *args: str,
    command: list[str] | None = None,
    env: Mapping[str, str] | None = None,
    **more_env: str,
) -> subprocess.CompletedProcess[str]:
    """Run the CLI to completion with empty stdin (bounded: a hang fails the test): forked
    from the zygote, unless `command` says how to start it (the tests of both ways)."""
    environ = clean_env(data_dir, **{**(env or {}), **more_env})
    if command is None:
        return forked.run(*args, env=environ, cwd=data_dir.parent, timeout=20)
    return subprocess.run(
        [*command[:-1], *args],  # without the "run" the helpers default to
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=environ,
        cwd=data_dir.parent,
        timeout=20,
        check=False,
    )


@pytest.fixture
def data_dir(short_dir: Path) -> Iterator[Path]:
    path = short_dir / "data"
    yield path
    assert server_pids(path) == [], "an embedded server outlived its test"


@pytest.mark.parametrize("args", [["--help"], ["run", "--help"]], ids=["top", "run"])
@pytest.mark.parametrize("command", [MODULE, SCRIPT], ids=["python-m-bot", "lastword-script"])
def test_help_names_the_commands_and_where_the_settings_are(
    data_dir: Path, args: list[str], command: list[str]
) -> None:
    # Help must work even when the configuration is broken: it is how one finds the fix.
    result = lastword(data_dir, *args, command=command, LASTWORD_REDIS_URL="http://x")
    assert result.returncode == 0, result.stderr
    assert "lastword settings" in result.stdout
    assert "docs/settings.md" in result.stdout
    # A screen, not a hundred setting lines: the commands do not scroll away.
    assert len(result.stdout.splitlines()) < 40
    if args == ["--help"]:
        for name in ("run", "status", "doctor", "settings", "migrate-shards"):
            assert f"    {name}" in result.stdout, name


@pytest.mark.parametrize("command", [MODULE, SCRIPT], ids=["python-m-bot", "lastword-script"])
def test_settings_lists_every_setting(data_dir: Path, command: list[str]) -> None:
    # It reads no settings: it works when the configuration is broken.
    result = lastword(data_dir, "settings", command=command, LASTWORD_REDIS_URL="http://x")
    assert result.returncode == 0, result.stderr
    for name in SPEC_NAMES:
        assert name in result.stdout, name
    shown = {line.split()[0]: line for line in result.stdout.splitlines() if line.strip()}
    assert "2000" in shown["LASTWORD_DEBOUNCE__QUIET_MS"]
    assert "8000" in shown["LASTWORD_DEBOUNCE__MAX_WAIT_MS"]
    assert "30000" in shown["LASTWORD_LEASE__TTL_MS"]
    assert "console" in shown["LASTWORD_PLATFORM"]


def test_no_command_is_a_usage_error(data_dir: Path) -> None:
    result = lastword(data_dir)
    assert result.returncode == 2
    assert "usage: lastword" in result.stderr
    assert "Traceback" not in result.stderr


CONFIG_ERRORS = {
    "redis-scheme": ({"LASTWORD_REDIS_URL": "http://x"}, "LASTWORD_REDIS_URL"),
    "redis-port": ({"LASTWORD_REDIS_URL": "redis://127.0.0.1:notaport"}, "LASTWORD_REDIS_URL"),
    "redis-port-range": ({"LASTWORD_REDIS_URL": "redis://127.0.0.1:99999"}, "LASTWORD_REDIS_URL"),
    "telegram-no-token": ({"LASTWORD_PLATFORM": "telegram"}, "LASTWORD_TELEGRAM__TOKEN"),
    "discord-no-token": ({"LASTWORD_PLATFORM": "discord"}, "LASTWORD_DISCORD__TOKEN"),
    "webhook-no-secret": (
        {
            "LASTWORD_PLATFORM": "telegram",
            "LASTWORD_TELEGRAM__TOKEN": "123:abc",
            "LASTWORD_TELEGRAM__MODE": "webhook",
        },
        "LASTWORD_TELEGRAM__WEBHOOK_SECRET",
    ),
    "unknown-platform": ({"LASTWORD_PLATFORM": "irc"}, "LASTWORD_PLATFORM"),
    "quiet-not-int": ({"LASTWORD_DEBOUNCE__QUIET_MS": "soon"}, "LASTWORD_DEBOUNCE__QUIET_MS"),
    "max-wait-below-quiet": (
        {"LASTWORD_DEBOUNCE__QUIET_MS": "3000", "LASTWORD_DEBOUNCE__MAX_WAIT_MS": "1000"},
        "LASTWORD_DEBOUNCE__MAX_WAIT_MS",
    ),
    "ttl-too-short": ({"LASTWORD_LEASE__TTL_MS": "5"}, "LASTWORD_LEASE__TTL_MS"),
    "llm-provider": ({"LASTWORD_LLM__PROVIDER": "skynet"}, "LASTWORD_LLM__PROVIDER"),
    "config-missing": ({"LASTWORD_CONFIG": "/nonexistent/lastword.toml"}, "LASTWORD_CONFIG"),
}


@pytest.mark.parametrize(("env", "setting"), CONFIG_ERRORS.values(), ids=CONFIG_ERRORS.keys())
def test_configuration_error_is_one_line_naming_the_setting(
    data_dir: Path, env: dict[str, str], setting: str
) -> None:
    result = lastword(data_dir, "run", env=env)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert setting in lines[0]
    assert lines[0].startswith("lastword: configuration error")
    assert result.stdout == ""
    # Nothing was started: a configuration error is found before the store is touched.
    assert not data_dir.exists()


def test_a_platform_not_installed_is_one_line_naming_the_installed_ones(data_dir: Path) -> None:
    result = lastword(data_dir, "run", LASTWORD_PLATFORM="irc")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(
        "lastword: configuration error: LASTWORD_PLATFORM: no platform 'irc' is installed "
        "(installed: "
    )
    # The built-ins at least; a plug-in installed here would be listed too.
    assert all(name in lines[0] for name in ("console", "discord", "telegram"))
    assert not data_dir.exists()


def test_invalid_toml_is_a_configuration_error(data_dir: Path, short_dir: Path) -> None:
    config = short_dir / "broken.toml"
    config.write_text("[debounce\nquiet_ms = 5\n")
    result = lastword(data_dir, "run", LASTWORD_CONFIG=str(config))
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "LASTWORD_CONFIG" in lines[0]
    assert "TOML" in lines[0]


@pytest.mark.parametrize("problem", ["under-a-file", "too-long-for-a-socket"])
def test_an_unusable_data_dir_is_one_clear_line(
    data_dir: Path, short_dir: Path, problem: str
) -> None:
    if problem == "under-a-file":
        blocker = short_dir / "a-file"
        blocker.write_text("")
        unusable = blocker / "data"
    else:
        unusable = short_dir / ("d" * 120)
    result = lastword(data_dir, "run", LASTWORD_DATA_DIR=str(unusable))
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "LASTWORD_DATA_DIR" in lines[0]


SECRET_LEAKS = {
    "unreachable-redis": (f"redis://:{SECRET}@127.0.0.1:{{port}}/0", 1),
    "unreachable-redis-user": (f"redis://admin:{SECRET}@127.0.0.1:{{port}}/0", 1),
    "password-in-query": (f"redis://127.0.0.1:{{port}}/0?password={SECRET}", 1),
    "bad-port": (f"redis://:{SECRET}@127.0.0.1:port/0", 2),
    "bad-scheme": (f"http://:{SECRET}@127.0.0.1:{{port}}/0", 2),
    # Unencoded, the password's tail is read as the path or fragment, its head as the host.
    "slash-in-password": (f"redis://:ab/{SECRET}@127.0.0.1:{{port}}/0", 2),
    "hash-in-password": (f"redis://:ab#{SECRET}@127.0.0.1:{{port}}/0", 2),
    "sentinel-password-in-query": (
        f"redis+sentinel://127.0.0.1:{{port}}/mymaster?sentinel_password={SECRET}",
        1,
    ),
}


@pytest.mark.parametrize(("url", "status"), SECRET_LEAKS.values(), ids=SECRET_LEAKS.keys())
def test_redis_password_never_printed(data_dir: Path, url: str, status: int) -> None:
    result = lastword(data_dir, "run", LASTWORD_REDIS_URL=url.format(port=closed_port()))
    assert result.returncode == status, result.stderr
    assert "LASTWORD_REDIS_URL" in result.stderr
    assert "Traceback" not in result.stderr
    assert SECRET not in result.stderr + result.stdout


def test_tokens_and_keys_never_printed(data_dir: Path) -> None:
    # Debug logging, an OpenAI key and a platform token all set: a full start-up and stop.
    result = lastword(
        data_dir,
        "run",
        LASTWORD_LOG_LEVEL="DEBUG",
        LASTWORD_LLM__API_KEY=f"sk-{SECRET}",
        LASTWORD_LLM__BASE_URL=f"http://127.0.0.1:{closed_port()}/v1",
        LASTWORD_TELEGRAM__TOKEN=f"123:{SECRET}",
        LASTWORD_DISCORD__TOKEN=SECRET,
        LASTWORD_LLM__EXTRA_HEADERS=f'{{"X-Api-Token": "tok-{SECRET}"}}',
    )
    assert result.returncode == 0, result.stderr
    assert "LLM: openai" in result.stderr
    assert SECRET not in result.stderr + result.stdout


def test_forget_user_says_what_it_erased_on_a_store_it_starts_and_stops(data_dir: Path) -> None:
    result = lastword(data_dir, "forget-user", "telegram", "42")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("erased telegram user 42: what was kept in 1 place"), result
    assert "0 facts of their memory" in result.stdout


def test_forget_user_on_an_unreachable_store_erases_nothing_and_says_so(data_dir: Path) -> None:
    url = f"redis://:{SECRET}@127.0.0.1:{closed_port()}/0"
    result = lastword(data_dir, "forget-user", "telegram", "42", LASTWORD_REDIS_URL=url)
    assert result.returncode == 1, result
    assert "nothing erased: the store cannot be reached" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert SECRET not in result.stderr + result.stdout
