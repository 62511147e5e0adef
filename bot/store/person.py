"""A person: one user of one platform, wherever they write (their DM, every group and topic).
Their rate, their budget's days and the index of the places they spoke in are theirs, not a
place's, and live in a slot of their own (`bot.store.keys.PersonKeys`): a script on them never
touches a conversation's keys, nor one on a conversation theirs, unless the two share a slot
(a DM whose chat is the user: the person's home)."""

from __future__ import annotations

from typing import Literal

from bot.message import Place
from bot.store import scripts
from bot.store.calls import Calls
from bot.store.keys import PersonKeys
from bot.store.replies import as_text

# The rate limit counts messages per minute.
RATE_WINDOW_MS = 60_000
# The most places a person's index names: the ones spoken in longest ago leave first, and a
# /forget then misses only what those keep (until it expires with the retention).
PLACES_CAP = 100

# What the person's step says of a message that may reach the model (person.lua).
Rate = Literal["ok", "limited", "first_limited"]


class People(Calls):
    """The person's step at ingest, and the places a /forget must reach."""

    def person_keys(self, conversation: str, user: str) -> PersonKeys:
        """The keys of the person `user` of `conversation`'s platform."""
        return self.layout.person_keys(Place.of(conversation).platform, user)

    async def note_person(
        self, conversation: str, user: str, *, counts: bool, message_id: str = ""
    ) -> Rate:
        """Note that the person spoke at `conversation` (the index /forget reads) and, if
        `counts` (the message may reach the model), count message `message_id` against their
        rate, which every place shares: "limited" once they are over it ("first_limited" the
        first time in the rate's window, so they are told once). A message counted already
        (its ingest failed after this step and was retried, as a platform redelivers it) is
        not counted again: an outage of its place's slot must not use up the person's rate."""
        person = self.person_keys(conversation, user)
        keys = {"rate": person.rate, "places": person.places, "counted": person.counted}
        args: dict[str, str | int] = {
            "place": conversation,
            "message_id": message_id,
            "counts": int(counts),
            "rate_limit": self.settings.rate_per_minute,
            "rate_window_ms": RATE_WINDOW_MS,
            "places_cap": PLACES_CAP,
            "keep_ms": self.settings.retention_ms,
        }
        said = as_text(await self._run(scripts.PERSON, keys, args))
        if said == "first_limited":
            return "first_limited"
        return "limited" if said == "limited" else "ok"

    async def places(self, conversation: str, user: str) -> list[str]:
        """Every place where something may be kept about the person `user` of
        `conversation`'s platform: `conversation` itself, their home DM if they have one, and
        each place their index names, newest first, each once. One round trip (one slot)."""
        person = self.person_keys(conversation, user)
        async with self._reaching(), self.redis.pipeline(transaction=False) as pipe:
            pipe.zrange(person.places, 0, -1, desc=True)
            pipe.exists(self.layout.keys(person.home).state)
            named, home = await pipe.execute()
        homes = [person.home] if home else []
        return list(dict.fromkeys([conversation, *homes, *map(as_text, named)]))

    async def forgot_places(self, conversation: str, user: str, places: list[str]) -> None:
        """Take `places`, erased, out of the person's index: a later /forget does not count
        them again unless the person speaks there again."""
        if places:
            async with self._reaching():
                await self.redis.zrem(self.person_keys(conversation, user).places, *places)
