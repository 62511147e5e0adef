"""MCP in five minutes, as a newcomer meets it: the README's `mcpServers` example, pasted as
written after `pip install mcp-server-time` into lastword's environment, answers a tool call;
and a server that will not start says why in its own words, in `lastword doctor`'s ✗ line and
in a replica's warning, bounded and masked.

Every test puts a decoy `python` (and `python3`) first on PATH, one that cannot run any
server: a bare `python` must still be lastword's own interpreter, the one `mcp_server_time` is
installed in, whatever the shell's `python` is (pyenv's shim, the system's, none).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.console import clean_env
from tests.support.fakes.openai_server import ToolPolicy
from tests.support.waits import eventually
from tests.support.world import CHAT, World

pytestmark = pytest.mark.timeout(90)

ROOT = Path(__file__).resolve().parents[2]

# The README's example, verbatim: a bare `python`, the module pip installed.
README_MCP_SERVERS = (
    '{"mcpServers": {"time": {"command": "python", "args": ["-m", "mcp_server_time"]}}}'
)
# What lastword says a bare `python` runs as, in doctor's lines and the log's.
RESOLVED = f"python = lastword's interpreter {sys.executable}"
SECRET = "SECRET-stderr-token-Hq27vb"
# A server that dies saying a secret, after more than the last words can hold: a line far
# over the bound, then numbered lines, the last of which is what must be told.
LEAKY = (
    "import os, sys\n"
    "print('x' * 10000, file=sys.stderr)\n"
    "for n in range(1, 21):\n"
    "    print(f'complaint {n}', file=sys.stderr)\n"
    "print('token was ' + os.environ['LEAKY_TOKEN'], file=sys.stderr)\n"
    "sys.exit(1)\n"
)


@pytest.fixture
def decoy_path(short_dir: Path) -> str:
    """PATH with a `python` and a `python3` first that fail at once, saying so."""
    decoys = short_dir / "decoys"
    decoys.mkdir()
    for name in ("python", "python3"):
        decoy = decoys / name
        decoy.write_text("#!/bin/sh\necho 'decoy python: not lastword s' >&2\nexit 3\n")
        decoy.chmod(0o755)
    return f"{decoys}{os.pathsep}{os.environ.get('PATH', '')}"


def doctor(
    data_dir: Path, path: str, servers: dict[str, object]
) -> subprocess.CompletedProcess[str]:
    """`lastword doctor` to completion, with these MCP servers and PATH."""
    env = clean_env(
        data_dir,
        PATH=path,
        # The tree under test, not whichever lastword is installed: doctor runs elsewhere, so
        # that no ./.env of the developer's is read.
        PYTHONPATH=str(ROOT),
        LASTWORD_TOOLS__MCP_SERVERS=json.dumps({"mcpServers": servers}),
        LASTWORD_TOOLS__START_TIMEOUT_S="30",
    )
    return subprocess.run(
        [sys.executable, "-m", "bot", "doctor"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=env,
        cwd=data_dir.parent,
        timeout=75,
        check=False,
    )


def line_of(report: str, check: str) -> str:
    [line] = [line for line in report.splitlines() if line.startswith(f"{check}: ")]
    return line


def test_doctor_runs_a_bare_python_as_its_own_and_tells_why_a_server_did_not_start(
    short_dir: Path, decoy_path: str
) -> None:
    servers = {
        "time": {"command": "python", "args": ["-m", "mcp_server_time"]},
        "missing": {"command": "python", "args": ["-m", "no_such_module"]},
        "leaky": {
            "command": sys.executable,
            "args": ["-c", LEAKY],
            "env": {"LEAKY_TOKEN": SECRET},
        },
    }
    result = doctor(short_dir / "data", decoy_path, servers)
    report = result.stdout
    assert result.returncode == 1, report + result.stderr

    # The module only lastword's environment has: found through a bare `python`.
    assert line_of(report, "✓ mcp time").startswith(f"✓ mcp time: {RESOLVED}: 2 tools ")

    missing = line_of(report, "✗ mcp missing")
    assert missing.startswith(f"✗ mcp missing: {RESOLVED}: "), missing
    assert missing.endswith(f"{sys.executable}: No module named no_such_module"), missing
    assert f"{sys.executable} -m pip install" in report

    leaky = line_of(report, "✗ mcp leaky")
    said = leaky.partition("; its stderr ended: ")[2]
    # The last lines, the secret masked, the whole bounded: not the 10,000-character line.
    assert said.endswith("complaint 20 | token was ***"), leaky
    assert len(said) <= 501 and "complaint 15" not in said, said
    assert SECRET not in report + result.stderr

    # The report is all there is: no server's stderr printed apart, before or after it.
    assert result.stderr == ""
    assert all(line.startswith(("✓ ", "✗ ", "! ", "    fix: ")) for line in report.splitlines())


async def test_the_readmes_mcp_example_answers_a_tool_call(world: World, decoy_path: str) -> None:
    world.provider.reply = ToolPolicy(
        "get_current_time", '{"timezone": "UTC"}', answer="It is {result}"
    )
    config = {"LASTWORD_TOOLS__MCP_SERVERS": README_MCP_SERVERS, "PATH": decoy_path}
    async with world.bot("a", **config) as bot:
        await bot.post(world.telegram.private_text_update(CHAT, CHAT, "what time is it?"))
        reply = await world.one_reply()
    assert reply.startswith("It is "), reply
    said = json.loads(reply.removeprefix("It is "))
    assert said["timezone"] == "UTC", reply
    assert bot.running.said(f"MCP server time ({RESOLVED}) is up with 2 tools")


async def test_a_replica_warns_with_the_servers_own_words(world: World, decoy_path: str) -> None:
    missing = {"command": "python", "args": ["-m", "no_such_module"]}
    config = {
        "LASTWORD_TOOLS__MCP_SERVERS": json.dumps({"missing": missing}),
        "PATH": decoy_path,
    }
    warning = (
        f"MCP server missing ({RESOLVED}) is not running: MCPError: Connection closed; "
        f"its stderr ended: {sys.executable}: No module named no_such_module; "
        "starting it again in 1 s"
    )
    async with world.bot("a", **config) as bot:

        async def warned() -> bool:
            return bot.running.said(warning) > 0

        await eventually(warned, 20, what="the warning with the server's last words")
