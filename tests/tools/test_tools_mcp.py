"""Tools from MCP servers, each a real process: `mcp-server-time` from PyPI, which nobody here
wrote, and tests/support/fakes/mcp_append_server.py, whose one side effect (a line appended to a
file) is how these tests count the times a call really ran. The toolbox is built as a replica builds
it (`load_toolbox`), and every call goes through `Toolbox.run` with its bounds.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from bot.config.settings import InstalledSettings, ToolsSettings
from bot.tools import CUT_NOTE, ToolResult
from bot.tools.mcp import KEY_META
from tests.support import forked
from tests.support.mcp import APPEND_TOOLS, TOKEN, Boxes, append_server, lines, run

pytestmark = pytest.mark.timeout(30)


async def test_the_time_server_from_pypi_tells_the_time(boxes: Boxes) -> None:
    time_server = forked.started_by_others("mcp_server_time", "--local-timezone", "UTC")
    box = await boxes(mcp_servers={"time": time_server})
    tool = box.get("get_current_time")
    assert tool is not None
    assert (tool.source, tool.side_effects) == ("mcp:time", False)  # it says readOnlyHint
    assert tool.parameters["required"] == ["timezone"]
    result = await run(box, "get_current_time", timezone="UTC")
    assert not result.error, result.text
    told = datetime.fromisoformat(json.loads(result.text)["datetime"])
    assert abs((told - datetime.now(UTC)).total_seconds()) < 60


async def test_one_call_appends_once_with_its_key(boxes: Boxes, tmp_path: Path) -> None:
    box = await boxes(mcp_servers={"app": append_server(tmp_path)})
    assert {tool.name for tool in box.offered(admin=True)} == APPEND_TOOLS
    result = await run(box, "append", key="conv:7:2", text="milk")
    assert result == ToolResult("appended milk", False)
    assert lines(tmp_path / "appended") == ["milk\tconv:7:2"]
    assert KEY_META == "lastword/idempotency-key"


async def test_a_slow_call_times_out_and_the_server_still_works(
    boxes: Boxes, tmp_path: Path
) -> None:
    box = await boxes(mcp_servers={"app": append_server(tmp_path)})
    began = time.monotonic()
    result = await run(box, "slow", timeout_s=0.5, seconds=20)
    assert time.monotonic() - began < 2
    assert (result.text, result.error) == ("error: the tool did not answer within 0.5 s", True)
    echoed = await run(box, "read_only_echo", text="still here")
    assert (echoed.text, echoed.error) == ("still here", False)


async def test_a_long_output_is_cut_with_a_note(boxes: Boxes, tmp_path: Path) -> None:
    box = await boxes(mcp_servers={"app": append_server(tmp_path)})
    result = await run(box, "big", cap=100, n=5000)
    assert result.text == "x" * 100 + CUT_NOTE.format(total=5000, kept=100)
    assert not result.error


async def test_a_failing_tool_is_an_error_result(boxes: Boxes, tmp_path: Path) -> None:
    box = await boxes(mcp_servers={"app": append_server(tmp_path)})
    result = await run(box, "boom")
    assert result.error
    assert result.text == (
        "error: the tool failed: ToolError: Error executing tool boom: the boom tool always fails"
    )


async def test_a_server_that_dies_mid_call_is_restarted(
    boxes: Boxes, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    box = await boxes(mcp_servers={"app": append_server(tmp_path)})
    with caplog.at_level(logging.WARNING, logger="bot.tools.mcp"):
        died = await run(box, "die")
        assert died.error
        assert "went away during the call: its outcome is unknown" in died.text
        # The next call waits for the restart (1 s of backoff, then the start).
        result = await run(box, "append", timeout_s=10, text="after")
    assert (result.text, result.error) == ("appended after", False)
    assert len(lines(tmp_path / "starts")) == 2
    assert {tool.name for tool in box.offered(admin=True)} == APPEND_TOOLS
    [warning] = [r.getMessage() for r in caplog.records if r.name == "bot.tools.mcp"]
    assert warning == (
        f"MCP server app ({sys.executable}) is not running: its session ended (the server "
        "exited or closed the connection); starting it again in 1 s"
    )


async def test_side_effects_come_from_the_hint_unless_configured(
    boxes: Boxes, tmp_path: Path
) -> None:
    hinted = append_server(tmp_path / "hinted")
    configured = append_server(
        tmp_path / "configured",
        sideEffects=False,
        tools={"read_only_echo": {"sideEffects": True}},
    )
    box = await boxes(mcp_servers={"hinted": hinted, "configured": configured})

    def side_effects(source: str) -> dict[str, bool]:
        return {
            tool.name.removeprefix("configured_"): tool.side_effects
            for tool in box.offered(admin=True)
            if tool.source == source
        }

    # The same names on each replica, whichever server started first: the first configured
    # keeps them.
    assert {tool.name for tool in box.offered(admin=True) if tool.source == "mcp:hinted"} == (
        APPEND_TOOLS
    )
    # No hint (append, die) is taken to have side effects.
    assert side_effects("mcp:hinted") == {
        "append": True,
        "die": True,
        "slow": False,
        "boom": False,
        "big": False,
        "read_only_echo": False,
        "flood": False,
        "complain": False,
        "env_names": False,
    }
    assert side_effects("mcp:configured") == {
        "append": False,
        "die": False,
        "slow": False,
        "boom": False,
        "big": False,
        "read_only_echo": True,
        "flood": False,
        "complain": False,
        "env_names": False,
    }


async def test_tools_can_be_for_admins_only(boxes: Boxes, tmp_path: Path) -> None:
    server = append_server(tmp_path, adminOnly=True, tools={"read_only_echo": {"adminOnly": False}})
    box = await boxes(mcp_servers={"app": server})
    assert [tool.name for tool in box.offered(admin=False)] == ["read_only_echo"]
    assert {tool.name for tool in box.offered(admin=True)} == APPEND_TOOLS
    echo = box.get("read_only_echo")
    assert echo is not None and echo.title == "Echo, read only"


async def test_a_server_that_does_not_start_is_a_warning_and_is_retried_calmly(
    boxes: Boxes, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    missing = {"command": str(tmp_path / "no-such-server"), "env": {"TOKEN": TOKEN}}
    with caplog.at_level(logging.INFO, logger="bot.tools.mcp"):
        box = await boxes(mcp_servers={"gone": missing})
        # Back before the server's next attempt (1 s later): the start does not wait for it.
        assert len([r for r in caplog.records if r.name == "bot.tools.mcp"]) <= 1
        assert box.offered(admin=True) == []
        result = await run(box, "anything")
        assert result.error
        # Nothing to poll for: what is checked is how few retries a while brings.
        await asyncio.sleep(1.5)
    said = [r for r in caplog.records if r.name == "bot.tools.mcp"]
    warnings = [r.getMessage() for r in said if r.levelno == logging.WARNING]
    assert warnings == [
        f"MCP server gone ({missing['command']}) is not running: FileNotFoundError: "
        f"[Errno 2] No such file or directory: '{missing['command']}'; starting it again in 1 s"
    ]
    # Started at once, then after 1 s: a backoff, not a tight loop.
    assert 1 <= len(said) <= 2
    assert all(TOKEN not in r.getMessage() for r in caplog.records)


async def test_a_server_that_comes_up_later_has_its_tools_offered_then(
    boxes: Boxes, tmp_path: Path
) -> None:
    flaky = append_server(tmp_path, env={"LW_FAIL_ONCE": str(tmp_path / "failed")})
    box = await boxes(mcp_servers={"app": flaky})
    assert box.offered(admin=True) == []
    # The same toolbox: the server's tools join it when its second start (after 1 s) lists
    # them.
    deadline = time.monotonic() + 10
    while box.get("append") is None:
        assert time.monotonic() < deadline, "the tools never came"
        await asyncio.sleep(0.05)
    assert {tool.name for tool in box.offered(admin=True)} == APPEND_TOOLS
    result = await run(box, "append", text="late")
    assert (result.text, result.error) == ("appended late", False)
    assert len(lines(tmp_path / "starts")) == 2


async def test_a_streamable_http_server_with_headers(
    boxes: Boxes, http_server: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = {"url": http_server, "headers": {"Authorization": f"Bearer {TOKEN}"}}
    with caplog.at_level(logging.DEBUG):
        box = await boxes(mcp_servers={"web": server})
        assert {tool.name for tool in box.offered(admin=True)} == APPEND_TOOLS
        result = await run(box, "append", key="conv:1:0", text="over http")
    assert (result.text, result.error) == ("appended over http", False)
    assert lines(tmp_path / "appended") == ["over http\tconv:1:0"]
    assert all(TOKEN not in r.getMessage() for r in caplog.records)


async def test_a_streamable_http_server_refusing_the_headers_is_a_warning(
    boxes: Boxes, http_server: str, caplog: pytest.LogCaptureFixture
) -> None:
    server = {"url": http_server, "headers": {"Authorization": "Bearer wrong"}}
    with caplog.at_level(logging.WARNING, logger="bot.tools.mcp"):
        box = await boxes(mcp_servers={"web": server})
    assert box.offered(admin=True) == []
    [warning] = [r.getMessage() for r in caplog.records if r.name == "bot.tools.mcp"]
    # Scheme, host and port only: a URL's path and query may hold a credential.
    origin = http_server.removesuffix("/mcp")
    assert warning.startswith(f"MCP server web ({origin}/***) is not running: ")


async def test_close_ends_a_server_that_ignores_the_end_of_its_input(
    boxes: Boxes, tmp_path: Path
) -> None:
    box = await boxes(mcp_servers={"app": append_server(tmp_path, env={"LW_LINGER": "1"})})
    [start] = lines(tmp_path / "starts")
    pid = int(start.split()[0])
    began = time.monotonic()
    await box.close()
    # The SDK waits 2 s for it to exit, then SIGTERM, 2 s more, then SIGKILL.
    assert time.monotonic() - began < 8
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_an_mcp_servers_headers_and_credential_env_are_never_logged() -> None:
    from bot.config.secrets import secrets_of

    servers = {
        "remote": {"url": "https://mcp.example/mcp", "headers": {"Authorization": "Bearer s3cr3t"}},
        "local": {"command": "srv", "env": {"GITHUB_TOKEN": "ghp_abcdef", "TZ": "Europe/Paris"}},
    }
    hidden = secrets_of(
        InstalledSettings(tools=ToolsSettings.model_validate({"mcp_servers": servers}))
    )
    assert "Bearer s3cr3t" in hidden and "ghp_abcdef" in hidden
    assert "Europe/Paris" not in hidden
