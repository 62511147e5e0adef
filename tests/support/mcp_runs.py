"""MCP servers as `lastword run`'s settings name them."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.mcp import ROOT, append_command
from tests.support.waits import eventually


def servers(**named: object) -> dict[str, str]:
    return {"LASTWORD_TOOLS__MCP_SERVERS": json.dumps(named)}


def append_server(appended: Path, **env: str) -> dict[str, object]:
    """The test MCP server whose `append` tool writes a line to `appended` per run."""
    return {
        **append_command(env),
        "cwd": str(ROOT),
        "env": {"LW_APPEND_FILE": str(appended), **env},
    }


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


async def appended(path: Path, count: int, within_s: float = 15) -> None:
    """Wait until the side effect has happened `count` times."""

    async def done() -> bool:
        return len(lines(path)) >= count

    await eventually(done, within_s, what=f"{count} side effects in {path.name}")
