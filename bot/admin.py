"""Admin commands: /allow, /deny, /budget and /stats, for the users in
LASTWORD_ACCESS__ADMINS, in a DM, answered in the burst's one reply like any command.

A change is kept in the store (`Store.change_access`), where every replica's ingest and budget
check read it at once: nothing to reload. The settings' allow-list stays the starting point
that /allow and /deny override, per user; admins are always let in. `lastword status` lists
every change made in chat, with who made it and when.
"""

from __future__ import annotations

import re

from bot.commands import Ask
from bot.settings import Settings
from bot.store import DayTotals, Store

USAGE = {
    "allow": "Usage: /allow <user id>",
    "deny": "Usage: /deny <user id>",
    "budget": "Usage: /budget <user id> <tokens per day>, 0 for no limit, or default",
}
# A platform user id: Telegram's and Discord's are numbers; a plug-in's may be otherwise.
USER_ID = re.compile(r"[\w.:@-]{1,64}")


async def answer(store: Store, settings: Settings, ask: Ask) -> str:
    """Carry out an admin's command (the caller checked that `ask.by` is an admin)."""
    if ask.command == "stats":
        return stats_answer(await store.today())
    words = ask.argument.split()
    if not words or not USER_ID.fullmatch(words[0]):
        return USAGE[ask.command]
    user = words[0]
    if ask.command == "budget":
        return await _budget(store, ask, user, words[1:])
    if ask.command == "deny" and user in settings.access.admins:
        return (
            f"{user} is an admin, and admins are always let in: take them out of "
            "LASTWORD_ACCESS__ADMINS first."
        )
    if len(words) != 1:
        return USAGE[ask.command]
    await store.change_access(user, "access", ask.command, ask.by)
    if ask.command == "allow":
        return f"Done: {user} may talk to me from now on."
    return f"Done: I refuse {user}'s messages from now on."


async def _budget(store: Store, ask: Ask, user: str, rest: list[str]) -> str:
    if len(rest) != 1 or not (rest[0].isdigit() or rest[0] == "default"):
        return USAGE["budget"]
    value = "" if rest[0] == "default" else str(int(rest[0]))
    await store.change_access(user, "budget", value, ask.by)
    if not value:
        return f"Done: {user} has the settings' daily budget again."
    if value == "0":
        return f"Done: {user} has no daily token limit from now on."
    tokens = int(value)
    return f"Done: {user} may spend {tokens:,} token{'s' * (tokens != 1)} a day from now on."


def stats_answer(today: DayTotals) -> str:
    """The answer to /stats: what every replica did today."""
    tokens = today.prompt + today.completion
    return "\n".join(
        [
            "Today (UTC), all replicas together:",
            f"Replies: {today.replies:,}",
            f"Tokens: {tokens:,} ({today.prompt:,} prompt, {today.completion:,} completion) "
            f"in {today.generations:,} generations",
            f"Users: {today.users:,}",
            f"Interrupted by a newer message: {today.interrupted:,}",
            f"Forced out by the starvation guard: {today.forced:,}",
        ]
    )
