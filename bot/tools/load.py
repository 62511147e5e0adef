"""A replica's toolbox, from both sources: the Python tools installed as plug-ins and the
configured MCP servers.

`load_toolbox` returns within the start timeout in all. A server still starting then goes on
in the background: its `McpSource` offers its tools to the same `Toolbox` object when it is
up, by putting them in `Toolbox.tools` (and after a restart, replacing the ones it offered
before). The toolbox is a plain dict the cycle reads each time it asks `offered()`, so a tool
added later is offered from the next generation on, with no lock: every change is made on the
event loop, between awaits.
"""

from __future__ import annotations

import asyncio
import logging

from bot.settings import ToolsSettings
from bot.tools import Runner, Tool, Toolbox

log = logging.getLogger(__name__)


async def load_toolbox(settings: ToolsSettings) -> Toolbox:
    """The Python tools, and the tools of every MCP server that started within
    `settings.start_timeout_s`; the rest are added when they are up. `Toolbox.close` stops the
    servers."""
    from bot.tools.python import python_tools

    toolbox = Toolbox()
    for tool, runner in python_tools():
        toolbox.add([tool], runner)
    if not settings.mcp_servers:
        return toolbox
    from bot.tools.mcp import McpSource

    def offer(source: str, tools: list[tuple[Tool, Runner]]) -> None:
        replace(toolbox, source, tools)

    sources = [
        McpSource(name, config, settings.start_timeout_s, offer)
        for name, config in settings.mcp_servers.items()
    ]
    for source in sources:
        source.start()
        toolbox.closers.append(source.close)
    waits = [asyncio.create_task(source.tried.wait()) for source in sources]
    _, pending = await asyncio.wait(waits, timeout=settings.start_timeout_s)
    for wait in pending:
        wait.cancel()
    starting = [source.name for source in sources if not source.tried.is_set()]
    if starting:
        log.warning(
            "MCP servers %s did not start within %g s: their tools are offered once they do",
            ", ".join(starting),
            settings.start_timeout_s,
        )
    return toolbox


def replace(toolbox: Toolbox, source: str, tools: list[tuple[Tool, Runner]]) -> None:
    """Offer `tools` as all of `source`'s: a server listed again after a restart may have
    dropped or renamed some."""
    for name in [name for name, (tool, _) in toolbox.tools.items() if tool.source == source]:
        del toolbox.tools[name]
    for tool, runner in tools:
        toolbox.add([tool], runner)
