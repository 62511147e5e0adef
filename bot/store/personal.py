"""What the store keeps that a user chose or may take back: the persona (/persona) and the
erasure of everything kept about them (/forget). Both live in the conversation's slot, like
the model picked with /model, so every replica reads them at once.

Functions of a `Store` rather than its methods for now (they use its client and its error
handling, nothing private)."""

from __future__ import annotations

import re
from importlib import resources

from bot.store import Keys, Store, reaching_redis

# How long /forget waits for the same command again before it asks anew.
FORGET_CONFIRM_MS = 60_000
# Keys a SCAN step looks at: the transcript cache has no index, so /forget looks for it.
SCAN_COUNT = 1000
# Characters with a meaning in a SCAN pattern; a conversation's keys are matched literally.
GLOB = re.compile(r"([*?\[\]\\])")


def _script(name: str) -> str:
    return resources.files(__package__).joinpath(f"{name}.lua").read_text()


FORGET = _script("forget")
PERSONA = _script("persona")


async def persona(store: Store, conversation: str) -> str:
    """The user's own instructions for this conversation ("" for none)."""
    with reaching_redis():
        raw = await store.redis.hget(Keys(conversation).state, "persona")
    return "" if raw is None else raw.decode() if isinstance(raw, bytes) else str(raw)


async def keep_persona(store: Store, conversation: str, text: str) -> None:
    """Keep the user's instructions for every replica ("" drops them)."""
    script = store.redis.register_script(PERSONA)
    with reaching_redis():
        await script(keys=[Keys(conversation).state], args=[text])


async def ask_forget(store: Store, conversation: str) -> None:
    """Note that /forget asked for its confirmation, now (the server's clock)."""
    await _forget(store, [Keys(conversation).state], "ask")


async def forget_asked(store: Store, conversation: str) -> bool:
    """Whether /forget asked for its confirmation within `FORGET_CONFIRM_MS`."""
    return bool(await _forget(store, [Keys(conversation).state], "asked"))


async def forget(store: Store, conversation: str) -> None:
    """Erase what is kept about the conversation's user: the history, the cached transcripts
    and documents, the model and persona they picked. Usage totals and dedupe ids stay."""
    k = Keys(conversation)
    cached = await _cached(store, conversation)
    await _forget(store, [k.state, k.history, *cached], "erase")


async def _cached(store: Store, conversation: str) -> list[str]:
    """The keys of the conversation's cached transcripts and documents."""
    pattern = GLOB.sub(r"\\\1", Keys(conversation).transcript("")) + "*"
    with reaching_redis():
        return [key async for key in store.redis.scan_iter(match=pattern, count=SCAN_COUNT)]


async def _forget(store: Store, keys: list[str], mode: str) -> int:
    script = store.redis.register_script(FORGET)
    with reaching_redis():
        return int(await script(keys=keys, args=[mode, FORGET_CONFIRM_MS]))
