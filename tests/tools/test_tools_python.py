"""Python tools from the `lastword.tools` entry point group: tests/plugins/lastword_demo_tools
is installed as pip would leave it (its package next to its dist-info), and found once its
directory is on the path, as a package from PyPI would be. tests/plugins/broken holds entry
points that do not load."""

from __future__ import annotations

import asyncio
import json
import logging
import queue
import threading
from pathlib import Path

import pytest

from bot.config.settings import ToolsSettings
from bot.tools import Toolbox, ToolCall
from bot.tools.load import load_toolbox
from bot.tools.python import Threads, python_tools

pytestmark = pytest.mark.timeout(10)

PLUGINS = Path(__file__).resolve().parents[1] / "plugins"


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(PLUGINS))


async def loaded() -> Toolbox:
    return await load_toolbox(ToolsSettings())


async def test_the_plugins_tools_are_found_as_declared(installed: None) -> None:
    toolbox = await loaded()
    shout, remember = toolbox.get("shout"), toolbox.get("remember_this")
    assert shout is not None and remember is not None
    assert (shout.source, shout.side_effects, shout.admin_only) == ("python:shout", False, False)
    # The description defaults to the docstring, the name to the function's.
    assert shout.description == "Say the text in capitals."
    assert shout.parameters == {"type": "object", "properties": {"text": {"type": "string"}}}
    assert (remember.source, remember.side_effects, remember.admin_only, remember.title) == (
        "python:remember",
        True,
        True,
        "Remembering",
    )
    assert [tool.name for tool in toolbox.offered(admin=False)] == ["shout"]


async def test_a_plain_function_runs_in_a_thread(installed: None) -> None:
    result = await (await loaded()).run(
        ToolCall("c1", "shout", '{"text": "hi"}'), "k", timeout_s=5, cap=1000
    )
    assert not result.error, result.text
    answer = json.loads(result.text)
    assert answer["text"] == "HI"
    assert answer["thread"] != threading.current_thread().name


async def test_a_coroutine_function_is_awaited_with_the_key(installed: None) -> None:
    result = await (await loaded()).run(
        ToolCall("c1", "remember_this", '{"text": "milk"}'), "conv:1:0", timeout_s=5, cap=1000
    )
    assert (result.text, result.error) == ("remembered milk under conv:1:0", False)


async def test_wrong_arguments_are_an_error_result(installed: None) -> None:
    result = await (await loaded()).run(
        ToolCall("c1", "shout", '{"words": "hi"}'), "k", timeout_s=5, cap=1000
    )
    assert result.error
    assert "TypeError" in result.text


def test_entry_points_that_do_not_load_are_warnings(
    installed: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.syspath_prepend(str(PLUGINS / "broken"))
    with caplog.at_level(logging.WARNING, logger="bot.tools.python"):
        found = python_tools()
    assert sorted(tool.name for tool, _ in found) == ["remember_this", "shout"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings
    missing = next(w for w in warnings if "missing" in w)
    assert missing.startswith(
        "tool entry point missing = lastword_no_such_module:TOOL did not load: ModuleNotFoundError"
    )
    assert any(
        w.startswith("tool entry point not_a_tool = json:dumps names a function, not a")
        for w in warnings
    ), warnings


async def test_plain_functions_that_hang_hold_their_own_threads_and_no_more() -> None:
    """Hung plain functions take daemon threads of their own, a bounded number: not the loop's
    default executor (the model requests' DNS lookups need it), and never one more thread per
    call that timed out."""
    threads = Threads(limit=2)
    release = threading.Event()
    started: queue.Queue[tuple[str, bool]] = queue.Queue()

    def hang(n: int) -> int:
        started.put((threading.current_thread().name, threading.current_thread().daemon))
        release.wait(10)
        return n

    async def next_start(within_s: float) -> tuple[str, bool]:
        return await asyncio.to_thread(started.get, timeout=within_s)

    runs = [asyncio.create_task(threads.run(hang, {"n": n})) for n in range(3)]
    try:
        assert [await next_start(5), await next_start(5)] == [("lastword-tool", True)] * 2
        # The loop's own executor is free meanwhile (next_start runs in it).
        with pytest.raises(queue.Empty):
            await next_start(0.3)
        # A caller that stops waiting (the toolbox's timeout) does not free the slot: its
        # thread still runs.
        runs[0].cancel()
        with pytest.raises(queue.Empty):
            await next_start(0.3)
        release.set()
        assert await next_start(5) == ("lastword-tool", True)
        assert [await runs[1], await runs[2]] == [1, 2]
        assert runs[0].cancelled()
    finally:
        release.set()
        for run in runs:
            run.cancel()
