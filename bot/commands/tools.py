"""/tools: what the bot can do for the user beyond writing, the tools they are offered (an
admin sees the admin-only ones too, marked), each with what it is for and whether it changes
anything outside the chat."""

from __future__ import annotations

from collections.abc import Sequence

from bot.commands.base import Ask, Command, CommandContext, Decision, no_words
from bot.tools import Tool

NONE = "I have no tools: I answer from what I know."
HEADER = "Tools I may use while I answer you:"
# A description's first line, at most this long, says what a tool is for.
DESCRIPTION_CHARS = 120


async def _tools(turn: CommandContext, ask: Ask, words: Sequence[str]) -> Decision:
    offered = turn.toolbox.offered(admin=ask.by in turn.settings.access.admins)
    if not offered:
        return Decision(NONE)
    return Decision("\n".join([HEADER, *(_line(tool) for tool in offered)]))


def _line(tool: Tool) -> str:
    about = (tool.description.strip().splitlines() or [""])[0]
    if len(about) > DESCRIPTION_CHARS:
        about = about[: DESCRIPTION_CHARS - 1] + "…"
    notes = ["changes things" if tool.side_effects else "only looks things up"]
    if tool.admin_only:
        notes.append("admins only")
    return (
        f"- {tool.name}: {about} ({', '.join(notes)})"
        if about
        else f"- {tool.name} ({', '.join(notes)})"
    )


TOOLS = Command(
    name="tools",
    help="the tools I may use while I answer you",
    usage="Usage: /tools",
    parse=no_words,
    run=_tools,
)
