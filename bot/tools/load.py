"""A replica's toolbox, from both sources: the Python tools installed as plug-ins and the
configured MCP servers.

`load_toolbox` returns within the start timeout in all. A server still starting then goes on
in the background, and offers its tools to the same `Toolbox` object when it is up (and again,
as listed afresh, after each restart): `Toolbox.tools` is refilled from every source's latest
listing, in the configured order (`Toolbox.offer`). A reply is offered the tools as they are
when it starts, each call bound to its tool's identity, so a tool added meanwhile, or a name
that moves to a server that came up late, never changes what a call runs on. What is offered
is fitted to the context at each change (`bot.tools.fit`). Every change is made on the event
loop, between awaits, so no lock is needed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from bot.config.settings import LLMSettings, ToolsSettings
from bot.tools import Runner, Tool, Toolbox
from bot.tools.fit import room_for_tools

log = logging.getLogger(__name__)


async def load_toolbox(
    settings: ToolsSettings, scrub: Callable[[str], str] = str, llm: LLMSettings | None = None
) -> Toolbox:
    """The Python tools, and the tools of every MCP server that started within
    `settings.start_timeout_s`; the rest are added when they are up. `scrub` masks the
    replica's secrets in what the toolbox logs. Given the model's settings (`llm`), a user
    is offered only as many tools as fit a quarter of its prompt's budget
    (`bot.tools.fit`). `Toolbox.close` stops the servers."""
    from bot.tools.python import python_tools

    room = room_for_tools(llm) if llm is not None else None
    toolbox = Toolbox(scrub=scrub, room=room)
    python: list[tuple[Tool, Runner]] = list(python_tools())
    if not settings.mcp_servers:
        toolbox.offer([python])
        return toolbox
    from bot.tools.mcp import McpSource

    # Each source's tools as last listed, in the order the sources are configured.
    offers: dict[str, list[tuple[Tool, Runner]]] = {}

    def offer(source: str, tools: list[tuple[Tool, Runner]]) -> None:
        offers[source] = tools
        toolbox.offer([python, *offers.values()])

    sources = [
        McpSource(
            name,
            config,
            settings.start_timeout_s,
            offer,
            max_message_bytes=settings.max_message_bytes,
        )
        for name, config in settings.mcp_servers.items()
    ]
    for source in sources:
        offers[source.source] = []
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
