"""The operator's path never lies: every wrong setting is one line, and no name is ignored.

A walk over every setting of the tree, each given a wrong value in the environment: `run`,
`doctor` and `status` alike exit 2 with exactly one line that names the setting, shows what
was given (a secret masked) and says what is expected; never a traceback. A setting added
without a wrong value here fails the walk, so the table keeps up with the tree.

Then the names: a misspelt variable, `.env` entry, credential or TOML key stops `run` with
the closest real name, and `doctor` shows it as its one ✗. And the conventions:
OPENAI_API_KEY and OPENAI_BASE_URL stand in for unset settings, and doctor says which.
"""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args, get_origin

import pytest
from pydantic import BaseModel

from bot.config import spelling
from bot.config.settings import (
    ENV_PREFIX,
    PLATFORM_SECTIONS,
    load_settings,
    settings_tree,
)
from bot.service import cli
from bot.store.embedded import EmbeddedRedis
from tests.support import forked
from tests.support.setting_fields import model_in

SECRET = "sk-abc def-MUST-NOT-SHOW"  # a space inside: wrong, and must never be printed

# One wrong value per setting; "{file}" becomes the path of an existing regular file.
WRONG: dict[str, str] = {
    "PLATFORM": "telegrm",
    "REDIS_URL": "http://127.0.0.1:6379",
    "DATA_DIR": "{file}",
    "TELEGRAM__TOKEN": "not-a-bot-token",
    "TELEGRAM__API_URL": "api.telegram.org",
    "TELEGRAM__MODE": "hook",
    "TELEGRAM__WEBHOOK_LISTEN": "8443",
    "TELEGRAM__WEBHOOK_PATH": "telegram",
    "TELEGRAM__WEBHOOK_URL": "bot.example.org/telegram",
    "TELEGRAM__WEBHOOK_SECRET": "has spaces!",
    "TELEGRAM__DRAFTS": "maybe",
    "TELEGRAM__DRAFT_INTERVAL_MS": "10",
    "TELEGRAM__MESSAGES_PER_SECOND": "0",
    "TELEGRAM__CHAT_MESSAGES_PER_SECOND": "1.5",
    "TELEGRAM__GROUP_MESSAGES_PER_MINUTE": "lots",
    "DISCORD__TOKEN": SECRET,
    "DISCORD__API_URL": "discord.com/api/v10",
    "DISCORD__GATEWAY_URL": "https://gateway.discord.gg",
    "DISCORD__CATCH_UP_MINUTES": "90",
    "DISCORD__REQUESTS_PER_SECOND": "-5",
    "DISCORD__CHANNEL_MESSAGES_PER_5S": "0",
    "LLM__PROVIDER": "anthropic",
    "LLM__BASE_URL": "api.openai.com/v1",
    "LLM__API_KEY": SECRET,
    "LLM__MODEL": "gpt 4o",
    "LLM__SYSTEM_PROMPT": "word " * 40_000,
    "LLM__TIMEOUT_S": "0",
    "LLM__RETRIES": "-1",
    "LLM__RETRY_BASE_S": "-1",
    "LLM__ECHO_DELAY_MS": "-5",
    "LLM__ECHO_WORD_MS": "5000",
    "LLM__DEADLINE_S": "0",
    "LLM__ATTEMPTS": "0",
    "LLM__STREAM": "maybe",
    "LLM__INTERRUPT": "maybe",
    "LLM__INTERRUPT_POLL_MS": "5",
    "LLM__CONTEXT_TOKENS": "100",
    "LLM__MAX_TOKENS": "8",
    "LLM__TEMPERATURE": "3",
    "LLM__EXTRA_HEADERS": "{bad",
    "LLM__EXTRA_BODY": "{bad",
    "LLM__DAILY_TOKENS_PER_USER": "-1",
    "LLM__PERSONA_CHARS": "20000",
    "LLM__MODELS": "smart:gpt-4o",
    "MEDIA__VISION": "sometimes",
    "MEDIA__VISION_MODELS": "gpt-4o*,llava 13b",
    "MEDIA__MAX_EDGE_PX": "10",
    "MEDIA__JPEG_QUALITY": "100",
    "MEDIA__MAX_IMAGE_PIXELS": "5",
    "MEDIA__WORKERS": "0",
    "MEDIA__WORK_TIMEOUT_S": "0",
    "MEDIA__WORKER_MEMORY_MB": "10",
    "MEDIA__MAX_FILE_BYTES": "10",
    "MEDIA__MAX_FILES": "-1",
    "MEDIA__MAX_BURST_BYTES": "10",
    "MEDIA__MAX_DOCUMENT_CHARS": "10",
    "MEDIA__FETCH_TIMEOUT_S": "0",
    "MEDIA__TRANSCRIPTION_TIMEOUT_S": "0",
    "MEDIA__TRANSCRIPTION_MODEL": "whisper 1",
    "MEDIA__TRANSCRIPTION_BASE_URL": "localhost:8000/v1",
    "MEDIA__TRANSCRIPTION_API_KEY": SECRET,
    "DEBOUNCE__QUIET_MS": "-1",
    "DEBOUNCE__MAX_WAIT_MS": "soon",
    "DEBOUNCE__SPECULATE_MS": "-5",
    "DEBOUNCE__LEARN": "sometimes",
    "DEBOUNCE__FLOOR_MS": "0.5s",
    "DEBOUNCE__TYPING_MS": "while typing",
    # A server with neither a command nor a URL.
    "TOOLS__MCP_SERVERS": '{"time": {"args": ["-m", "mcp_server_time"]}}',
    "TOOLS__STEP_LIMIT": "0",
    "TOOLS__CALL_TIMEOUT_S": "forever",
    "TOOLS__OUTPUT_CHARS": "10",
    "TOOLS__START_TIMEOUT_S": "-1",
    "TOOLS__MAX_MESSAGE_BYTES": "100",
    "MEMORY__ENABLED": "mostly",
    "MEMORY__FACTS": "0",
    "MEMORY__FACT_CHARS": "5",
    "MEMORY__PROVIDER": "mem0",
    "TRACES__ENABLED": "sometimes",
    "LEASE__TTL_MS": "100",
    "ACCESS__ALLOWED_USERS": "123,456 789",
    "ACCESS__ADMINS": "alice bob",
    "ACCESS__RATE_PER_MINUTE": "-1",
    "OUTBOUND__BUDGET": "cluster",
    "OUTBOUND__MAX_REPLY_AGE_S": "-1",
    "GROUPS__ALLOWED": "-100123 -100456",
    "GROUPS__WAKE_WORDS": "hey bot",
    "GROUPS__CONTEXT_MESSAGES": "500",
    "GROUPS__CONTEXT_CHARS": "10",
    "GROUPS__CONTEXT_MINUTES": "0",
    "HISTORY_CAP": "1",
    "RETENTION_DAYS": "0",
    "MAX_MESSAGE_CHARS": "10",
    "STARVATION_AGE_MS": "-1",
    "STARVATION_LIMIT": "-1",
    "SWEEP_INTERVAL_MS": "10",
    "LOG_LEVEL": "LOUD",
    "LOG_FORMAT": "xml",
    "REPLICA_ID": "a b",
    "SHUTDOWN_GRACE_S": "100",
    "METRICS_LISTEN": "9464",
    "DURABILITY": "paranoid",
    "DURABILITY_WAIT_MS": "0",
}
SECRETS = {
    "DISCORD__TOKEN",
    "LLM__API_KEY",
    "MEDIA__TRANSCRIPTION_API_KEY",
    "TELEGRAM__TOKEN",
    "TELEGRAM__WEBHOOK_SECRET",
}
# A platform's settings are read when it is the chosen one, and its required ones must be
# right for the wrong one to be the error shown.
REQUIRED = {"TELEGRAM": {"TELEGRAM__TOKEN": "123:abc"}, "DISCORD": {"DISCORD__TOKEN": "a.b.c"}}
# How a value that is not quoted (too long, or JSON that may hold a credential) is shown.
SHOWN_AS = {
    "LLM__SYSTEM_PROMPT": "about 50000 tokens",
    # JSON that does not parse: where it breaks, never the text.
    "LLM__EXTRA_HEADERS": "Expecting property name enclosed in double quotes at line 1, "
    "column 2 (the text is not quoted: it may hold a credential)",
    "LLM__EXTRA_BODY": "Expecting property name enclosed in double quotes at line 1, column 2",
    "LLM__MODELS": "Expecting value at line 1, column 1",
    # The server's own entry, named by its key, with the keys it was given only.
    "TOOLS__MCP_SERVERS": 'server \'time\': expected either "command" (stdio) or "url" '
    '(streamable HTTP); given {"args": "***"}',
}
COMMANDS = (["run"], ["doctor"], ["status"])


def one_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str]:
    """Run the command line in-process; its exit code and everything it printed."""
    code = cli.main(argv)
    captured = capsys.readouterr()
    return code, (captured.out + captured.err).strip()


def test_the_walk_covers_every_setting() -> None:
    """Every installed platform's own settings included."""
    tree = settings_tree(PLATFORM_SECTIONS)
    names = {spelling.env_name("", path) for path in spelling.leaves(tree)}
    assert names == set(WRONG), "a setting without a wrong value to test, or a stale one"


def chosen_for(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """For a platform's own setting, choose that platform, with its required settings."""
    platform, _, rest = name.partition("__")
    if rest and platform.lower() in PLATFORM_SECTIONS:
        monkeypatch.setenv(ENV_PREFIX + "PLATFORM", platform.lower())
        for required, value in REQUIRED.get(platform, {}).items():
            monkeypatch.setenv(ENV_PREFIX + required, value)


@pytest.mark.parametrize("name", sorted(WRONG))
def test_every_wrong_value_is_one_line_in_run_doctor_and_status(
    name: str, cwd: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    some_file = cwd / "a-file"
    some_file.write_text("not a directory")
    value = WRONG[name].replace("{file}", str(some_file))
    chosen_for(name, monkeypatch)
    monkeypatch.setenv(ENV_PREFIX + name, value)
    for argv in COMMANDS:
        code, output = one_line(capsys, argv)
        assert code == 2, (argv, output)
        assert "\n" not in output and "Traceback" not in output, (argv, output)
        assert ENV_PREFIX + name in output, (argv, output)
        if name in SECRETS:
            assert value not in output and "def-MUST-NOT-SHOW" not in output, output
            assert "***" in output, output
        elif name in SHOWN_AS:
            assert SHOWN_AS[name] in output, output
            assert repr(value) not in output, output
        else:
            # What was given, so the operator sees the typo.
            assert repr(value) in output, output
        assert "expected" in output or "is installed" in output, output


# Non-finite numbers, as the environment spells them and as JSON does (Python reads both).
NON_FINITE = {"inf": "Infinity", "-inf": "-Infinity", "nan": "NaN"}
# A valid item of each setting that is a JSON list of models, for a float field to be set in.
ITEMS: dict[str, dict[str, Any]] = {"LLM__MODELS": {"name": "smart", "model": "gpt-4o"}}


def float_settings(
    model: type[BaseModel], path: tuple[str, ...] = ()
) -> Iterator[tuple[str, str | None]]:
    """Every float setting under `model`, as (its name without the prefix, None), or, for a
    float field of the models of a JSON list, (the list's name, the field)."""
    for name, field in model.model_fields.items():
        annotation, here = field.annotation, (*path, name)
        inner = model_in(annotation)
        if get_origin(annotation) is dict:
            continue  # a mapping (headers, MCP servers) has no setting of its own below it
        if get_origin(annotation) is list and inner is not None:
            listed = spelling.env_name("", here)
            for item, item_field in inner.model_fields.items():
                if float in (item_field.annotation, *get_args(item_field.annotation)):
                    yield listed, item
        elif inner is not None:
            yield from float_settings(inner, here)
        elif float in (annotation, *get_args(annotation)):
            yield spelling.env_name("", here), None


@pytest.mark.parametrize("value", sorted(NON_FINITE))
def test_no_float_setting_takes_infinity_or_nan(
    value: str, cwd: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`inf` passes every lower bound (a timeout of `inf` then overflows at each request):
    every float of the tree, the platforms' own and those inside JSON lists included, is
    refused as not finite, one line in `run`, `doctor` and `status` alike."""
    found = list(float_settings(settings_tree(PLATFORM_SECTIONS)))
    assert ("LLM__TIMEOUT_S", None) in found and ("LLM__MODELS", "cost") in found, found
    for name, item in found:
        given = value
        if item is not None:
            given = json.dumps([ITEMS[name] | {item: "NON_FINITE"}])
            given = given.replace('"NON_FINITE"', NON_FINITE[value])
        with monkeypatch.context() as scoped:
            chosen_for(name, scoped)
            scoped.setenv(ENV_PREFIX + name, given)
            for argv in COMMANDS:
                code, output = one_line(capsys, argv)
                assert code == 2 and "\n" not in output, (name, argv, output)
                assert ENV_PREFIX + name in output, (name, argv, output)
                assert "expected a finite number" in output, (name, argv, output)


def test_the_system_prompt_too_long_for_the_context_names_both(cwd: Path) -> None:
    os.environ[ENV_PREFIX + "LLM__SYSTEM_PROMPT"] = "word " * 40_000
    try:
        with pytest.raises(ValueError, match="LASTWORD_LLM__CONTEXT_TOKENS"):
            load_settings()
    finally:
        del os.environ[ENV_PREFIX + "LLM__SYSTEM_PROMPT"]


@pytest.mark.parametrize(
    ("variable", "suggestion"),
    [
        ("LASTWORD_LLM__MODLE", "LASTWORD_LLM__MODEL"),
        ("LASTWORD_TELEGRAM_TOKEN", "LASTWORD_TELEGRAM__TOKEN"),
        ("LASTWORD_PLATFROM", "LASTWORD_PLATFORM"),
        ("LASTWORD_DEBOUNSE__QUIET_MS", "LASTWORD_DEBOUNCE__QUIET_MS"),
    ],
)
def test_a_misspelt_variable_stops_run_with_the_real_name(
    variable: str,
    suggestion: str,
    cwd: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv(variable, "gpt-4o")
    code, output = one_line(capsys, ["run"])
    assert code == 2
    assert output == (
        f"lastword: configuration error: {variable}: no such setting (did you mean {suggestion}?)"
    )
    code, output = one_line(capsys, ["doctor"])
    assert code == 2
    assert output == f"✗ settings: {variable}: no such setting (did you mean {suggestion}?)"


def test_a_mapping_setting_takes_keys_of_its_own(
    cwd: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # pydantic-settings reads LASTWORD_LLM__EXTRA_HEADERS__X as a key of the mapping.
    monkeypatch.setenv("LASTWORD_LLM__EXTRA_HEADERS__X_TITLE", "lastword")
    assert load_settings().llm.extra_headers == {"x_title": "lastword"}


def test_a_misspelt_dotenv_entry_and_credential_are_refused(
    cwd: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (cwd / ".env").write_text("LASTWORD_LLM__MODLE=gpt-4o\n")
    code, output = one_line(capsys, ["run"])
    assert (code, output) == (
        2,
        "lastword: configuration error: LASTWORD_LLM__MODLE (in ./.env): no such setting "
        "(did you mean LASTWORD_LLM__MODEL?)",
    )
    (cwd / ".env").unlink()
    credentials = cwd / "credentials"
    credentials.mkdir()
    (credentials / "LASTWORD_LLM__APIKEY").write_text("sk-secret\n")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(credentials))
    code, output = one_line(capsys, ["run"])
    assert code == 2
    assert "LASTWORD_LLM__APIKEY (a credential): no such setting" in output
    assert "did you mean LASTWORD_LLM__API_KEY?" in output


@pytest.mark.parametrize(
    ("toml", "expected"),
    [
        ('platfrom = "telegram"\n', "platfrom: no such setting (did you mean platform?)"),
        (
            "[debounse]\nquiet_ms = 100\n",
            "[debounse]: no such group of settings (did you mean [debounce]?)",
        ),
        ('[llm]\nmodle = "gpt-4o"\n', "llm.modle: no such setting (did you mean llm.model?)"),
    ],
)
def test_a_misspelt_toml_key_stops_run_and_fails_doctor(
    toml: str,
    expected: str,
    cwd: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (cwd / "lastword.toml").write_text(toml)
    code, output = one_line(capsys, ["run"])
    assert (code, output) == (2, f"lastword: configuration error: ./lastword.toml: {expected}")
    code, output = one_line(capsys, ["doctor"])
    assert (code, output) == (2, f"✗ settings: ./lastword.toml: {expected}")


def test_a_missing_config_file_is_one_line(
    cwd: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("LASTWORD_CONFIG", str(cwd / "nowhere.toml"))
    for argv in COMMANDS:
        code, output = one_line(capsys, argv)
        assert code == 2 and "\n" not in output, output
        assert f"LASTWORD_CONFIG: no such file: {cwd / 'nowhere.toml'}" in output


def test_openai_conventions_stand_in_for_unset_settings(
    cwd: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-the-convention")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    settings = load_settings()
    assert settings.llm_provider == "openai"
    assert settings.llm.api_key is not None
    assert settings.llm.api_key.get_secret_value() == "sk-from-the-convention"
    assert settings.llm.base_url == "http://127.0.0.1:9/v1"
    assert settings.key_source == "OPENAI_API_KEY"
    # lastword's own settings win.
    monkeypatch.setenv("LASTWORD_LLM__API_KEY", "sk-lastword-own")
    monkeypatch.setenv("LASTWORD_LLM__BASE_URL", "http://127.0.0.1:10/v1")
    settings = load_settings()
    assert settings.llm.api_key is not None
    assert settings.llm.api_key.get_secret_value() == "sk-lastword-own"
    assert settings.llm.base_url == "http://127.0.0.1:10/v1"
    assert settings.key_source == "LASTWORD_LLM__API_KEY"


def test_doctor_says_where_the_key_came_from(
    cwd: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-the-convention")
    # Nothing listens on port 9: only the settings line matters here.
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    cli.main(["doctor"])
    report = capsys.readouterr().out
    settings_line = report.splitlines()[0]
    assert settings_line.startswith("✓ settings:"), report
    assert "key from OPENAI_API_KEY" in settings_line
    assert "sk-from-the-convention" not in report


def test_journal_lines_start_with_their_syslog_priority(tmp_path: Path) -> None:
    """Under systemd (`JOURNAL_STREAM` naming stderr) every line starts with `<N>`, so
    `journalctl -p err` finds errors; elsewhere lines are as they were."""
    script = (
        "import logging\n"
        "import adapters.discord  # its library's irrelevant warning is named there\n"
        "from bot.service import logs\n"
        "from bot.config.settings import InstalledSettings\n"
        "logs.setup(InstalledSettings(log_format='logfmt'), 'INFO')\n"
        "logging.getLogger('lastword').error('the store is gone')\n"
        "logging.getLogger('lastword').info('still here')\n"
        "logging.getLogger('discord.client').warning("
        "'PyNaCl is not installed, voice will NOT be supported')\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    env["XDG_STATE_HOME"] = str(tmp_path)
    log = tmp_path / "stderr"
    with log.open("wb") as stderr:
        found = os.fstat(stderr.fileno())
        env["JOURNAL_STREAM"] = f"{found.st_dev}:{found.st_ino}"
        subprocess.run(
            [sys.executable, "-c", script], stderr=stderr, env=env, check=True, timeout=30
        )
    lines = log.read_text().splitlines()
    assert len(lines) == 2, lines  # the voice warning is no concern of a DM bot
    assert lines[0].startswith("<3>ts=") and "the store is gone" in lines[0]
    assert lines[1].startswith("<6>ts=")
    # stderr elsewhere than the journal (a redirection): no priorities.
    with log.open("wb") as stderr:
        env["JOURNAL_STREAM"] = "0:0"
        subprocess.run(
            [sys.executable, "-c", script], stderr=stderr, env=env, check=True, timeout=30
        )
    assert log.read_text().startswith("ts=")


class Quiet(http.server.BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        """Not on the test's stderr, which is what is checked."""


@pytest.fixture
def http_port() -> Iterator[int]:
    """A port where an HTTP server, not Redis, answers."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def redis_urls(server: EmbeddedRedis, http_port: int) -> dict[str, tuple[str, str]]:
    """URLs that reach a server lastword cannot use, with what the one line must say."""
    return {
        "http": (f"redis://127.0.0.1:{http_port}/0", "does not speak the Redis protocol"),
        "db": (server.url + "?db=99", "has no such database"),
    }


@pytest.mark.parametrize("case", ["http", "db"])
def test_a_redis_url_at_the_wrong_server_is_one_line(
    case: str,
    server: EmbeddedRedis,
    http_port: int,
    cwd: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url, reason = redis_urls(server, http_port)[case]
    monkeypatch.setenv("LASTWORD_REDIS_URL", url)
    code, output = one_line(capsys, ["status"])
    assert code == 2 and "\n" not in output, output
    assert output.startswith(f"lastword: configuration error: LASTWORD_REDIS_URL={url}: ")
    assert reason in output
    code, output = one_line(capsys, ["doctor"])
    assert code == 1
    store = next(line for line in output.splitlines() if "store:" in line)
    assert store.startswith(f"✗ store: {url}: ") and reason in store, output
    assert "Traceback" not in output
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    ran = forked.run("run", env=env, timeout=60)
    assert ran.returncode == 2, ran.stderr
    lines = [line for line in ran.stderr.splitlines() if "WARNING" not in line]
    assert len(lines) == 1 and reason in lines[0], ran.stderr
    assert lines[0].startswith("lastword: configuration error: LASTWORD_REDIS_URL")


def test_a_wrong_mcp_server_is_shown_without_its_headers_or_env(
    cwd: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    server = {"headers": {"Authorization": "Bearer s3cr3t-h"}, "env": {"TOKEN": "s3cr3t-e"}}
    monkeypatch.setenv(ENV_PREFIX + "TOOLS__MCP_SERVERS", json.dumps({"crm": server}))
    code, output = one_line(capsys, ["doctor"])
    assert code == 2 and "server 'crm'" in output, output
    assert "s3cr3t" not in output and '{"headers": "***", "env": "***"}' in output, output
