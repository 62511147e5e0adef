"""No planted secret reaches any output: every setting that can hold a credential is given
one, in every way an operator may put it there, and what the real `lastword` process prints
(its configuration error line, `doctor`'s report, `status`, and its whole log at DEBUG) is
searched for it.

The ways: unparseable JSON holding a token (`LASTWORD_TOOLS__MCP_SERVERS`,
`…__EXTRA_HEADERS`, `…__EXTRA_BODY`), JSON that parses (a header, a body field named as a
key), a Redis password with an unencoded `/` or `#`, in the query (`?password=`,
`?sentinel_password=`) or in the user info, an MCP entry's `args` token and the user info of
its `url` (in a valid entry, and in a wrong one that is quoted in an error), the user info of
every other URL setting (a valid URL and a wrong one), and every `SecretStr` setting (a valid
value, and a wrong one). The `SecretStr` and URL settings are found by walking the settings
tree, the installed platforms' included, so a new one is covered without a word here.

Each planting is run through `run`, `status` and `doctor`; every service named is a closed
loopback port, so each command ends quickly with what it says about failing to reach it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import signal
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from pydantic import BaseModel

from bot.config import spelling
from bot.config.settings import ENV_PREFIX, PLATFORM_SECTIONS, settings_tree
from tests.support.fakes.loopback import free_port
from tests.support.forked import spawn
from tests.support.setting_fields import setting_fields

pytestmark = pytest.mark.timeout(300)

# What a replica logs once it accepts messages.
RUNNING = "lastword is running"
# Processes at once: each starts an embedded store and a Python interpreter. The suite runs
# the three commands' walks beside other tests, whose timings a burst of starting
# interpreters would stretch.
AT_ONCE = 2
# One command, from its start to its exit (a running bot is stopped once it runs).
COMMAND_TIMEOUT_S = 60.0
# A platform's required secret, when another of its settings is the one planted.
REQUIRED = {"telegram": {"TELEGRAM__TOKEN": "123:abc"}, "discord": {"DISCORD__TOKEN": "a.b.c"}}
# A secret setting's value in the shape its platform takes (a Telegram token is `<id>:<key>`).
SHAPED = {"TELEGRAM__TOKEN": "123456:{secret}"}
# An MCP server over stdio that exits saying its command line on stderr, which the replica
# logs (before its start counts as failed) and doctor reports.
ECHOING_SERVER = "import sys; sys.exit(' '.join(sys.argv))"


@dataclass(frozen=True)
class Planting:
    """A secret put in some settings: the variables (without the prefix), and how `run`
    ends with them (2: a configuration error; 1: the store cannot be reached; 0: it ran),
    and what `run` says where the secret would be, masked, if it says it at all."""

    name: str
    secret: str
    env: dict[str, str]
    run_exit: int
    platform: str = "console"
    run_says: str = ""


def _secret(name: str) -> str:
    """A secret of its own for each planting, so a leak says which."""
    return "Pl4nted-" + hashlib.sha256(name.encode()).hexdigest()[:16]


def _leaves(tree: type[BaseModel]) -> Iterator[tuple[tuple[str, ...], object, object]]:
    """Every setting as (path, annotation, default)."""
    for path, info in setting_fields(tree):
        default = None if info.is_required() else info.get_default(call_default_factory=True)
        yield path, info.annotation, default


def _platform_of(path: tuple[str, ...]) -> str:
    return path[0] if path[0] in PLATFORM_SECTIONS else "console"


def _platform_env(platform: str, port: int) -> dict[str, str]:
    """The platform chosen, its required secret given, and every URL of its own at the closed
    port (so nothing leaves the machine)."""
    if platform == "console":
        return {}
    env = {"PLATFORM": platform, **REQUIRED.get(platform, {})}
    for path, _, default in _leaves(settings_tree((platform,))):
        if path[0] == platform and isinstance(default, str) and "://" in default:
            scheme = default.partition("://")[0]
            env[spelling.env_name("", path)] = f"{scheme}://127.0.0.1:{port}"
    return env


def secret_settings(port: int) -> Iterator[Planting]:
    """Every `SecretStr` setting, given a valid secret and one with a space inside."""
    for path, annotation, _ in _leaves(settings_tree(PLATFORM_SECTIONS)):
        if "SecretStr" not in str(annotation):
            continue
        name = spelling.env_name("", path)
        platform = _platform_of(path)
        base = _platform_env(platform, port)
        if platform == "console":
            # An OpenAI client at the closed port: the key is sent (and refused by no one).
            base = {"LLM__BASE_URL": f"http://127.0.0.1:{port}/v1"}
        valid = _secret(name)
        yield Planting(
            f"{name}-valid",
            valid,
            base | {name: SHAPED.get(name, "{secret}").format(secret=valid)},
            0,
            platform,
        )
        wrong = _secret(name + "-wrong")
        yield Planting(f"{name}-wrong", wrong, base | {name: f"sk-{wrong} {wrong}"}, 2, platform)


def url_settings(port: int) -> Iterator[Planting]:
    """Every URL setting but the store's (whose own ways are below), with a password in its
    user info, which they refuse (their clients send a credential of their own): at the
    closed port, and with a scheme it does not take."""
    for path, _, default in _leaves(settings_tree(PLATFORM_SECTIONS)):
        if path == ("redis_url",) or not path[-1].endswith("url"):
            continue
        name = spelling.env_name("", path)
        platform = _platform_of(path)
        base = _platform_env(platform, port)
        scheme = default.partition("://")[0] if isinstance(default, str) else "http"
        valid = _secret(name)
        url = f"{scheme}://user:{valid}@127.0.0.1:{port}/v1"
        yield Planting(f"{name}-userinfo", valid, base | {name: url}, 2, platform)
        wrong = _secret(name + "-wrong")
        yield Planting(
            f"{name}-wrong", wrong, base | {name: f"ftp://user:{wrong}@127.0.0.1/"}, 2, platform
        )


def _servers(name: str, server: dict[str, object]) -> str:
    return json.dumps({name: server})


def plantings(port: int) -> list[Planting]:
    """Every planting, each with a secret of its own. Broken JSON is a brace or a comma
    missing, as in a hand-edited file."""
    s = _secret
    found = [
        Planting(
            "mcp-servers-broken-json",
            s("mcp-json"),
            {"TOOLS__MCP_SERVERS": _servers("gh", {"env": {"GITHUB_TOKEN": s("mcp-json")}})[:-1]},
            2,
        ),
        Planting(
            "extra-headers-broken-json",
            s("headers-json"),
            {"LLM__EXTRA_HEADERS": json.dumps({"api-key": s("headers-json")})[:-1]},
            2,
        ),
        Planting(
            "extra-body-broken-json",
            s("body-json"),
            {"LLM__EXTRA_BODY": json.dumps({"api_key": s("body-json")}).replace("}", ' "x": 1}')},
            2,
        ),
        Planting(
            "extra-headers",
            s("headers"),
            {
                "LLM__BASE_URL": f"http://127.0.0.1:{port}/v1",
                "LLM__EXTRA_HEADERS": json.dumps({"api-key": s("headers")}),
            },
            0,
        ),
        Planting(
            "extra-body",
            s("body"),
            {
                "LLM__BASE_URL": f"http://127.0.0.1:{port}/v1",
                "LLM__EXTRA_BODY": json.dumps({"api_key": s("body")}),
            },
            0,
        ),
        # The tail of a password after an unencoded / or #: what redis-py would read as the
        # path or the fragment.
        Planting(
            "redis-password-slash",
            s("slash"),
            {"REDIS_URL": f"redis://:ab/{s('slash')}@127.0.0.1:{port}/0"},
            2,
        ),
        Planting(
            "redis-password-hash",
            s("hash"),
            {"REDIS_URL": f"redis://:ab#{s('hash')}@127.0.0.1:{port}/0"},
            2,
        ),
        Planting(
            "redis-password-query",
            s("query"),
            {"REDIS_URL": f"redis://127.0.0.1:{port}/0?password={s('query')}"},
            1,
        ),
        Planting(
            "redis-password-userinfo",
            s("userinfo"),
            {"REDIS_URL": f"redis://admin:{s('userinfo')}@127.0.0.1:{port}/0"},
            1,
        ),
        Planting(
            "redis-sentinel-password-query",
            s("sentinel"),
            {
                "REDIS_URL": f"redis+sentinel://127.0.0.1:{port}/mymaster"
                f"?sentinel_password={s('sentinel')}"
            },
            1,
        ),
        Planting(
            "mcp-args-token",
            s("args"),
            {
                "TOOLS__MCP_SERVERS": _servers(
                    "echoing",
                    {
                        "command": sys.executable,
                        "args": ["-c", ECHOING_SERVER, "--token", s("args")],
                    },
                ),
            },
            0,
            run_says="MCP server echoing stderr: -c --token ***",
        ),
        Planting(
            "mcp-args-token-wrong-entry",
            s("args-wrong"),
            {
                "TOOLS__MCP_SERVERS": _servers(
                    "gh",
                    {
                        "command": "npx",
                        "args": ["--token", s("args-wrong")],
                        "url": f"http://127.0.0.1:{port}/mcp",
                    },
                )
            },
            2,
        ),
        Planting(
            "mcp-url-userinfo",
            s("mcp-url"),
            {
                "TOOLS__MCP_SERVERS": _servers(
                    "web", {"url": f"http://user:{s('mcp-url')}@127.0.0.1:{port}/mcp"}
                ),
                "TOOLS__START_TIMEOUT_S": "1",
            },
            0,
        ),
        Planting(
            "mcp-url-userinfo-wrong-entry",
            s("mcp-url-wrong"),
            {
                "TOOLS__MCP_SERVERS": _servers(
                    "web",
                    {
                        "url": f"http://user:{s('mcp-url-wrong')}@127.0.0.1:{port}/mcp",
                        "command": "npx",
                    },
                )
            },
            2,
        ),
    ]
    found += secret_settings(port)
    found += url_settings(port)
    assert len({planting.secret for planting in found}) == len(found), "two share a secret"
    return found


def environment(planting: Planting, work: Path) -> dict[str, str]:
    """The planting's settings over this environment's, less any lastword or OpenAI one."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith((ENV_PREFIX, "OPENAI_")) and k not in ("NOTIFY_SOCKET",)
    }
    env |= {
        "XDG_STATE_HOME": str(work / "state"),
        f"{ENV_PREFIX}DATA_DIR": str(work / "data"),
        f"{ENV_PREFIX}LOG_LEVEL": "DEBUG",
    }
    return env | {ENV_PREFIX + name: value for name, value in planting.env.items()}


async def output_of(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[int, str]:
    """Run `lastword *argv` to its end (a bot that runs on a platform is stopped with SIGTERM
    once it says it runs: by then it has logged in and started everything); its exit status
    and everything it wrote on stdout and stderr."""
    process = await spawn(
        *argv,
        env=env,
        cwd=cwd,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )
    assert process.stdout is not None
    lines: list[str] = []
    stops = argv == ["run"] and env.get(f"{ENV_PREFIX}PLATFORM", "console") != "console"
    try:
        async with asyncio.timeout(COMMAND_TIMEOUT_S):
            async for raw in process.stdout:
                lines.append(raw.decode(errors="replace"))
                if stops and RUNNING in lines[-1] and process.returncode is None:
                    process.send_signal(signal.SIGTERM)
            code = await process.wait()
    finally:
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
    return code, "".join(lines)


@pytest.mark.parametrize("command", ["run", "status", "doctor"])
async def test_no_planted_secret_reaches_any_output(command: str, short_dir: Path) -> None:
    port = free_port()
    every = plantings(port)
    # The walks found what they walk: each platform's token and URLs, the core's keys.
    names = {planting.name for planting in every}
    assert {"TELEGRAM__TOKEN-valid", "DISCORD__TOKEN-wrong", "LLM__API_KEY-valid"} <= names
    assert {"TELEGRAM__API_URL-wrong", "DISCORD__GATEWAY_URL-userinfo"} <= names
    assert "LLM__BASE_URL-userinfo" in names
    at_once = asyncio.Semaphore(AT_ONCE)

    async def check(number: int, planting: Planting) -> str | None:
        """What is wrong with this planting's output, if anything."""
        # Short: the embedded store's socket goes in it.
        work = short_dir / str(number)
        work.mkdir()
        async with at_once:
            code, output = await output_of([command], environment(planting, work), work)
        if planting.secret in output:
            return f"{planting.name}: the secret is in the output of {command}:\n{output}"
        if command == "run" and planting.run_says not in output:
            return f"{planting.name}: run did not say {planting.run_says!r}:\n{output}"
        if "Traceback (most recent call last)" in output and planting.run_exit == 2:
            return f"{planting.name}: a traceback instead of one line:\n{output}"
        wanted = {"run": planting.run_exit, "status": 2 if planting.run_exit == 2 else 1}
        if wanted.get(command, code) != code:
            return f"{planting.name}: {command} exited {code}, not {wanted[command]}:\n{output}"
        if command == "doctor" and (code == 2) != (planting.run_exit == 2):
            return f"{planting.name}: doctor exited {code}:\n{output}"
        return None

    problems = [
        p
        for p in await asyncio.gather(*map(check, *zip(*enumerate(every), strict=True)))
        if p is not None
    ]
    assert not problems, "\n\n".join(problems)
