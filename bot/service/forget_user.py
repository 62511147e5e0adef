"""`lastword forget-user <platform> <user id>`: an admin's erasure of one person everywhere,
for a deletion request, without asking them: what /forget erases (the conversations and
files of every place they wrote in, what they said in groups, the model and persona they
picked) and their memory. It says what it erased. The embedded store is reached as `status`
reaches it (a running bot's), or started for the command when no bot runs."""

from __future__ import annotations

from bot.config.settings import Settings
from bot.core.remembering import memory_of
from bot.memory import Person
from bot.plural import counted
from bot.store import Store, StoreSettings, StoreUnavailable, reaching_redis
from bot.store.connect import open_client
from bot.store.embedded import EmbeddedError, EmbeddedRedis, store_dir


async def forget_user(settings: Settings, platform: str, user: str) -> tuple[int, str]:
    """Erase the person; the exit code and what to print."""
    embedded: EmbeddedRedis | None = None
    if settings.redis_url:
        url = settings.redis_url
    else:
        embedded = EmbeddedRedis(store_dir(settings))
        if embedded.socket.exists():
            url, embedded = embedded.url, None  # a running bot's: it stays up
        else:
            try:
                url = embedded.start()
            except EmbeddedError as exc:
                return 1, str(exc)
    try:
        with reaching_redis():
            client = await open_client(url)
        store = Store(client, StoreSettings.of(settings))
        try:
            home = f"{platform}:{user}"
            places = await store.forget(home, user)
            facts = await memory_of(settings, store).erase(Person(platform, user))
        finally:
            await store.close()
    except StoreUnavailable as exc:
        return 1, f"nothing erased: the store cannot be reached: {exc}"
    finally:
        if embedded is not None:
            embedded.stop()
    return 0, (
        f"erased {platform} user {user}: what was kept in {counted(places, 'place')} "
        "(conversations, files, what they said in groups, the model and persona they picked) "
        f"and {counted(facts, 'fact')} of their memory; usage totals stay"
    )
