"""Which tools a request offers: as many as fit a quarter of the prompt's budget, in order.

Every request that offers tools carries all their schemas, counted in the prompt's budget
(`LASTWORD_LLM__CONTEXT_TOKENS` less `LASTWORD_LLM__MAX_TOKENS`). A toolbox bigger than that
budget made every request too long for the model, and every reply an apology. So the tools
offered take at most `1/TOOLS_SHARE` of it (by the offline estimate, `bot.tokens`): the rest is
the system prompt's, the history's, the unanswered messages' and the tool results'. A quarter,
as the room's lines in a group may take (`bot.llm.prompt.ROOM_SHARE`): a model offered more tools
than a quarter of its context holds has little left to read the conversation with, and the
prompt's budget stays positive whatever the estimate's correction (at most threefold) makes
of the tools' share.

The order is the toolbox's (`Toolbox.offer`), which the operator sets: the Python tools first
(plug-ins installed on purpose, usually few), then each MCP server's tools in the order the
servers are configured, each server's in the order it lists them. The first that fit are
offered; a tool too big for what is left is left out, and a smaller one after it may still
go in. What is left out is named in one warning (`Toolbox`) and by `doctor` (`toolbox_fit`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from bot.config.settings import ENV_PREFIX, LLMSettings, Settings
from bot.tokens import PER_MESSAGE, estimate
from bot.tools import Tool, cut

# The tools offered take at most 1/TOOLS_SHARE of the prompt's budget.
TOOLS_SHARE = 4
# What an operator can do about a toolbox that does not fit.
FIX = (
    "offer fewer tools (fewer MCP servers, or a server's tools for admins only with "
    '"adminOnly": true), configure the servers whose tools users need first, or give '
    f"{ENV_PREFIX}LLM__CONTEXT_TOKENS the model's real context if it is larger"
)


def room_for_tools(llm: LLMSettings) -> int:
    """Tokens the schemas of the tools offered may take: a quarter of the prompt's budget."""
    return (llm.context_tokens - llm.max_tokens) // TOOLS_SHARE


def cost(tool: Tool) -> int:
    """What `tool`'s schema adds to a request, in estimated tokens: its entry in `tools`,
    and the separator before it."""
    return estimate(json.dumps(tool.spec())) + 1


@dataclass(frozen=True)
class Fit:
    """The tools a request offers, those left out, and what they take of the room (tokens)."""

    offered: tuple[Tool, ...]
    left_out: tuple[Tool, ...]
    tokens: int  # what the offered tools take
    needed: int  # what all of them would take
    room: int

    @property
    def fits(self) -> bool:
        """Whether every tool is offered."""
        return not self.left_out

    def told(self) -> str:
        """What is left out and why, on one line ('' when every tool fits)."""
        if self.fits:
            return ""
        total = len(self.offered) + len(self.left_out)
        names = cut(", ".join(tool.name for tool in self.left_out))
        return (
            f"{len(self.left_out)} of the {total} tools are left out of every request: their "
            f"schemas take about {self.needed} tokens, and tools may take {self.room}, a "
            f"quarter of {ENV_PREFIX}LLM__CONTEXT_TOKENS less {ENV_PREFIX}LLM__MAX_TOKENS; "
            f"the first in order are offered (Python tools, then each MCP server's in the "
            f"configured order). Left out: {names}"
        )


def fitted(tools: Sequence[Tool], room: int, costs: Mapping[str, int] | None = None) -> Fit:
    """The first of `tools` that fit in `room` tokens, in order (a tool that does not fit in
    what is left is skipped, the next still tried); `costs` by name, if already counted."""
    left = room - PER_MESSAGE
    offered: list[Tool] = []
    left_out: list[Tool] = []
    needed = PER_MESSAGE
    for tool in tools:
        its = costs[tool.name] if costs is not None else cost(tool)
        needed += its
        if its <= left:
            offered.append(tool)
            left -= its
        else:
            left_out.append(tool)
    return Fit(tuple(offered), tuple(left_out), room - left, needed, room)


def toolbox_fit(settings: Settings, tools: Sequence[Tool]) -> Fit:
    """Whether the configured toolbox fits the context, for `doctor`: `tools` are every tool
    as an admin is offered them, in the toolbox's order (the Python tools, then each MCP
    server's in the configured order)."""
    return fitted(tools, room_for_tools(settings.llm))
