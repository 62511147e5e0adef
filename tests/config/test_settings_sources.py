"""One settings story: every source is read alike, and every error names its source.

OPENAI_API_KEY and OPENAI_BASE_URL are read wherever a `LASTWORD_*` variable is (the
environment, `./.env`, a unit's env files, credentials), below every lastword setting; an
error about one names it, and an error about any setting names the variable and the file or
credential that gave it. A mapping (MCP servers, headers) comes whole from the highest source
that gives it, and the `{"mcpServers": ...}` shape of MCP clients is taken in every source.
A unit that would run the console is warned of.

The claims about a running bot go through `lastword run` and `lastword doctor` processes
against the loopback fakes of the provider and the Bot API, with a real server.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from bot.config.settings import ConfigError, load_settings
from bot.ops import unit
from bot.store.embedded import EmbeddedRedis
from tests.support.fakes.loopback import free_port
from tests.support.fakes.openai_server import FakeOpenAI
from tests.support.fakes.telegram_server import FakeTelegram, post_update
from tests.support.forked import spawn
from tests.support.running import Running, clean_environ

pytestmark = pytest.mark.timeout(60)

PROJECT = Path(__file__).resolve().parents[2]
KEY = "sk-from-the-dotenv-file"
CHAT = 4242
SECRET = "sources-webhook-secret"


def without_llm_settings(**extra: str) -> dict[str, str]:
    """The runner's environment with neither lastword's settings nor the OpenAI conventions,
    so only the files a test writes configure the model; `extra` on top."""
    env = {k: v for k, v in clean_environ().items() if not k.startswith("OPENAI_")}
    return env | extra


async def doctor(*args: str, cwd: Path, env: dict[str, str]) -> tuple[int, str, str]:
    """`lastword doctor` run to completion (bounded) in `cwd`."""
    process = await spawn(
        "doctor",
        *args,
        cwd=cwd,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=40)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_the_openai_conventions_in_dotenv_reach_the_provider(
    server: EmbeddedRedis, short_dir: Path
) -> None:
    """The newcomer's `.env`: the key and URL every OpenAI client reads, nothing else about
    the model. The bot asks the provider with that key, not the echo model."""
    async with FakeTelegram() as telegram, FakeOpenAI() as provider:
        provider.expected_api_key = KEY
        (short_dir / ".env").write_text(
            f"OPENAI_API_KEY={KEY}\nOPENAI_BASE_URL={provider.base_url}\n"
        )
        port = free_port()
        env = without_llm_settings(
            LASTWORD_PLATFORM="telegram",
            LASTWORD_REDIS_URL=server.url,
            LASTWORD_DATA_DIR=str(short_dir / "data"),
            LASTWORD_DEBOUNCE__QUIET_MS="300",
            LASTWORD_TELEGRAM__TOKEN=telegram.token,
            LASTWORD_TELEGRAM__API_URL=telegram.api_url,
            LASTWORD_TELEGRAM__MODE="webhook",
            LASTWORD_TELEGRAM__WEBHOOK_LISTEN=f"127.0.0.1:{port}",
            LASTWORD_TELEGRAM__WEBHOOK_SECRET=SECRET,
            LASTWORD_TELEGRAM__WEBHOOK_URL="https://bot.example/telegram",
        )
        running = await Running.start(env, cwd=short_dir)
        try:
            await telegram.wait_for_calls("setWebhook", 1, timeout=15)
            update = telegram.private_text_update(CHAT, CHAT, "hello there")
            url = f"http://127.0.0.1:{port}/telegram"
            assert await post_update(url, update, SECRET) == 200
            await telegram.wait_for_sent(1, timeout=15)
        finally:
            await running.stop()
        [request] = provider.requests
        assert request.api_key == KEY
        assert request.last_user_text.endswith("hello there")
        assert KEY not in "".join(running.log)


async def test_doctor_reads_the_openai_conventions_in_dotenv_and_names_them(
    server: EmbeddedRedis, short_dir: Path
) -> None:
    async with FakeOpenAI() as provider:
        dotenv = short_dir / ".env"
        dotenv.write_text(f"OPENAI_API_KEY={KEY}\nOPENAI_BASE_URL={provider.base_url}\n")
        env = without_llm_settings(
            LASTWORD_REDIS_URL=server.url,
            LASTWORD_DATA_DIR=str(short_dir / "data"),
            LASTWORD_LLM__MODEL="fake-model",
        )
        code, out, err = await doctor(cwd=short_dir, env=env)
        settings_line, *_ = out.splitlines()
        assert settings_line.startswith("✓ settings:"), out + err
        assert f"LLM openai, model fake-model at {provider.base_url}" in settings_line
        assert "(key from OPENAI_API_KEY (in ./.env))" in settings_line
        assert any(line.startswith("✓ llm:") for line in out.splitlines()), out
        assert KEY not in out + err

        # A wrong URL is reported as the variable the operator set, in the file they set it in.
        dotenv.write_text(f"OPENAI_API_KEY={KEY}\nOPENAI_BASE_URL=api.openai.com/v1\n")
        code, out, err = await doctor(cwd=short_dir, env=env)
        assert (code, out.strip()) == (
            2,
            "✗ settings: OPENAI_BASE_URL (in ./.env): expected a URL starting with http:// or "
            "https:// and naming a host; given 'api.openai.com/v1'",
        ), err


def test_the_openai_conventions_are_read_from_credentials_below_every_setting(
    cwd: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    credentials = cwd / "credentials"
    credentials.mkdir()
    (credentials / "OPENAI_API_KEY").write_text("sk-from-a-credential\n")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(credentials))
    settings = load_settings()
    assert settings.llm_provider == "openai"
    assert settings.llm.api_key is not None
    assert settings.llm.api_key.get_secret_value() == "sk-from-a-credential"
    assert settings.key_source == "OPENAI_API_KEY (a credential)"
    # The environment's convention is above the credential's; lastword's own setting, in
    # the lowest file of all, above both.
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-the-environment")
    assert load_settings().key_source == "OPENAI_API_KEY"
    (cwd / ".env").write_text("LASTWORD_LLM__API_KEY=sk-lastword-own\n")
    settings = load_settings()
    assert settings.llm.api_key is not None
    assert settings.llm.api_key.get_secret_value() == "sk-lastword-own"
    assert settings.key_source == "LASTWORD_LLM__API_KEY (in ./.env)"


async def test_a_misspelt_name_in_a_units_env_file_names_the_file(
    root: Path, short_dir: Path
) -> None:
    env_file = root / "etc/lastword/lastword.env"
    env_file.write_text("LASTWORD_PLATFORM=telegram\nLASTWORD_LLM__MODLE=gpt-4o\n")
    code, out, err = await doctor(
        "--unit", "lastword", "--root", str(root), cwd=short_dir, env=without_llm_settings()
    )
    assert err.startswith("reading lastword.service as systemd would:"), err
    assert (code, out.strip()) == (
        2,
        f"✗ settings: LASTWORD_LLM__MODLE (in {env_file}): no such setting "
        "(did you mean LASTWORD_LLM__MODEL?)",
    )


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("OPENAI_BASE_URL=ftp://example.org", "OPENAI_BASE_URL (in {file}): expected a URL"),
        ("LASTWORD_HISTORY_CAP=1", "LASTWORD_HISTORY_CAP (in {file}): expected greater"),
        (
            'LASTWORD_TOOLS__MCP_SERVERS={"t": {"command": "x"',
            "LASTWORD_TOOLS__MCP_SERVERS (in {file}): expected JSON",
        ),
    ],
    ids=["convention", "value", "json"],
)
def test_a_wrong_value_in_a_units_env_file_names_the_file(
    root: Path, line: str, expected: str
) -> None:
    env_file = root / "etc/lastword/lastword.env"
    env_file.write_text(line + "\n")
    view = unit.read_view("lastword", root, [])
    with unit.applied(view), pytest.raises(ConfigError) as caught:
        load_settings()
    assert str(caught.value).startswith(expected.format(file=env_file)), caught.value


@pytest.mark.parametrize(
    ("file", "text", "expected"),
    [
        (".env", "LASTWORD_HISTORY_CAP=1\n", "LASTWORD_HISTORY_CAP (in ./.env): "),
        ("lastword.toml", "history_cap = 1\n", "./lastword.toml: history_cap: "),
        (
            "lastword.toml",
            '[tools.mcp_servers.t]\nargs = ["x"]\n',
            "./lastword.toml: tools.mcp_servers, server 't': ",
        ),
    ],
    ids=["dotenv", "toml", "toml-server"],
)
def test_a_wrong_value_names_the_file_it_is_in(
    cwd: Path, file: str, text: str, expected: str
) -> None:
    (cwd / file).write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert str(caught.value).startswith(expected), caught.value


SERVERS = {"b": {"command": "server-b"}}


def given_in(source: str, cwd: Path, monkeypatch: pytest.MonkeyPatch, name: str, text: str) -> None:
    """`name` set to `text` in `source`: the environment, `./.env` or a credential."""
    if source == "environment":
        monkeypatch.setenv(name, text)
    elif source == "dotenv":
        (cwd / ".env").write_text(f"{name}='{text}'\n")
    else:
        credentials = cwd / "credentials"
        credentials.mkdir(exist_ok=True)
        (credentials / name).write_text(text)
        monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(credentials))


@pytest.mark.parametrize("source", ["environment", "dotenv", "credential"])
@pytest.mark.parametrize("shape", ["map", "mcpServers"])
def test_a_higher_source_replaces_the_toml_files_servers_whole(
    cwd: Path, monkeypatch: pytest.MonkeyPatch, source: str, shape: str
) -> None:
    """In either shape, in the TOML file as in the source above it: a client's whole file
    pasted as it is (`{"mcpServers": ...}`) is its servers."""
    table = "tools.mcp_servers" if shape == "map" else "tools.mcp_servers.mcpServers"
    (cwd / "lastword.toml").write_text(f'[{table}.a]\ncommand = "server-a"\n')
    assert set(load_settings().tools.mcp_servers) == {"a"}
    value = SERVERS if shape == "map" else {"mcpServers": SERVERS}
    given_in(source, cwd, monkeypatch, "LASTWORD_TOOLS__MCP_SERVERS", json.dumps(value))
    servers = load_settings().tools.mcp_servers
    assert set(servers) == {"b"}
    assert servers["b"].command == "server-b"


def test_headers_come_whole_from_the_highest_source(
    cwd: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (cwd / "lastword.toml").write_text('[llm.extra_headers]\nX-Toml = "1"\n')
    (cwd / ".env").write_text('LASTWORD_LLM__EXTRA_HEADERS=\'{"X-Dotenv": "2"}\'\n')
    assert load_settings().llm.extra_headers == {"X-Dotenv": "2"}
    monkeypatch.setenv("LASTWORD_LLM__EXTRA_HEADERS", '{"X-Env": "3"}')
    assert load_settings().llm.extra_headers == {"X-Env": "3"}
    # A group's other settings still come from each source as before.
    (cwd / "lastword.toml").write_text('[llm]\nmodel = "toml-model"\n')
    assert load_settings().llm.model == "toml-model"


def test_the_unedited_example_env_file_is_warned_of_as_a_console_unit(root: Path) -> None:
    env_file = root / "etc/lastword/lastword.env"
    shutil.copy(PROJECT / "config/example.env", env_file)
    warning = (
        "warning: lastword.service would run the console platform, which needs a terminal: "
        "nothing it reads sets LASTWORD_PLATFORM"
    )
    view = unit.read_view("lastword", root, [])
    assert warning in view.summary.splitlines()[-1], view.summary
    # Edited as it says, the unit is a Telegram bot, and nothing is warned of.
    text = env_file.read_text()
    text = text.replace("# LASTWORD_PLATFORM=telegram", "LASTWORD_PLATFORM=telegram")
    env_file.write_text(text + "LASTWORD_TELEGRAM__TOKEN=123:abc\n")
    view = unit.read_view("lastword", root, [])
    assert "warning:" not in view.summary, view.summary
