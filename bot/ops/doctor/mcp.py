"""6. The MCP servers: does each start and list its tools; do the tools' schemas fit."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from bot.config.secrets import server_secrets
from bot.config.settings import McpServer, Settings
from bot.masking import Scrub
from bot.ops.check import Check, guarded
from bot.plural import counted

if TYPE_CHECKING:
    from bot.tools import Tool


# Doctor waits this much longer than the start timeout for a server's check, which bounds
# itself (stopping a child that will not exit takes a few seconds more: bot.tools.stdio).
MCP_BACKSTOP_S = 8.0


async def mcp_checks(settings: Settings, tools: list[Tool]) -> list[Check]:
    """One check per configured MCP server, run side by side: each is started, its tools
    listed (into `tools`) and stopped, as a replica starts it, within the start timeout."""
    timeout_s = settings.tools.start_timeout_s
    return list(
        await asyncio.gather(
            *(
                guarded(
                    _mcp_check(name, config, settings, tools),
                    timeout_s + MCP_BACKSTOP_S,
                    Check(f"mcp {name}", False, f"not stopped within {timeout_s:g} s"),
                )
                for name, config in settings.tools.mcp_servers.items()
            )
        )
    )


async def _mcp_check(name: str, config: McpServer, settings: Settings, found: list[Tool]) -> Check:
    from bot.tools.mcp import command_of, describe, probe, reason, with_stderr
    from bot.tools.stdio import LastWords

    timeout_s = settings.tools.start_timeout_s
    shown = describe(config)
    # Its headers, URL and environment may hold credentials that no other setting names: all
    # of its environment is masked here, whatever the names say.
    scrub = Scrub([*server_secrets(config), *config.env.values()])
    if config.url is not None:
        fix = "check the URL and the headers in LASTWORD_TOOLS__MCP_SERVERS, and that it is up"
    elif command_of(config) != config.command:
        fix = (
            f"install the server beside lastword ({command_of(config)} -m pip install <its "
            "package>), or check the arguments and env in LASTWORD_TOOLS__MCP_SERVERS"
        )
    else:
        fix = (
            "check the command, arguments and env in LASTWORD_TOOLS__MCP_SERVERS (run by hand, "
            "the command should wait for MCP messages on its standard input)"
        )
    # Why a server would not start is most often in its own last words on stderr (a missing
    # module, a bad option): the ✗ line carries them.
    last_words = LastWords()
    try:
        tools = await probe(
            name,
            config,
            timeout_s,
            max_message_bytes=settings.tools.max_message_bytes,
            last_words=last_words,
        )
    except TimeoutError:
        why = f"no tools listed within {timeout_s:g} s"
    except Exception as exc:  # doctor reports every failure as a ✗ line
        why = reason(exc, scrub)
    else:
        found += tools
        names = ", ".join(tool.name for tool in tools)
        if len(names) > 200:
            names = names[:197] + "..."
        detail = f"{shown}: {counted(len(tools), 'tool')} ({names or 'none'})"
        return Check(f"mcp {name}", True, detail)
    return Check(f"mcp {name}", False, f"{shown}: {with_stderr(why, last_words, scrub)}", fix)


def all_tools(settings: Settings, mcp_tools: list[Tool]) -> list[Tool]:
    """Every tool configured, in the toolbox's order: the Python tools, then each MCP server's
    that started, the servers in the configured order (their checks end in any order), each
    server's tools in its own (a stable sort)."""
    from bot.tools.python import python_tools

    servers = list(settings.tools.mcp_servers)

    def server_of(tool: Tool) -> int:
        name = tool.source.removeprefix("mcp:")
        return servers.index(name) if name in servers else len(servers)

    return [tool for tool, _ in python_tools()] + sorted(mcp_tools, key=server_of)


def schema_checks(settings: Settings, tools: list[Tool]) -> list[Check]:
    """A ✗ when the tools' schemas do not all fit the share of the prompt's budget a request
    gives them (`bot.tools.fit`): the replicas leave the last ones out of every request, so
    users never reach them; nothing otherwise."""
    from bot.tools.fit import FIX, toolbox_fit

    fit = toolbox_fit(settings, tools)
    return [] if fit.fits else [Check("tools", False, fit.told(), FIX)]
