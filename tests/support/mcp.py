"""MCP servers for the tools tests: the append server over stdio or streamable HTTP, toolboxes
built from settings, and reading what the server recorded."""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from bot.tools import Toolbox, ToolCall, ToolResult
from tests.support import forked

ROOT = Path(__file__).resolve().parents[2]
SERVER = "tests.support.fakes.mcp_append_server"


APPEND_TOOLS = {
    "append",
    "slow",
    "boom",
    "big",
    "read_only_echo",
    "flood",
    "complain",
    "env_names",
    "die",
}


TOKEN = "SECRET-mcp-token-Vq81nz"


Boxes = Callable[..., Awaitable[Toolbox]]


def append_command(env: Mapping[str, str]) -> dict[str, object]:
    """How lastword starts the append server: forked from the zygote, unless it is to
    outlive its stdin (`LW_LINGER`), which only a process of its own can show."""
    if "LW_LINGER" in env:
        return {"command": sys.executable, "args": ["-m", SERVER]}
    return forked.started_by_others(SERVER)


def append_server(folder: Path, **extra: Any) -> dict[str, Any]:
    """The append server's entry in `mcpServers`, writing to files in `folder`."""
    folder.mkdir(exist_ok=True)
    env = {"LW_APPEND_FILE": str(folder / "appended"), "LW_STARTS_FILE": str(folder / "starts")}
    return {
        **append_command(extra.get("env", {})),
        # The server's environment is not ours: `python -m` finds tests/ from the directory.
        "cwd": str(ROOT),
        **extra,
        "env": env | extra.get("env", {}),
    }


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


async def run(
    box: Toolbox, name: str, key: str = "k", timeout_s: float = 5, cap: int = 4000, **args: Any
) -> ToolResult:
    return await box.run(ToolCall("call-1", name, json.dumps(args)), key, timeout_s, cap)
