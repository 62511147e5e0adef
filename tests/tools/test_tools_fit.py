"""Tools fit the context (`bot.tools.fit`): a request offers as many tools as fit a quarter
of the prompt's budget, in the toolbox's order, and the rest are named in one warning.

- through a replica on the fake provider (which refuses a request over its context, as a real
  one does), a real MCP server offering 1,000 tools (992 KB of schema) on a 128k context:
  every burst is the model's answer, never an apology, and the warning, once, says how many
  tools were left out;
- the order: Python tools first, then each source as configured; a tool too big for what is
  left is skipped and smaller ones after it still go in; admins and other users are each
  fitted; the warning is said once per change, not per offer;
- `toolbox_fit`, what `doctor` asks.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from bot.config.settings import ToolsSettings
from bot.memory.tool import NAME as MEMORY_TOOL
from bot.tools import Runner, Tool, Toolbox
from bot.tools.fit import TOOLS_SHARE, cost, room_for_tools, toolbox_fit
from bot.tools.load import load_toolbox
from bot.tools.python import PythonRunner, PythonTool
from tests.support.builders import message
from tests.support.chatting import CONV, fake
from tests.support.factories import RuntimeFactory, SettingsFactory
from tests.support.fakes.openai_server import FAKE_MODEL_ID, FakeOpenAI, RecordedRequest
from tests.support.mcp import APPEND_TOOLS, append_server
from tests.support.waits import settled

__all__ = ["fake"]  # the fixture, imported for pytest

pytestmark = pytest.mark.timeout(60)

MANY = 1000
CONTEXT = 128_000
MAX_TOKENS = 1024
TEXT = {"type": "object", "properties": {"text": {"type": "string"}}}


def llm_settings(fake: FakeOpenAI) -> dict[str, Any]:
    return {
        "provider": "openai",
        "base_url": fake.base_url,
        "api_key": "k",
        "model": FAKE_MODEL_ID,
        "retries": 0,
        "context_tokens": CONTEXT,
        "max_tokens": MAX_TOKENS,
    }


def fitting_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "left out of every request" in r.getMessage()]


async def test_a_thousand_tools_on_a_128k_context_never_make_an_apology(
    runtime_factory: RuntimeFactory,
    make_settings: SettingsFactory,
    fake: FakeOpenAI,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake.context_tokens = CONTEXT

    def answer(request: RecordedRequest) -> str:
        return f"answered {request.last_user_text}"

    fake.reply = answer
    settings = make_settings(llm=llm_settings(fake))
    many = append_server(tmp_path, env={"LW_MANY_TOOLS": str(MANY)})
    tools = ToolsSettings.model_validate({"mcp_servers": {"many": many}, "start_timeout_s": 30})
    with caplog.at_level(logging.WARNING, logger="bot.tools"):
        box = await load_toolbox(tools, llm=settings.llm)
        try:
            listed = len(box.tools)
            assert listed == MANY + len(APPEND_TOOLS)
            # 992 KB of schema: over seven times the whole context, let alone its quarter.
            assert len(json.dumps([tool.spec() for tool, _ in box.tools.values()])) > 990_000
            runtime, outbound = await runtime_factory(settings, toolbox=box)
            for n in (1, 2):
                assert await runtime.ingest(message(f"question {n}", n=n))
                await settled(runtime, CONV, within_s=20)
        finally:
            await box.close()
    # Two of two bursts answered by the model, no request refused for its length.
    assert outbound.texts(CONV) == ["answered question 1", "answered question 2"]
    assert fake.rejected == []
    offered = [request.tool_names for request in fake.requests]
    assert len(offered) == 2 and offered[0] == offered[1]
    # The toolbox's tools, and the memory tool bound to the person, which is not the toolbox's.
    kept = [name for name in offered[0] if name != MEMORY_TOOL]
    assert offered[0][len(kept) :] == [MEMORY_TOOL]
    assert 0 < len(kept) < listed
    # The server's own tools are listed first, so they are kept; the last ones are left out.
    assert set(kept) >= APPEND_TOOLS
    assert "many_0001" in kept and f"many_{MANY:04d}" not in kept
    # Within a quarter of the prompt's budget, by the estimate the prompt is fitted with.
    schemas = sum(cost(tool) for tool in box.offered(admin=False))
    assert schemas <= (CONTEXT - MAX_TOKENS) // TOOLS_SHARE
    # One warning, whatever the bursts, naming how many were left out.
    [warning] = fitting_warnings(caplog)
    left_out = listed - len(kept)
    assert warning.startswith(f"{left_out} of the {listed} tools are left out of every request")
    assert "fix: offer fewer tools" in warning


def python_tool(name: str, about: str = "", admin_only: bool = False) -> tuple[Tool, Runner]:
    async def function(text: str) -> str:
        return text

    declared = PythonTool(
        function=function,
        parameters=TEXT,
        side_effects=False,
        admin_only=admin_only,
        name=name,
        description=about or name,
    )
    return declared.tool("python:test"), PythonRunner(declared)


def names(tools: list[Tool]) -> list[str]:
    return [tool.name for tool in tools]


def test_the_first_in_order_are_offered_and_a_big_one_is_skipped() -> None:
    small = [python_tool(f"small_{i}") for i in range(4)]
    big = python_tool("big", about="x" * 4000)
    room = sum(cost(tool) for tool, _ in small[:3]) + 4 + 10
    box = Toolbox(room=room)
    # A source's order is the toolbox's: this one before the other one.
    box.offer([[small[0], big, small[1]], [small[2], small[3]]])
    # The big one does not fit in what is left, the smaller ones after it do, until full.
    assert names(box.offered(admin=True)) == ["small_0", "small_1", "small_2"]
    assert box.told.startswith("2 of the 5 tools are left out of every request")
    assert box.told.endswith("Left out: big, small_3")


def test_admins_and_other_users_are_each_fitted() -> None:
    first = python_tool("for_admins", about="y" * 400, admin_only=True)
    rest = [python_tool(f"tool_{i}") for i in range(3)]
    room = cost(first[0]) + 4
    box = Toolbox(room=room)
    box.offer([[first, *rest]])
    assert names(box.offered(admin=True)) == ["for_admins"]
    # The admin-only tool takes none of other users' room.
    assert names(box.offered(admin=False)) == ["tool_0", "tool_1", "tool_2"]


def test_the_warning_is_said_once_per_change(caplog: pytest.LogCaptureFixture) -> None:
    tools = [python_tool(f"tool_{i}") for i in range(5)]
    box = Toolbox(room=cost(tools[0][0]) * 2 + 4)
    with caplog.at_level(logging.WARNING, logger="bot.tools"):
        box.offer([tools[:3]])
        box.offer([tools[:3]])  # listed again, as a restarted server is: nothing new
        box.offer([tools])
    assert [w.split(":")[0] for w in fitting_warnings(caplog)] == [
        "1 of the 3 tools are left out of every request",
        "3 of the 5 tools are left out of every request",
    ]


def test_no_room_means_every_tool_as_before() -> None:
    tools = [python_tool(f"tool_{i}", about="z" * 4000) for i in range(3)]
    box = Toolbox()
    box.offer([tools])
    assert names(box.offered(admin=False)) == ["tool_0", "tool_1", "tool_2"]
    assert box.told == ""


def test_toolbox_fit_says_what_doctor_reports(make_settings: SettingsFactory) -> None:
    settings = make_settings(llm={"provider": "echo", "context_tokens": 2048, "max_tokens": 256})
    room = room_for_tools(settings.llm)
    assert room == (2048 - 256) // TOOLS_SHARE
    tools = [python_tool(f"tool_{i}", about="w" * 400)[0] for i in range(10)]
    fit = toolbox_fit(settings, tools)
    assert not fit.fits
    assert fit.tokens <= room < fit.needed
    assert len(fit.offered) + len(fit.left_out) == 10
    assert names(list(fit.offered)) == [f"tool_{i}" for i in range(len(fit.offered))]
    assert fit.told().startswith(f"{len(fit.left_out)} of the 10 tools are left out")
    assert toolbox_fit(settings, tools[:1]).fits
