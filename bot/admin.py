"""Admin commands: /allow, /deny, /budget and /stats, for the users in
LASTWORD_ACCESS__ADMINS, in a DM, answered in the burst's one reply like any command.

A command is decided when the reply is written (`decide`: its arguments checked, misuse
answered with its usage line) and carried out only once the reply has passed the pre-send
check (`apply`): a reply thrown away as stale changes nothing, and the burst that covers the
command again decides it again. The changes travel in the outbox with the reply's text, so a
reply re-sent after a crash applies them too; applying one twice is harmless.

A change is kept in the store (`Store.change_access`), where every replica's ingest and budget
check read it at once: nothing to reload. The settings' allow-list stays the starting point
that /allow and /deny override, per user; admins are always let in. `lastword status` lists
every change made in chat, with who made it and when.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Literal

from bot.commands import Ask
from bot.plural import counted
from bot.settings import Settings
from bot.store import DayTotals, Store

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

    user: str
    field: Literal["access", "budget"]
    value: str  # "allow" / "deny", a budget in tokens, or "" to clear the field
    by: str


@dataclass(frozen=True)
class Decision:
    """An admin command's answer, and the changes it stands for (none for misuse or /stats)."""

    answer: str
    changes: tuple[Change, ...] = ()


async def decide(store: Store, settings: Settings, ask: Ask) -> Decision:
    """An admin's command, checked and answered (the caller checked that `ask.by` is an
    admin); nothing is changed yet."""
    words = ask.argument.split()
    if ask.command == "stats":
        return Decision(USAGE["stats"] if words else stats_answer(await store.today()))
    if not words or not USER_ID.fullmatch(words[0]):
        return Decision(USAGE[ask.command])
    user, rest = words[0], words[1:]
    if ask.command == "budget":
        return _budget(ask, user, rest)
    if rest:
        return Decision(USAGE[ask.command])
    if ask.command == "deny" and user in settings.access.admins:
        return Decision(
            f"{user} is an admin, and admins are always let in: take them out of "
            "LASTWORD_ACCESS__ADMINS first."
        )
    change = Change(user, "access", ask.command, ask.by)
    if ask.command == "allow":
        return Decision(f"Done: {user} may talk to me from now on.", (change,))
    return Decision(f"Done: I refuse {user}'s messages from now on.", (change,))


def _budget(ask: Ask, user: str, rest: list[str]) -> Decision:
    if len(rest) != 1:
        return Decision(USAGE["budget"])
    if rest[0].lower() == "default":
        return Decision(
            f"Done: {user} has the settings' daily budget again.",
            (Change(user, "budget", "", ask.by),),
        )
    if not TOKENS.fullmatch(rest[0]) or int(rest[0]) > MAX_TOKENS:
        return Decision(USAGE["budget"])
    tokens = int(rest[0])
    change = Change(user, "budget", str(tokens), ask.by)
    if tokens == 0:
        return Decision(f"Done: {user} has no daily token limit from now on.", (change,))
    return Decision(
        f"Done: {user} may spend {counted(tokens, 'token')} a day from now on.",
        (change,),
    )


def encoded(changes: Sequence[Change]) -> str:
    """Changes as the outbox keeps them ("" for none)."""
    return json.dumps([asdict(c) for c in changes]) if changes else ""


def decoded(raw: str) -> tuple[Change, ...]:
    """The changes an outbox kept (`encoded`)."""
    return tuple(Change(**c) for c in json.loads(raw)) if raw else ()


async def apply(store: Store, changes: Sequence[Change]) -> None:
    """Carry the changes out, in order. Raises `Unavailable` if the store refused one; the
    reply is then not sent, and whoever re-sends it from the outbox applies them again."""
    for change in changes:
        await store.change_access(change.user, change.field, change.value, change.by)


def stats_answer(today: DayTotals) -> str:
    """The answer to /stats: what every replica did today."""
    tokens = today.prompt + today.completion
    return "\n".join(
        [
            "Today (UTC), all replicas together:",
            f"Replies: {today.replies:,}",
            f"Tokens: {tokens:,} ({today.prompt:,} prompt, {today.completion:,} completion) "
            f"in {counted(today.generations, 'generation')}",
            f"Users: {today.users:,}",
            f"Interrupted by a newer message: {today.interrupted:,}",
            f"Forced out by the starvation guard: {today.forced:,}",
        ]
    )
