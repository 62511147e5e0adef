"""Admin commands: /allow, /deny, /budget and /stats, for the users in
LASTWORD_ACCESS__ADMINS, in a DM, answered in the burst's one reply like any command.

Each is one `Command` of the registry (`bot.commands`): decided when the reply is written (its
arguments parsed, misuse answered with its usage line) and carried out only once the reply has
passed the pre-send check (`Change.apply`): a reply thrown away as stale changes nothing, and
the burst that covers the command again decides it again. The changes travel in the outbox
with the reply's text, so a reply re-sent after a crash applies them too; applying one twice
is harmless.

A change is kept in the store (`Store.change_access`), where every replica's ingest and budget
check read it at once: nothing to reload. The settings' allow-list stays the starting point
that /allow and /deny override, per user; admins are always let in. `lastword status` lists
every change made in chat, with who made it and when.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal

from bot.commands.base import Ask, Command, CommandContext, Decision, no_words
from bot.memory import Memory
from bot.plural import counted
from bot.store import DayTotals, Store
from bot.tokens import spent

USAGE = {
    "allow": "Usage: /allow <user id>",
    "deny": "Usage: /deny <user id>",
    "budget": "Usage: /budget <user id> <tokens per day, at most 10^12>, 0 for no limit, "
    "or default",
    "stats": "Usage: /stats",
}
# A platform user id: Telegram's and Discord's are numbers; a plug-in's may be otherwise.
# ASCII only: `\w` alone takes "²" and other Unicode digits that are nobody's id.
USER_ID = re.compile(r"[\w.:@-]{1,64}", re.ASCII)
# A daily budget in tokens: plain ASCII digits, at most a trillion (more is no limit at all,
# and a longer number is not one the store should be asked to parse).
TOKENS = re.compile(r"[0-9]{1,13}", re.ASCII)
MAX_TOKENS = 10**12


@dataclass(frozen=True)
class Change:
    """One change to a user's record, as `Store.change_access` takes it."""

    kind: ClassVar[str] = "access"
    user: str
    field: Literal["access", "budget"]
    value: str  # "allow" / "deny", a budget in tokens, or "" to clear the field
    by: str

    async def apply(self, store: Store, conversation: str, memory: Memory) -> None:
        """Raises `Unavailable` if the store refused it; the reply is then not sent, and
        whoever re-sends it from the outbox applies it again."""
        await store.change_access(self.user, self.field, self.value, self.by)


def _user(words: Sequence[str]) -> str | None:
    """The one argument of /allow and /deny: a user id."""
    return words[0] if len(words) == 1 and USER_ID.fullmatch(words[0]) else None


def _user_and_budget(words: Sequence[str]) -> tuple[str, int | None] | None:
    """/budget's arguments: a user id, and tokens a day (None: the settings' budget)."""
    if len(words) != 2 or not USER_ID.fullmatch(words[0]):
        return None
    if words[1].lower() == "default":
        return words[0], None
    if not TOKENS.fullmatch(words[1]) or int(words[1]) > MAX_TOKENS:
        return None
    return words[0], int(words[1])


async def _allow(turn: CommandContext, ask: Ask, user: str) -> Decision:
    change = Change(user, "access", "allow", ask.by)
    return Decision(f"Done: {user} may talk to me from now on.", (change,))


async def _deny(turn: CommandContext, ask: Ask, user: str) -> Decision:
    if user in turn.settings.access.admins:
        return Decision(
            f"{user} is an admin, and admins are always let in: take them out of "
            "LASTWORD_ACCESS__ADMINS first."
        )
    change = Change(user, "access", "deny", ask.by)
    return Decision(f"Done: I refuse {user}'s messages from now on.", (change,))


async def _budget(turn: CommandContext, ask: Ask, args: tuple[str, int | None]) -> Decision:
    user, tokens = args
    if tokens is None:
        return Decision(
            f"Done: {user} has the settings' daily budget again.",
            (Change(user, "budget", "", ask.by),),
        )
    change = Change(user, "budget", str(tokens), ask.by)
    if tokens == 0:
        return Decision(f"Done: {user} has no daily token limit from now on.", (change,))
    return Decision(
        f"Done: {user} may spend {counted(tokens, 'token')} a day from now on.",
        (change,),
    )


async def _stats(turn: CommandContext, ask: Ask, words: Sequence[str]) -> Decision:
    return Decision(stats_answer(await turn.store.today()))


ALLOW = Command(
    name="allow",
    shape="<user id>",
    help="let a user talk to me",
    usage=USAGE["allow"],
    parse=_user,
    run=_allow,
    admin=True,
)
DENY = Command(
    name="deny",
    shape="<user id>",
    help="refuse a user's messages from now on",
    usage=USAGE["deny"],
    parse=_user,
    run=_deny,
    admin=True,
)
BUDGET = Command(
    name="budget",
    shape="<user id> <tokens>",
    help="a user's daily token budget (0: no limit, default: the settings' budget)",
    usage=USAGE["budget"],
    parse=_user_and_budget,
    run=_budget,
    admin=True,
)
STATS = Command(
    name="stats",
    help="today's replies, tokens, users, interrupted and forced replies",
    usage=USAGE["stats"],
    parse=no_words,
    run=_stats,
    admin=True,
)


def stats_answer(today: DayTotals) -> str:
    """The answer to /stats: what every replica did today. Its tokens are counted as /usage
    and `lastword status` count them (`bot.tokens.spent`)."""
    return "\n".join(
        [
            "Today (UTC), all replicas together:",
            f"Replies: {today.replies:,}",
            f"Spent: {spent(today.prompt, today.completion)} "
            f"in {counted(today.generations, 'generation')}",
            f"Users: {today.users:,}",
            f"Interrupted by a newer message: {today.interrupted:,}",
            f"Forced out by the starvation guard: {today.forced:,}",
        ]
    )
