"""Keys and tokens as an operator gives them: the README's placeholder or a non-ASCII key is
refused as a setting before anything is sent, an empty Discord token like Telegram's; the key
the environment gives is the one sent, whatever `./.env` says; and a secret in an LLM header
with a name that says nothing of secrets (`Cookie`) shows in no output.

Each runs the installed `lastword` as a process of its own against the loopback fake of an
OpenAI-compatible provider, which records what it was sent.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.support import forked
from tests.support.console import clean_env
from tests.support.fakes.openai_server import FakeOpenAI, ScriptedError

pytestmark = pytest.mark.timeout(90)

PLACEHOLDER_SAID = "this is the README's placeholder"
COOKIE = "session=Qx7-cookie-secret-3f9a"


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as server:
        yield server


async def lastword(
    *args: str, cwd: Path, stdin: str = "", **env: str
) -> subprocess.CompletedProcess[str]:
    """`lastword` to completion (bounded, forked from the zygote) in `cwd` (where `./.env` is
    read), its environment clean but for `env`; awaited, so the fake answers it meanwhile."""
    return await asyncio.to_thread(
        forked.run, *args, env=clean_env(cwd / "data", **env), cwd=cwd, input=stdin, timeout=60
    )


@pytest.mark.parametrize("command", ["doctor", "run"])
async def test_the_readmes_placeholder_key_is_refused_before_anything_is_sent(
    fake: FakeOpenAI, short_dir: Path, command: str
) -> None:
    # As the README's Quickstart has it, pasted unedited.
    (short_dir / ".env").write_text(f"OPENAI_API_KEY=sk-…\nOPENAI_BASE_URL={fake.base_url}\n")
    result = await lastword(command, cwd=short_dir)
    assert result.returncode == 2, result.stdout + result.stderr
    said = (result.stdout + result.stderr).strip().splitlines()
    assert len(said) == 1, said
    assert said[0].startswith(
        ("✗ settings: " if command == "doctor" else "lastword: configuration error: ")
        + f"OPENAI_API_KEY (in ./.env): {PLACEHOLDER_SAID}"
    )
    assert "sk-…" not in said[0].split("placeholder", 1)[0] + said[0].rsplit("given", 1)[-1]
    assert "UnicodeEncodeError" not in said[0]
    assert fake.requests == [] and fake.rejected == []


@pytest.mark.parametrize(
    ("name", "value", "said"),
    [
        ("LASTWORD_LLM__API_KEY", "sk-live-4f2a…", PLACEHOLDER_SAID),
        ("LASTWORD_LLM__API_KEY", "sk-live\u20134f2a9c", "character 8 is not ASCII"),
        ("LASTWORD_TELEGRAM__TOKEN", "777000:AAFk-placeholder…", PLACEHOLDER_SAID),
        ("LASTWORD_DISCORD__TOKEN", "MTIz\u2026", PLACEHOLDER_SAID),
        ("LASTWORD_DISCORD__TOKEN", "", "expected the token, not an empty value; given ''"),
        ("LASTWORD_TELEGRAM__TOKEN", "", "expected the token, not an empty value; given ''"),
    ],
    ids=[
        "key-placeholder",
        "key-en-dash",
        "telegram",
        "discord",
        "discord-empty",
        "telegram-empty",
    ],
)
async def test_a_key_or_token_that_cannot_be_one_is_one_line(
    fake: FakeOpenAI, short_dir: Path, name: str, value: str, said: str
) -> None:
    platform = name.split("__")[0].removeprefix("LASTWORD_").lower()
    env = {name: value, "LASTWORD_LLM__BASE_URL": fake.base_url}
    if platform != "llm":
        env["LASTWORD_PLATFORM"] = platform
    result = await lastword("doctor", cwd=short_dir, **env)
    assert result.returncode == 2, result.stdout + result.stderr
    [line] = result.stdout.splitlines()
    assert line.startswith(f"✗ settings: {name}: {said}"), line
    if value:
        assert value not in line and "given '***'" in line
    assert fake.requests == []


async def test_the_environments_key_is_the_one_sent(fake: FakeOpenAI, short_dir: Path) -> None:
    (short_dir / ".env").write_text(
        f"OPENAI_API_KEY=sk-from-dotenv\nOPENAI_BASE_URL={fake.base_url}\n"
    )
    result = await lastword(
        "run", cwd=short_dir, stdin="hello\n", OPENAI_API_KEY="sk-from-environment"
    )
    assert result.returncode == 0, result.stderr
    assert [request.headers["authorization"] for request in fake.requests] == [
        "Bearer sk-from-environment"
    ]
    # And doctor names the one sent.
    doctor = await lastword("doctor", cwd=short_dir, OPENAI_API_KEY="sk-from-environment")
    assert "key from OPENAI_API_KEY" in doctor.stdout
    assert "key from OPENAI_API_KEY (in ./.env)" not in doctor.stdout
    assert fake.requests[-1].headers["authorization"] == "Bearer sk-from-environment"


def quoting_the_cookie() -> ScriptedError:
    """A provider's refusal that quotes the request's Cookie header back, as proxies do."""
    message = f"Invalid session cookie: {COOKIE}"
    body = {"error": {"message": message, "type": "invalid_request_error", "code": None}}
    return ScriptedError(status=400, body=body)


async def test_a_secret_in_a_neutrally_named_header_shows_nowhere(
    fake: FakeOpenAI, short_dir: Path
) -> None:
    env = {
        "LASTWORD_LLM__BASE_URL": fake.base_url,
        "LASTWORD_LLM__API_KEY": "sk-test-key",
        "LASTWORD_LLM__EXTRA_HEADERS": json.dumps({"Cookie": COOKIE}),
        "LASTWORD_LLM__RETRIES": "0",
        "LASTWORD_LOG_LEVEL": "DEBUG",
    }
    # The bot's logs and its apology.
    fake.fail_next(quoting_the_cookie(), quoting_the_cookie(), quoting_the_cookie())
    run = await lastword("run", cwd=short_dir, stdin="hello\n", **env)
    assert run.returncode == 0, run.stderr
    assert fake.requests and fake.requests[0].headers["cookie"] == COOKIE
    assert "Invalid session cookie: ***" in run.stderr, run.stderr
    # Doctor's report of the refusal.
    fake.fail_next(quoting_the_cookie(), quoting_the_cookie())
    doctor = await lastword("doctor", cwd=short_dir, **env)
    assert doctor.returncode == 1, doctor.stdout
    assert "✗ llm:" in doctor.stdout
    # Status and doctor on a broken mapping: the error names where it breaks, not the text.
    broken = {**env, "LASTWORD_LLM__EXTRA_HEADERS": '{"Cookie": "' + COOKIE + '",}'}
    status = await lastword("status", cwd=short_dir, **broken)
    assert status.returncode == 2
    assert "LASTWORD_LLM__EXTRA_HEADERS" in status.stderr
    outputs = {
        "run": run.stdout + run.stderr,
        "doctor": doctor.stdout + doctor.stderr,
        "status": status.stdout + status.stderr,
    }
    for name, output in outputs.items():
        assert COOKIE not in output and "Qx7-cookie-secret" not in output, name
