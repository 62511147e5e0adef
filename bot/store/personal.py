"""What the store keeps that a user chose or may take back: the persona (/persona) and the
erasure of everything kept about them (/forget). Both live in the conversation's slot, like
the model picked with /model, so every replica reads them at once; the persona reaches a cycle
with its lease (`Grant.persona`)."""

from __future__ import annotations

from bot.message import Place
from bot.store import scripts
from bot.store.calls import Calls

# How long /forget waits for the same command again before it asks anew.
FORGET_CONFIRM_MS = 60_000


class Personal(Calls):
    """Keep a persona; ask for, check and carry out a /forget."""

    async def keep_persona(self, conversation: str, text: str) -> None:
        """Keep the user's instructions for every replica ("" drops them)."""
        keys = {"state": self.layout.keys(conversation).state}
        await self._run(scripts.PERSONA, keys, {"persona": text})

    async def ask_forget(self, conversation: str) -> None:
        """Note that /forget asked for its confirmation, now (the server's clock)."""
        await self._forget(conversation, "ask")

    async def forget_asked(self, conversation: str) -> bool:
        """Whether /forget asked for its confirmation within `FORGET_CONFIRM_MS`."""
        return bool(await self._forget(conversation, "asked"))

    async def forget(self, conversation: str) -> None:
        """Erase what is kept about the conversation's user: the history, the cached
        transcripts and documents (those the conversation's index names), the record of tool
        calls, the model and persona they picked, and in a group what they said to the room.
        Usage totals and dedupe ids stay."""
        await self._forget(conversation, "erase")

    async def allow_group(self, conversation: str, allowed: bool, by: str) -> None:
        """An admin's /allow (or /deny) of the group `conversation` is said in, from inside
        it: kept for every replica, overriding LASTWORD_GROUPS__ALLOWED."""
        keys = {"group": self.layout.keys(conversation).group}
        await self._run(scripts.GROUP_SET, keys, {"allowed": int(allowed), "by": by})

    async def _forget(self, conversation: str, mode: str) -> int:
        k = self.layout.keys(conversation)
        keys = {
            "state": k.state,
            "history": k.history,
            "heard": k.heard,
            "tools": k.tools,
            "room": k.room,
        }
        user = Place.of(conversation).sender
        args: dict[str, str | int] = {"mode": mode, "confirm_ms": FORGET_CONFIRM_MS, "user": user}
        return int(await self._run(scripts.FORGET, keys, args))
