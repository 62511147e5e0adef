"""Every check in order (`run_checks`) and `lastword doctor` itself (`main`): the settings, the
store and what runs on it, the platform (its own check, handed in), the model, the MCP servers
and the tools. Each check is bounded in time; every detail is scrubbed of the secrets.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from bot.config.secrets import secrets_of
from bot.config.settings import Settings, load_settings
from bot.masking import Scrub
from bot.ops.check import Check, PlatformCheck, guarded

if TYPE_CHECKING:
    from bot.tools import Tool
from bot.ops.doctor.llm import llm_check
from bot.ops.doctor.mcp import all_tools, mcp_checks, schema_checks
from bot.ops.doctor.report import NOT_CHECKED_ON_STORE, NOT_CHECKED_TOOLS, exit_code, render
from bot.ops.doctor.scripts import durability_check, server_checks
from bot.ops.doctor.settings import check_settings, store_name
from bot.ops.doctor.store import store_check
from bot.ops.doctor.tools import tools_check

# Each check gets this long; a check that takes longer is reported as failed.
CHECK_TIMEOUT_S = 5.0


# A platform's check bounds itself, with advice only it can give; doctor waits this much
# longer before giving up on one that does not.
PLATFORM_BACKSTOP_S = 1.0


def main(platform_check: PlatformCheck) -> int:
    """Run every check, print the report to stdout and return the exit code."""
    checks = asyncio.run(run_checks(platform_check=platform_check))
    print(render(checks))
    return exit_code(checks)


async def run_checks(
    source: Settings | Callable[[], Settings] = load_settings,
    *,
    platform_check: PlatformCheck,
    timeout_s: float = CHECK_TIMEOUT_S,
) -> list[Check]:
    """Every check, in order. Settings that do not load make the only check: without them
    there is nothing else to check."""
    settings_check, settings = check_settings(source)
    if settings is None:
        return [settings_check]
    scrub = Scrub(secrets_of(settings))
    checks = [settings_check, *await _store_checks(settings, timeout_s)]
    backstop_s = timeout_s + PLATFORM_BACKSTOP_S
    checks.append(
        await guarded(
            platform_check(settings, timeout_s),
            backstop_s,
            Check("platform", False, f"{settings.platform}: no answer within {backstop_s:g} s"),
        )
    )
    llm = await llm_check(settings, timeout_s)
    checks.append(llm)
    mcp_tools: list[Tool] = []
    checks += await mcp_checks(settings, mcp_tools)
    tools = all_tools(settings, mcp_tools)
    checks += schema_checks(settings, tools)
    if tools and settings.llm_provider == "openai":
        if llm.ok:
            # What a request offers: the tools that fit (a ✗ above names the rest).
            from bot.tools.fit import toolbox_fit

            offered = list(toolbox_fit(settings, tools).offered)
            checks.append(await tools_check(settings, offered, timeout_s))
        else:
            checks[checks.index(llm)] = replace(llm, detail=f"{llm.detail} ({NOT_CHECKED_TOOLS})")
    return [replace(check, detail=scrub(check.detail), fix=scrub(check.fix)) for check in checks]


async def _store_checks(settings: Settings, timeout_s: float) -> list[Check]:
    """The store, then what runs on it (scripts, memory, durability): those are reported as
    not checked when the store is not usable."""
    silence = f"no answer within {timeout_s:g} s from {store_name(settings)}"
    store = await guarded(
        store_check(settings, timeout_s),
        timeout_s,
        Check("store", False, silence, "start Redis or fix LASTWORD_REDIS_URL"),
    )
    if not store.ok:
        # What runs on the store is not checked: one ✗, the store's, says so once.
        return [replace(store, detail=f"{store.detail} ({NOT_CHECKED_ON_STORE})")]
    server = await server_checks(settings, timeout_s)
    durability = await guarded(
        durability_check(settings, timeout_s),
        timeout_s,
        Check("durability", False, silence, "check WAITAOF and appendfsync on the server by hand"),
    )
    return [store, *server, durability]
