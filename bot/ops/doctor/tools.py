"""7. The model and the tools: does the model take the tools it will be offered, and which it
refuses.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from bot.config.settings import Settings
from bot.ops.check import Check, guarded
from bot.plural import counted

if TYPE_CHECKING:
    from bot.tools import Tool
from bot.ops.doctor.llm import llm_client
from bot.ops.doctor.report import Caution

# Requests the tools check makes at most: each leaves out a tool the model refused, so that
# the next names another.
TOOL_PROBES = 4


async def tools_check(settings: Settings, tools: list[Tool], timeout_s: float) -> Check:
    """Does the model take the configured tools? As `llm_check`, the library is loaded
    before the clock starts."""
    importlib.import_module("openai")
    model = settings.llm.model
    silent = Caution(
        "llm tools",
        True,
        f"could not check whether model {model} takes the tools: no answer within {timeout_s:g} s",
        "run doctor again",
    )
    return await guarded(_tools_answer(settings, tools, timeout_s), timeout_s, silent)


async def _tools_answer(settings: Settings, tools: list[Tool], timeout_s: float) -> Check:
    """One small request (max_tokens 1) offering every tool, as a reply offers them; a tool
    the model refuses is named and left out, and the rest asked again (`TOOL_PROBES` at
    most). A ✗ names each tool refused, or says the model takes none."""
    import openai

    from bot.llm.openai import tool_name, tools_refused
    from bot.llm.tool_refusals import NO_TOOLS_FIX, TOOL_FIX

    llm = settings.llm
    offered = [tool.spec() for tool in tools]
    refused: list[str] = []
    client = llm_client(settings, timeout_s)
    try:
        for _ in range(TOOL_PROBES):
            try:
                await client.chat.completions.create(
                    model=llm.model,
                    messages=[{"role": "user", "content": "ping"}],
                    max_tokens=1,
                    tools=offered,  # type: ignore[arg-type]
                    extra_body=llm.extra_body or None,
                )
            except openai.APIStatusError as exc:
                found = tools_refused(exc, [tool_name(tool) for tool in offered])
                if found is None:
                    return Caution(
                        "llm tools",
                        True,
                        f"could not check whether model {llm.model} takes the tools: it "
                        f"answered {exc.status_code}: {exc.message[:200]}",
                        "run doctor again",
                    )
                if not found.tool:
                    return Check(
                        "llm tools",
                        False,
                        f"model {llm.model} does not take tools ({found.reason}): replies go "
                        "without them",
                        NO_TOOLS_FIX,
                    )
                refused.append(f"{found.tool} ({found.reason})")
                offered = [tool for tool in offered if tool_name(tool) != found.tool]
                if offered:
                    continue
            break
        else:
            refused.append("perhaps more")
    finally:
        await client.close()
    if refused:
        return Check(
            "llm tools",
            False,
            f"model {llm.model} refuses {'tool' if len(refused) == 1 else 'tools'} "
            f"{'; '.join(refused)}: replies go without {'it' if len(refused) == 1 else 'them'}",
            TOOL_FIX,
        )
    return Check("llm tools", True, f"model {llm.model} takes the {counted(len(tools), 'tool')}")
