"""What the store keeps that a user chose or may take back: the persona (/persona) and the
erasure of everything kept about them (/forget), in every place they wrote in. Each lives in
its conversation's slot, like the model picked with /model, so every replica reads them at
once; the persona reaches a cycle with its lease (`Grant.persona`)."""

from __future__ import annotations

import asyncio

from bot.message import Place
from bot.store import scripts
from bot.store.person import People

# How long /forget waits for the same command again before it asks anew.
FORGET_CONFIRM_MS = 60_000


class Personal(People):
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

    async def forget(self, conversation: str, user: str = "") -> int:
        """Erase what is kept about the person `user` (of the conversation's platform) in
        every place they wrote in (`People.places`): in each, the history, the cached
        transcripts and documents (those its index names), the record of tool calls, the
        model and persona they picked, and in a group what they said to the room. Usage
        totals (today's counts against their budget), their rate and dedupe ids stay.
        Messages still waiting for an answer elsewhere are answered, and kept as any new
        message is. Returns how many places were erased. Without `user` (a /forget an outbox
        kept from before people had places), `conversation` alone."""
        places = await self.places(conversation, user) if user else [conversation]
        # Each place is its own slot, so its own step; they are independent of one another.
        await asyncio.gather(*(self._forget(place, "erase", user) for place in places))
        if user:
            await self.forgot_places(conversation, user, places)
        return len(places)

    async def allow_group(self, conversation: str, allowed: bool, by: str) -> None:
        """An admin's /allow (or /deny) of the group `conversation` is said in, from inside
        it: kept for every replica, overriding LASTWORD_GROUPS__ALLOWED."""
        keys = {"group": self.layout.keys(conversation).group}
        await self._run(scripts.GROUP_SET, keys, {"allowed": int(allowed), "by": by})

    async def _forget(self, conversation: str, mode: str, user: str = "") -> int:
        k = self.layout.keys(conversation)
        keys = {
            "state": k.state,
            "history": k.history,
            "heard": k.heard,
            "tools": k.tools,
            "room": k.room,
        }
        # In a group the person is the place's sender; a DM's room is never written.
        user = user or Place.of(conversation).sender
        args: dict[str, str | int] = {"mode": mode, "confirm_ms": FORGET_CONFIRM_MS, "user": user}
        return int(await self._run(scripts.FORGET, keys, args))
