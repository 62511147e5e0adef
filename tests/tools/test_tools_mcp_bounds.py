"""Bounds on what an MCP server may send lastword, and on what it sees of lastword, each against
a real server process (tests/support/fakes/mcp_append_server.py) in toolboxes built as a replica
builds them:

- a message over the size limit stops the server and restarts it, and the call it answered is
  an error result (not an unknown outcome); the next call works once the server is back;
- a 100 MB answer never stalls the loop (its worst lag is measured, start to restart);
- a 3 MB error, or a long line on the server's stderr, makes no long log line, in lastword's
  log or on the process's own stderr;
- the server's stderr reaches the log masked and tagged with its name, a flood of it is
  rate-limited, and the server is never blocked writing it;
- the server starts with a minimal environment, never the replica's settings or keys;
- URLs are shown as scheme, host and port only, in logs and in `doctor`, which neither mangles
  its report with an empty value nor stays silent about tool schemas too big for the context.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import sys
import time
from pathlib import Path

import pytest

from bot.config.settings import McpServer
from bot.ops.doctor import Caution, exit_code, render
from bot.tools.mcp import McpSource, TooLong
from bot.tools.stdio import CHATTER_PER_S, MAX_MESSAGE_BYTES
from tests.support.doctor import by_name, closed_port, run_checks
from tests.support.factories import SettingsFactory
from tests.support.loop_watch import watched
from tests.support.mcp import TOKEN, Boxes, append_server, lines, run
from tests.support.mcp_secrets import PATH_SECRET, QUERY_SECRET
from tests.support.waits import eventually

pytestmark = pytest.mark.timeout(60)

# Lines a flooding server writes on its stderr: far more than a pipe holds.
FLOOD_LINES = 100_000
# What a log line may take at most, and the loop's worst lag allowed.
LONGEST_LINE = 4096
WORST_LAG_S = 0.1


def mcp_said(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "bot.tools.mcp"]


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


async def test_an_answer_over_the_limit_restarts_the_server_and_is_an_error(
    boxes: Boxes, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    box = await boxes(mcp_servers={"app": append_server(tmp_path)})
    [first] = lines(tmp_path / "starts")
    with caplog.at_level(logging.WARNING, logger="bot.tools.mcp"):
        result = await run(box, "flood", timeout_s=10, n=MAX_MESSAGE_BYTES)
        # It answered: an error, whose outcome is known.
        assert (result.error, result.unknown) == (True, False)
        assert result.text == (
            "error: the tool failed: TooLong: the answer of the MCP server app was over "
            f"{MAX_MESSAGE_BYTES} bytes, so the server was stopped and is restarted"
        )
        # The next call waits for the restart (1 s of backoff, then the start).
        echoed = await run(box, "read_only_echo", timeout_s=10, text="back")
    assert (echoed.text, echoed.error) == ("back", False)
    assert len(lines(tmp_path / "starts")) == 2
    assert gone(int(first.split()[0]))
    assert mcp_said(caplog) == [
        f"MCP server app wrote a message over {MAX_MESSAGE_BYTES} bytes "
        "(LASTWORD_TOOLS__MAX_MESSAGE_BYTES): stopping it",
        f"MCP server app ({sys.executable}) is not running: it wrote a message over "
        f"{MAX_MESSAGE_BYTES} bytes, so it was stopped; starting it again in 1 s",
    ]


async def test_a_sources_limit_is_its_own(tmp_path: Path) -> None:
    config = McpServer.model_validate(append_server(tmp_path))
    source = McpSource("app", config, 10, lambda source, tools: None, max_message_bytes=65_536)
    source.start()
    try:
        await asyncio.wait_for(source.tried.wait(), 10)
        assert await source.call("read_only_echo", {"text": "small"}, "k") == "small"
        with pytest.raises(TooLong, match="was over 65536 bytes"):
            await source.call("flood", {"n": 65_536}, "k")
    finally:
        await source.close()


async def test_a_100_mb_answer_never_stalls_the_loop(boxes: Boxes, tmp_path: Path) -> None:
    box = await boxes(mcp_servers={"app": append_server(tmp_path)})
    with watched() as watch:
        result = await run(box, "flood", timeout_s=20, n=100_000_000)
        # Through the stop and the restart too.
        echoed = await run(box, "read_only_echo", timeout_s=10, text="back")
    assert result.error and "TooLong" in result.text, result.text
    assert echoed.text == "back"
    print(f"100 MB answer to restart: loop held {watch.held_s * 1e3:.1f} ms at most", end="")
    print(f" (its timers up to {watch.late_s * 1e3:.1f} ms late)")
    assert watch.held_s < WORST_LAG_S


async def test_a_3_mb_error_makes_no_long_log_line(
    boxes: Boxes,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    with caplog.at_level(logging.DEBUG):
        box = await boxes(mcp_servers={"app": append_server(tmp_path)})
        # What is checked is the log, not the time: the fake server logs the 3 MB error on
        # its stderr, one line, before it answers (plainly: wrapped by rich, as its SDK would,
        # it took seconds of CPU, past 30 s on a loaded machine).
        result = await run(box, "boom", timeout_s=30, pad=3_000_000)
        # Stopped, so that all it wrote on its stderr has been read.
        await box.close()
    assert result.error and result.text.startswith("error: the tool failed: ToolError: Error ex")
    formatter = logging.Formatter()
    assert max(len(formatter.format(r)) for r in caplog.records) < LONGEST_LINE
    # Not the server's own stderr straight onto the replica's either.
    assert max(map(len, capfd.readouterr().err.splitlines()), default=0) < LONGEST_LINE


async def test_a_long_stderr_line_is_cut_with_its_size(
    boxes: Boxes, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="bot.tools.mcp"):
        box = await boxes(mcp_servers={"app": append_server(tmp_path)})
        await run(box, "complain", text="y" * 100_000)

        async def cut() -> list[str]:
            return [m for m in mcp_said(caplog) if "stderr" in m]

        said = await eventually(cut, what="the stderr line in the log")
    assert said == ["MCP server app stderr: " + "y" * 300 + "… [100000 bytes]"]


async def test_the_servers_stderr_is_logged_masked_and_tagged(
    boxes: Boxes,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    server = append_server(tmp_path, env={"NOTES_TOKEN": TOKEN})
    with caplog.at_level(logging.INFO, logger="bot.tools.mcp"):
        box = await boxes(mcp_servers={"notes": server})
        result = await run(box, "complain", text="my token is $NOTES_TOKEN")
        assert result.text == "complained 1 times"

        async def stderr() -> list[str]:
            return [m for m in mcp_said(caplog) if "stderr" in m]

        said = await eventually(stderr, what="the stderr line in the log")
    assert said == ["MCP server notes stderr: my token is ***"]
    assert all(TOKEN not in r.getMessage() for r in caplog.records)
    assert TOKEN not in capfd.readouterr().err


async def test_a_flood_of_stderr_is_rate_limited_and_never_blocks_the_server(
    boxes: Boxes, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="bot.tools.mcp"):
        box = await boxes(mcp_servers={"app": append_server(tmp_path)})
        began = time.monotonic()
        # A server blocked on a full pipe would never answer.
        result = await run(box, "complain", timeout_s=20, text="noise", times=FLOOD_LINES)
        assert (result.text, result.error) == (f"complained {FLOOD_LINES} times", False)

        async def counted() -> tuple[int, int] | None:
            said = mcp_said(caplog)
            logged = said.count("MCP server app stderr: noise")
            dropped = sum(
                int(m.split()[3])
                for m in said
                if m.endswith("more lines not logged (at most 20 a second are)")
            )
            return (logged, dropped) if logged + dropped == FLOOD_LINES else None

        counts = await eventually(counted, what="every line logged or counted as dropped")
        seconds = time.monotonic() - began
    assert counts is not None  # `eventually` returns what was true
    logged, dropped = counts
    assert dropped > 0
    assert logged <= CHATTER_PER_S * (seconds + 1)


async def test_a_server_sees_a_minimal_environment(
    boxes: Boxes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The replica's own settings and keys, and what the SDK's transport passed on.
    monkeypatch.setenv("LASTWORD_LLM__API_KEY", "sk-the-replicas-own")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-the-replicas-openai-key")
    monkeypatch.setenv("USER", "lastword")
    monkeypatch.setenv("SHELL", "/bin/sh")
    monkeypatch.setenv("TZ", "Europe/Paris")
    server = append_server(tmp_path, env={"NOTES_TOKEN": TOKEN})
    box = await boxes(mcp_servers={"app": server})
    result = await run(box, "env_names")
    names = set(json.loads(result.text))
    own = {"LW_APPEND_FILE", "LW_STARTS_FILE", "NOTES_TOKEN"}
    assert names - own <= {"PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ"}, names
    assert {"PATH", "TZ"} | own <= names


async def test_a_servers_url_is_logged_as_scheme_host_and_port(
    boxes: Boxes, http_server: str, caplog: pytest.LogCaptureFixture
) -> None:
    origin = http_server.removesuffix("/mcp")
    hidden = {
        "url": f"{origin}/s/{PATH_SECRET}/mcp?api_key={QUERY_SECRET}",
        "headers": {"Authorization": f"Bearer {TOKEN}"},
    }
    with caplog.at_level(logging.DEBUG, logger="bot.tools.mcp"):
        await boxes(mcp_servers={"hidden": hidden})
    [warning] = mcp_said(caplog)
    assert warning.startswith(f"MCP server hidden ({origin}/***) is not running: ")
    for secret in (PATH_SECRET, QUERY_SECRET, TOKEN):
        assert all(secret not in m for m in mcp_said(caplog))


async def test_doctor_shows_a_url_as_scheme_host_and_port(make_settings: SettingsFactory) -> None:
    origin = f"http://127.0.0.1:{closed_port()}"
    url = f"{origin}/s/{PATH_SECRET}/mcp?api_key={QUERY_SECRET}"
    settings = make_settings(tools={"mcp_servers": {"web": {"url": url}}, "start_timeout_s": 2})
    checks = await run_checks(settings)
    web = by_name(checks)["mcp web"]
    assert web.detail == f"{origin}/***: ConnectError: All connection attempts failed"
    report = render(checks)
    assert PATH_SECRET not in report and QUERY_SECRET not in report


async def test_doctor_masks_no_empty_or_short_value(
    make_settings: SettingsFactory, short_dir: Path
) -> None:
    missing = str(short_dir / "no-such-server")
    server = {"command": missing, "env": {"EMPTY": "", "ON": "1", "MODE": "on"}}
    settings = make_settings(tools={"mcp_servers": {"gone": server}, "start_timeout_s": 2})
    gone = by_name(await run_checks(settings))["mcp gone"]
    assert gone.detail == (
        f"{missing}: FileNotFoundError: [Errno 2] No such file or directory: '{missing}'"
    )


async def test_doctor_fails_a_toolbox_that_does_not_fit_the_context(
    make_settings: SettingsFactory, tmp_path: Path
) -> None:
    """The replicas leave out of every request the tools that do not fit a quarter of the
    prompt's budget (bot.tools.fit): users never reach those, so doctor says ✗ and names them,
    in the toolbox's order."""
    settings = make_settings(
        llm={"context_tokens": 1024, "max_tokens": 256},
        tools={"mcp_servers": {"app": append_server(tmp_path)}},
    )
    checks = await run_checks(settings)
    [failure] = [check for check in checks if check.name == "tools"]
    assert not failure.ok and not isinstance(failure, Caution)
    found = re.match(
        r"(\d+) of the 9 tools are left out of every request: their schemas take about (\d+) "
        r"tokens, and tools may take 192, a quarter of LASTWORD_LLM__CONTEXT_TOKENS less "
        r"LASTWORD_LLM__MAX_TOKENS",
        failure.detail,
    )
    assert found is not None, failure.detail
    assert 0 < int(found.group(1)) < 9 and int(found.group(2)) > 192
    assert exit_code(checks) == 1, render(checks)
    assert f"✗ tools: {failure.detail}\n    fix: offer fewer tools" in render(checks)
    # Fitting the context, the same toolbox is no failure.
    roomy = make_settings(
        llm={"context_tokens": 128_000}, tools={"mcp_servers": {"app": append_server(tmp_path)}}
    )
    assert "tools" not in {check.name for check in await run_checks(roomy)}
