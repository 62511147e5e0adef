"""Settings: where each value comes from, and the example files shipped in `config/`.

Priority, highest first: environment, `.env`, the TOML file, defaults (SPEC, configuration
contract). Every test runs in an empty temporary directory with no LASTWORD_* variables, so
the developer's own files and shell cannot leak in.
"""

from __future__ import annotations

import re
import shutil
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from pydantic import BaseModel

import adapters
from adapters.telegram import TelegramSettings
from bot.config.secrets import secrets_of
from bot.config.settings import (
    ENV_PREFIX,
    PLATFORM_SECTIONS,
    ConfigError,
    InstalledSettings,
    Settings,
    load_settings,
    platform_model,
    settings_tree,
)
from bot.ops.check import Check
from bot.store.durability import DEFAULT_WAIT_MS

CONFIG_DIR = Path(__file__).resolve().parents[2] / "config"
EXAMPLE_TOML = CONFIG_DIR / "lastword.example.toml"
EXAMPLE_ENV = CONFIG_DIR / "example.env"


def leaves(model: type[BaseModel], path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every setting as its path in the tree, e.g. ("debounce", "quiet_ms")."""
    found: list[tuple[str, ...]] = []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            found += leaves(annotation, (*path, name))
        else:
            found.append((*path, name))
    return found


def env_name(path: tuple[str, ...]) -> str:
    return ENV_PREFIX + "__".join(path).upper()


# Every setting, the installed platforms' own included.
EVERY = settings_tree(PLATFORM_SECTIONS)
# A value each platform's required settings take here (a token of Telegram's shape).
REQUIRED_VALUE = "123:abc"


def test_defaults(cwd: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = InstalledSettings()
    assert settings.platform == "console"
    assert settings.redis_url is None
    assert settings.debounce.quiet_ms == 2000
    assert settings.debounce.max_wait_ms == 8000
    assert settings.lease.ttl_ms == 30000
    # The store's own default, for a store built without settings (doctor's probe, tests).
    assert settings.durability_wait_ms == DEFAULT_WAIT_MS == 2000
    assert settings.data_dir == cwd.parent / "state" / "lastword"
    monkeypatch.setenv("LASTWORD_PLATFORM", "telegram")
    monkeypatch.setenv("LASTWORD_TELEGRAM__TOKEN", REQUIRED_VALUE)
    telegram = load_settings().section(TelegramSettings)
    assert telegram.api_url == "https://api.telegram.org"
    assert telegram.mode == "polling"
    assert telegram.webhook_path == "/telegram"


def test_priority_env_over_dotenv_over_toml_over_defaults(
    cwd: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (cwd / "lastword.toml").write_text(
        "history_cap = 10\nstarvation_limit = 7\n\n[debounce]\nquiet_ms = 100\nmax_wait_ms = 5000\n"
        '\n[llm]\nmodel = "toml-model"\n'
    )
    toml_only = InstalledSettings()
    assert (toml_only.history_cap, toml_only.debounce.quiet_ms) == (10, 100)

    (cwd / ".env").write_text("LASTWORD_HISTORY_CAP=20\nLASTWORD_DEBOUNCE__QUIET_MS=200\n")
    with_dotenv = InstalledSettings()
    assert (with_dotenv.history_cap, with_dotenv.debounce.quiet_ms) == (20, 200)

    monkeypatch.setenv("LASTWORD_HISTORY_CAP", "30")
    settings = InstalledSettings()
    assert settings.history_cap == 30  # environment
    assert settings.debounce.quiet_ms == 200  # .env
    # A nested group set partly in .env keeps the rest of what the TOML file says.
    assert settings.debounce.max_wait_ms == 5000  # TOML
    assert settings.starvation_limit == 7  # TOML
    assert settings.llm.model == "toml-model"  # TOML
    assert settings.lease.ttl_ms == 30000  # default


def test_nested_names_use_double_underscore(cwd: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LASTWORD_PLATFORM", "telegram")
    monkeypatch.setenv("LASTWORD_TELEGRAM__TOKEN", "123:abc")
    monkeypatch.setenv("LASTWORD_TELEGRAM__MODE", "webhook")
    monkeypatch.setenv("LASTWORD_TELEGRAM__WEBHOOK_SECRET", "shh")
    monkeypatch.setenv("LASTWORD_TELEGRAM__WEBHOOK_LISTEN", "0.0.0.0:9000")
    monkeypatch.setenv("LASTWORD_LEASE__TTL_MS", "4500")
    monkeypatch.setenv("LASTWORD_LLM__API_KEY", "sk-secret")
    settings = load_settings()
    telegram = settings.section(TelegramSettings)
    assert telegram.token.get_secret_value() == "123:abc"
    assert telegram.mode == "webhook"
    assert telegram.webhook_listen == "0.0.0.0:9000"
    assert settings.lease.ttl_ms == 4500
    # Secrets stay out of reprs, hence out of logs and tracebacks.
    assert "sk-secret" not in repr(settings)
    assert "123:abc" not in repr(settings)


def test_nested_names_work_in_dotenv(cwd: Path) -> None:
    (cwd / ".env").write_text("LASTWORD_LLM__MODEL=from-dotenv\nLASTWORD_LEASE__TTL_MS=999\n")
    settings = InstalledSettings()
    assert settings.llm.model == "from-dotenv"
    assert settings.lease.ttl_ms == 999


def test_lastword_config_chooses_the_toml_file(
    cwd: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (cwd / "lastword.toml").write_text("history_cap = 11\n")
    assert InstalledSettings().history_cap == 11  # ./lastword.toml when nothing says otherwise
    chosen = tmp_path / "elsewhere.toml"
    chosen.write_text("history_cap = 42\n[lease]\nttl_ms = 1234\n")
    monkeypatch.setenv("LASTWORD_CONFIG", str(chosen))
    settings = load_settings()
    assert settings.history_cap == 42
    assert settings.lease.ttl_ms == 1234


def test_missing_config_file_is_an_error_naming_it(
    cwd: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LASTWORD_CONFIG", str(cwd / "nope.toml"))
    with pytest.raises(ConfigError, match="LASTWORD_CONFIG"):
        load_settings()


def test_invalid_toml_is_an_error_naming_it(cwd: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bad = cwd / "bad.toml"
    bad.write_text("platform = \n")
    monkeypatch.setenv("LASTWORD_CONFIG", str(bad))
    with pytest.raises(ConfigError, match="LASTWORD_CONFIG"):
        load_settings()


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"LASTWORD_DEBOUNCE__QUIET_MS": "x"}, "LASTWORD_DEBOUNCE__QUIET_MS"),
        (
            {"LASTWORD_DEBOUNCE__QUIET_MS": "500", "LASTWORD_DEBOUNCE__MAX_WAIT_MS": "400"},
            "LASTWORD_DEBOUNCE__MAX_WAIT_MS .*LASTWORD_DEBOUNCE__QUIET_MS",
        ),
        ({"LASTWORD_REDIS_URL": "http://x"}, "LASTWORD_REDIS_URL"),
        ({"LASTWORD_REDIS_URL": "redis://h:port"}, "LASTWORD_REDIS_URL"),
        ({"LASTWORD_PLATFORM": "discord"}, "LASTWORD_DISCORD__TOKEN"),
    ],
)
def test_validation_errors_name_the_setting(
    cwd: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], message: str
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=message) as caught:
        load_settings()
    assert "\n" not in str(caught.value)


def test_empty_redis_url_means_embedded(cwd: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LASTWORD_REDIS_URL", "")
    assert load_settings().redis_url is None


def test_broken_json_is_named_by_where_it_breaks_never_quoted(
    cwd: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The keys down to the break are names (a server's, a variable's); the values are not."""
    servers = '{"gh": {"command": "npx", "env": {"GITHUB_TOKEN": "ghp_s3cret" "X": 1}}}'
    monkeypatch.setenv("LASTWORD_TOOLS__MCP_SERVERS", servers)
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert str(caught.value) == (
        "LASTWORD_TOOLS__MCP_SERVERS: expected JSON such as {\"key\": 1}; Expecting ',' "
        "delimiter at line 1, column 64, under the key gh.env.GITHUB_TOKEN (the text is not "
        "quoted: it may hold a credential)"
    )


def test_json_numbers_are_finite(cwd: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Python's JSON reader takes NaN, which no request body can carry."""
    monkeypatch.setenv("LASTWORD_LLM__EXTRA_BODY", '{"top_k": 40, "penalty": [1, NaN]}')
    with pytest.raises(ConfigError, match="LASTWORD_LLM__EXTRA_BODY: expected finite numbers"):
        load_settings()


@pytest.mark.parametrize("tail", ["/", "#", "?"])
def test_a_redis_password_must_be_percent_encoded(
    cwd: Path, monkeypatch: pytest.MonkeyPatch, tail: str
) -> None:
    """Unencoded, the rest of the password would be read as the path, fragment or query, and
    the part before it as the host."""
    monkeypatch.setenv("LASTWORD_REDIS_URL", f"redis://:ab{tail}cd-s3cret@127.0.0.1:6379/0")
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert str(caught.value) == (
        "LASTWORD_REDIS_URL: an '@' after the host: percent-encode a password's /, ?, # and @ "
        "(as %2F, %3F, %23 and %40); given 'redis://***'"
    )
    encoded = f"redis://:ab{quote(tail, safe='')}cd-s3cret@127.0.0.1:6379/0"
    monkeypatch.setenv("LASTWORD_REDIS_URL", encoded)
    settings = load_settings()
    assert settings.redis_url == encoded
    # Masked in logs as written and as redis-py decodes it.
    assert f"ab{tail}cd-s3cret" in secrets_of(settings)


@pytest.mark.parametrize(
    ("llm", "provider"),
    [
        ({}, "echo"),
        ({"base_url": "http://127.0.0.1:11434/v1"}, "openai"),
        ({"api_key": "sk-x"}, "openai"),
        ({"provider": "openai"}, "openai"),
        ({"provider": "echo", "base_url": "http://h/v1", "api_key": "sk-x"}, "echo"),
    ],
    ids=["nothing", "base-url", "api-key", "explicit-openai", "explicit-echo-wins"],
)
def test_llm_provider_resolution(
    cwd: Path, monkeypatch: pytest.MonkeyPatch, llm: dict[str, str], provider: str
) -> None:
    for name, value in llm.items():
        monkeypatch.setenv(f"LASTWORD_LLM__{name.upper()}", value)
    settings = load_settings()
    assert settings.llm_provider == provider
    # Unset provider stays None, so start-up can tell "chosen" from "fell back to echo".
    assert settings.llm.provider == llm.get("provider")


def dump(settings: Settings) -> dict[str, Any]:
    """The core's settings."""
    return settings.model_dump(exclude=set(PLATFORM_SECTIONS))


def assert_platform_defaults(settings: Settings) -> None:
    """Each platform's section, as given, holds that platform's defaults."""
    for platform in PLATFORM_SECTIONS:
        model = platform_model(platform)
        if model is None:
            continue
        fields = model.model_fields.items()
        required = {name: REQUIRED_VALUE for name, field in fields if field.is_required()}
        given = model.model_validate(getattr(settings, platform) | required)
        assert given == model.model_validate(required), platform


def test_example_toml_loads_and_holds_the_defaults(
    cwd: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    defaults = dump(InstalledSettings())
    monkeypatch.setenv("LASTWORD_CONFIG", str(EXAMPLE_TOML))
    loaded = load_settings()
    assert dump(loaded) == defaults
    assert_platform_defaults(loaded)


def test_example_toml_covers_every_setting() -> None:
    sections: dict[str, str] = {}
    current = ""
    for line in EXAMPLE_TOML.read_text().splitlines():
        header = re.fullmatch(r"\[(\w+)\]", line.strip())
        if header:
            current = header.group(1)
        else:
            sections[current] = sections.get(current, "") + line + "\n"
    for path in leaves(EVERY):
        section, key = (path[0], path[1]) if len(path) == 2 else ("", path[0])
        pattern = rf"^(# )?{key} = "
        assert re.search(pattern, sections.get(section, ""), re.M), f"{'.'.join(path)} missing"


# What an admin must choose, each named (set or commented) in config/example.env; every other
# setting has a default and is left to docs/settings.md, so that later defaults reach installs
# made from the file.
ADMIN_CHOICES = {
    "LASTWORD_PLATFORM",
    "LASTWORD_TELEGRAM__TOKEN",
    "LASTWORD_DISCORD__TOKEN",
    "LASTWORD_LLM__BASE_URL",
    "LASTWORD_LLM__API_KEY",
    "LASTWORD_LLM__MODEL",
    "LASTWORD_REDIS_URL",
}


def test_example_env_names_only_what_an_admin_must_choose() -> None:
    text = EXAMPLE_ENV.read_text()
    named = set(re.findall(r"^(?:# )?(LASTWORD_\w+)=", text, re.M))
    assert named == ADMIN_CHOICES
    # Nothing is set for the admin: neither the console nor a default written out.
    assert re.findall(r"^[^#\s].*$", text, re.M) == []
    assert "docs/settings.md" in text


def test_example_env_loads_as_shipped_and_as_edited(cwd: Path) -> None:
    """Unedited it is the defaults (a unit made from it is warned of as a console bot, see
    tests/config/test_settings_sources.py); each line uncommented as it stands, a bot on
    Telegram."""
    shutil.copy(EXAMPLE_ENV, cwd / ".env")
    assert dump(load_settings()) == dump(InstalledSettings())
    text = EXAMPLE_ENV.read_text().replace("# LASTWORD_DISCORD__TOKEN=", "# not: ")
    (cwd / ".env").write_text(
        re.sub(r"^# (LASTWORD_\w+=)", r"\1", text, flags=re.M)
        .replace("AA...", "AAx")
        .replace("sk-...", "sk-x")
    )
    edited = load_settings()
    assert edited.platform == "telegram"
    assert edited.section(TelegramSettings).token.get_secret_value() == "123456789:AAx"
    assert edited.llm_provider == "openai"
    assert edited.llm.base_url == "https://api.openai.com/v1"
    assert edited.redis_url is not None


def test_examples_name_no_setting_the_code_does_not_have() -> None:
    """The other half of "exactly": a setting removed or renamed in the code must not linger
    in the examples, where an admin would copy it and wonder why nothing changes."""
    known = {env_name(path) for path in leaves(EVERY)} | {"LASTWORD_CONFIG"}
    assert ADMIN_CHOICES - known == set()
    in_toml: set[str] = set()
    section: tuple[str, ...] = ()
    for line in EXAMPLE_TOML.read_text().splitlines():
        header = re.fullmatch(r"\[(\w+)\]", line.strip())
        if header:
            section = (header.group(1),)
            continue
        key = re.match(r"^(?:# )?(\w+) = ", line)
        if key:
            in_toml.add(env_name((*section, key.group(1))))
    assert in_toml - known == set()
    assert len(in_toml) >= len(known) - 1  # and every one is there (LASTWORD_CONFIG is not)


# Platforms are plug-ins: LASTWORD_PLATFORM names an entry point of the `lastword.adapters`
# group, which the built-in platforms register too.

PLUGIN = """
from adapters import Platform
from adapters.console import ConsoleAdapter
from bot.ops.check import Check


async def check(settings, timeout_s):
    return Check("platform", True, f"irc: checked within {timeout_s:g} s")


PLUGIN = Platform(create=lambda settings: ConsoleAdapter(), check=check)
"""


def test_the_builtin_platforms_are_entry_points() -> None:
    import adapters.console
    import adapters.discord
    import adapters.telegram

    found = {entry.name: entry.load() for entry in entry_points(group=adapters.GROUP)}
    assert found["console"] is adapters.console.PLUGIN
    assert found["telegram"] is adapters.telegram.PLUGIN
    assert found["discord"] is adapters.discord.PLUGIN


async def test_any_installed_platform_is_picked_by_name(
    cwd: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An installed distribution, as pip would leave it: its metadata and its module.
    site = tmp_path / "site"
    metadata = site / "lastword_irc-1.0.dist-info"
    metadata.mkdir(parents=True)
    (metadata / "METADATA").write_text("Metadata-Version: 2.1\nName: lastword-irc\nVersion: 1.0\n")
    (metadata / "entry_points.txt").write_text("[lastword.adapters]\nirc = lastword_irc:PLUGIN\n")
    (site / "lastword_irc.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("LASTWORD_PLATFORM", "irc")

    settings = load_settings()
    assert settings.platform == "irc"
    assert "irc" in adapters.installed()
    assert adapters.create(settings).platform == "console"
    assert await adapters.check(settings, 0.5) == Check(
        "platform", True, "irc: checked within 0.5 s"
    )


async def test_a_platform_not_installed_names_the_installed_ones(
    cwd: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The installed plug-ins are package metadata, so the settings check the name at once.
    monkeypatch.setenv("LASTWORD_PLATFORM", "irc")
    with pytest.raises(ConfigError) as caught:
        load_settings()
    message = str(caught.value)
    assert message.startswith("LASTWORD_PLATFORM: no platform 'irc' is installed")
    assert all(name in message for name in ("console", "telegram", "discord"))
    # Where platforms are loaded, the same name is refused the same way.
    with pytest.raises(ConfigError, match="no platform 'irc' is installed"):
        adapters.find("irc")


def test_a_platform_not_chosen_has_its_names_checked_not_its_values(
    cwd: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A host may keep every platform's settings in one file; only the chosen one's are read
    (and must be valid), but a misspelt name is refused whichever platform it belongs to."""
    monkeypatch.setenv("LASTWORD_DISCORD__CATCH_UP_MINUTES", "90")  # past its limit
    assert load_settings().platform == "console"
    monkeypatch.setenv("LASTWORD_DISCORD__TOKNE", "a.b.c")
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert str(caught.value) == (
        "LASTWORD_DISCORD__TOKNE: no such setting (did you mean LASTWORD_DISCORD__TOKEN?)"
    )
    monkeypatch.delenv("LASTWORD_DISCORD__TOKNE")
    monkeypatch.setenv("LASTWORD_PLATFORM", "discord")
    monkeypatch.setenv("LASTWORD_DISCORD__TOKEN", "a.b.c")
    with pytest.raises(ConfigError, match="LASTWORD_DISCORD__CATCH_UP_MINUTES: "):
        load_settings()
