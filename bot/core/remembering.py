"""What a reply remembers of its person: whose memory it is, which of their facts the request
shows, and whether the model gets the memory tool, bound to them.

The person is always the one the reply answers (the last unanswered message's sender); a
group request shows their facts only if they opted in (`/memory groups on`), since everyone in
the room reads the reply. A memory that cannot be read costs the reply nothing but its facts:
it is answered without them, and the tool is not offered."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from bot.config.settings import Settings
from bot.memory import Fact, Memory, Person, Recalled, provider, saved_in
from bot.memory.tool import TOOL, MemoryRunner
from bot.message import Place, Unavailable
from bot.store import RedisMemory, Store
from bot.tools import Toolbox

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Remembered:
    """What one reply carries of its person's memory: the facts its request shows, and the
    tools bound to them (the memory tool, or none)."""

    facts: tuple[Fact, ...] = ()
    tools: Toolbox = field(default_factory=Toolbox)

    @property
    def on(self) -> bool:
        """Whether the model is told of its memory: it has facts or the tool."""
        return bool(self.facts or self.tools.tools)


FORGETFUL = Remembered()


def memory_of(settings: Settings, store: Store) -> Memory:
    """The memory the settings name: the built-in one in `store`, or an installed provider's."""
    name = settings.memory.provider
    if name == "redis":
        return RedisMemory(store, settings.memory.facts)
    return provider(name)(store, settings.memory)


def person_of(conversation: str, user: str) -> Person:
    """Whose memory a message of `user` in `conversation` concerns."""
    return Person(Place.of(conversation).platform, user)


async def remembered(
    memory: Memory, settings: Settings, conversation: str, user: str
) -> Remembered:
    """What the reply to `user` in `conversation` carries of their memory."""
    if not settings.memory.enabled:
        return FORGETFUL
    person = person_of(conversation, user)
    try:
        kept = await memory.recall(person)
    except Unavailable as exc:
        log.warning("the memory of a person was not read; replying without it: %s", exc)
        return FORGETFUL
    except Exception:
        # A provider's own failure (another service down, a bug): the reply goes on.
        log.warning("the memory of a person was not read; replying without it", exc_info=True)
        return FORGETFUL
    return remembering(kept, memory, settings.memory.fact_chars, conversation, person)


def remembering(
    kept: Recalled, memory: Memory, fact_chars: int, conversation: str, person: Person
) -> Remembered:
    """What a reply carries of `kept`: nothing if the person turned memory off; their facts
    unless it is a group they did not opt in for; the tool bound to them either way."""
    if kept.off:
        return FORGETFUL
    group = Place.of(conversation).group
    facts = kept.facts if kept.groups or not group else ()
    runner = MemoryRunner(memory, person, saved_in(conversation), fact_chars)
    return Remembered(facts, Toolbox(tools={TOOL.name: (TOOL, runner)}))
