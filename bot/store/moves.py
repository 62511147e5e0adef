"""A group that moved to another chat (a Telegram group upgraded to a supergroup): its
allowance carried to the new chat, and each person's conversation there adopted by the same
person's conversation in the new chat. The two chats are in different shards, so each step is
a script in one of them: the old chat's keys are read, the new chat's written."""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass
from typing import Any

from redis.asyncio.cluster import RedisCluster

from bot.message import GROUP_MARK, Place
from bot.store import scripts
from bot.store.person import People
from bot.store.replies import as_text

# A moved group's conversations adopted in its new chat at most (a Telegram basic group has
# at most 200 members): past it, the rest start afresh there, and the log says so.
ADOPT_CAP = 10_000
# Keys a SCAN call looks at, and conversations read (and adopted) per round trip.
SCAN_COUNT = 1000
ADOPT_BATCH = 100
# What a SCAN's MATCH takes as a pattern rather than as itself.
_GLOB = re.compile(r"([*?\[\]\\])")


@dataclass(frozen=True)
class Adopted:
    """What the move of a group's conversations found in the old chat and carried over."""

    found: int  # the old chat's conversations (at most the cap)
    adopted: int  # those whose person's conversation in the new chat took them
    capped: bool  # the old chat had more than the cap


class Moves(People):
    """A moved group's allowance and its people's conversations, carried to its new chat."""

    async def move_group(
        self, platform: str, old_chat: str, new_chat: str, *, by_settings: bool
    ) -> bool | None:
        """Carry a group's allowance to the chat it moved to: `new_chat` is allowed if
        `old_chat` was (by an admin's /allow, or `by_settings` with no admin's /deny), denied
        if an admin denied it. Two round trips, one in each chat's shard: the old group's key
        read, the new one's written (group_move.lua), unless an admin already chose in the new
        chat. Returns what the new chat was given (None: nothing to carry), whatever was kept.
        """
        old = self.layout.keys(f"{platform}:{old_chat}").group
        async with self._reaching():
            choice = as_text(await self.redis.hget(old, "allowed") or "")
        allowed = choice == "1" or (choice != "0" and by_settings)
        if not allowed and choice != "0":
            return None
        keys = {"group": self.layout.keys(f"{platform}:{new_chat}").group}
        await self._run(scripts.GROUP_MOVE, keys, {"allowed": int(allowed), "from": old_chat})
        return allowed

    async def adopt_group(
        self, platform: str, old_chat: str, new_chat: str, *, cap: int = ADOPT_CAP
    ) -> Adopted:
        """Carry each person's conversation in the group `old_chat` (in every topic) to the
        same person's conversation in `new_chat`, the chat the group moved to: its history,
        persona, model and record of tool calls, where the new one has nothing of its own yet
        (group_adopt.lua), and the new place into the person's index, so /forget finds it.
        The old conversations stay as they are: a reply still owed there is answered and kept
        there, and they expire with the retention. Found by a SCAN of the old chat's shard (on a
        cluster, of the node that holds it), at most `cap`; then per `ADOPT_BATCH`, a round
        trip to read them (the old chat's slot), one to note the places (each person's) and
        one to adopt them (the new chat's slot). Running it again is harmless. Raises
        `Unavailable` if the store cannot be reached: what was carried by then stays."""
        found, capped = await self._group_conversations(platform, old_chat, cap)
        adopted = 0
        for start in range(0, len(found), ADOPT_BATCH):
            adopted += await self._adopt(found[start : start + ADOPT_BATCH], old_chat, new_chat)
        return Adopted(len(found), adopted, capped)

    async def _group_conversations(
        self, platform: str, old_chat: str, cap: int
    ) -> tuple[list[str], bool]:
        """The conversations of the group `old_chat` (each person in each topic) that have a
        state, at most `cap`, and whether there were more."""
        chat = self.layout.keys(f"{platform}:{old_chat}")
        # A conversation's keys are its shard's head, the conversation, then the kind.
        head = chat.base.removesuffix(f"{platform}:{old_chat}")
        kind = chat.state.removeprefix(chat.base)
        match = _GLOB.sub(r"\\\1", f"{chat.base}{GROUP_MARK}") + "*" + kind
        options: dict[str, Any] = {}
        if isinstance(self.redis, RedisCluster):
            # The keys live on one node: the others would only be walked through for nothing.
            await self.redis.initialize()
            options["target_nodes"] = self.redis.get_node_from_key(chat.state)
        found: dict[str, None] = {}  # SCAN may name a key twice
        capped = False
        async with self._reaching():
            async for key in self.redis.scan_iter(match=match, count=SCAN_COUNT, **options):
                conversation = as_text(key).removeprefix(head).removesuffix(kind)
                # A cached transcript's key ends the same way only if its file key does: its
                # "sender" then holds the rest of the key's name, and a sender never has a ":".
                if ":" in Place.of(conversation).sender or conversation in found:
                    continue
                if len(found) == cap:
                    capped = True
                    break
                found[conversation] = None
        return list(found), capped

    async def _adopt(self, conversations: list[str], old_chat: str, new_chat: str) -> int:
        """Adopt these conversations of the group `old_chat` in `new_chat` (`adopt_group`).
        Returns how many were adopted."""
        async with self._reaching(), self.redis.pipeline(transaction=False) as pipe:
            for conversation in conversations:
                keys = self.layout.keys(conversation)
                pipe.hmget(keys.state, "w", "persona", "model")
                pipe.lrange(keys.history, 0, -1)
                pipe.hgetall(keys.tools)
            replies: list[Any] = await pipe.execute()
        carried: list[tuple[Place, dict[str, str | int], list[str | int]]] = []
        for conversation, (w, persona, model), history, record in zip(
            conversations, replies[::3], replies[1::3], replies[2::3], strict=True
        ):
            if not (history or persona or model):
                continue
            old = Place.of(conversation)
            # An anonymous admin speaks as the group itself, so as the new chat once it moved.
            sender = new_chat if old.sender == old_chat else old.sender
            place = Place(old.platform, new_chat, sender, old.topic, group=True)
            fields = {as_text(field): as_text(value) for field, value in record.items()}
            args: dict[str, str | int] = {
                "version": int(w or 0),
                "persona": as_text(persona or ""),
                "model": as_text(model or ""),
                "retention_ms": self.settings.retention_ms,
                "record": json.dumps(fields) if fields else "",
            }
            carried.append((place, args, [as_text(entry) for entry in history]))
        # Noted first: a place noted and then not adopted costs a /forget nothing, while one
        # adopted and never noted (a failure in between) would escape it, since a second run
        # leaves an adopted conversation alone.
        await asyncio.gather(
            *(
                self.note_person(place.conversation, place.sender, counts=False)
                for place, *_ in carried
            )
        )
        adopted = await asyncio.gather(
            *(
                self._run(scripts.GROUP_ADOPT, self._adopting(place), args, rest=entries)
                for place, args, entries in carried
            )
        )
        return sum(int(one) for one in adopted)

    def _adopting(self, place: Place) -> dict[str, str]:
        keys = self.layout.keys(place.conversation)
        return {"state": keys.state, "history": keys.history, "tools": keys.tools}
