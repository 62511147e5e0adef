"""4. The store's memory: can it evict lastword's keys when memory runs short (only
`noeviction` never drops one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from bot.ops.check import Check

if TYPE_CHECKING:
    from redis.asyncio import Redis

from bot.ops.doctor.store import store_client

# The one policy under which Redis never drops a key to make room. Any other may evict a lease
# (two holders at once), a debounce window (a cap forgotten) or an accepted but unanswered
# message (lost after the platform was told it was stored). The volatile-* policies pick only
# keys with a TTL, which is no comfort: leases and windows expire, and every conversation key
# carries its retention lifetime.
SAFE_POLICY = "noeviction"


POLICY_FIX = (
    f"CONFIG SET maxmemory-policy {SAFE_POLICY}, and the same in redis.conf so a restart keeps "
    "it (on a managed service: its parameter group or settings). At the memory limit Redis "
    "then refuses writes with OOM, which lastword treats as the store being unavailable (a "
    "webhook answers 503, messages are held and retried) instead of losing state silently"
)


@dataclass(frozen=True)
class MemoryPolicy:
    policy: str | None  # None: the server would not say
    maxmemory: int  # bytes; 0 is no limit
    used: str = ""  # used_memory_human, when INFO gave it
    refused: str = ""  # why neither INFO nor CONFIG GET told us the policy


async def memory_check(url: str, where: str, timeout_s: float) -> Check:
    from redis.exceptions import RedisError

    client = store_client(url, timeout_s)
    try:
        found = await _read_memory_policy(client)
    except (RedisError, OSError) as exc:
        return Check(
            "memory",
            False,
            f"cannot read maxmemory-policy{where}: {exc}",
            f"check by hand that maxmemory-policy is {SAFE_POLICY}",
        )
    finally:
        await client.aclose()
    return memory_verdict(found, where)


async def _read_memory_policy(client: Redis) -> MemoryPolicy:
    """INFO memory first: it needs no admin right (the store check already ran INFO), and
    managed services that rename or disable CONFIG (ElastiCache, whose default policy is
    volatile-lru) still report the policy there. CONFIG GET for a server whose INFO does not."""
    from redis.exceptions import ResponseError

    refused: list[str] = []
    try:
        info = await client.info("memory")
    except ResponseError as exc:  # e.g. an ACL that allows some INFO sections only
        refused.append(f"INFO memory: {exc}")
        info = {}
    if "maxmemory_policy" in info:
        return MemoryPolicy(
            str(info["maxmemory_policy"]),
            int(info.get("maxmemory") or 0),
            str(info.get("used_memory_human") or ""),
        )
    if not refused:
        refused.append("INFO memory does not report it")
    try:
        # A pattern, not several names: CONFIG GET takes one parameter before Redis 7.
        config = await client.config_get("maxmemory*")
    except ResponseError as exc:  # renamed, disabled, or denied by an ACL
        refused.append(f"CONFIG GET: {exc}")
        config = {}
    if "maxmemory-policy" in config:
        return MemoryPolicy(str(config["maxmemory-policy"]), int(config.get("maxmemory") or 0))
    if len(refused) == 1:
        refused.append("CONFIG GET does not report it")
    return MemoryPolicy(None, 0, refused="; ".join(refused))


def memory_verdict(found: MemoryPolicy, where: str = "") -> Check:
    """✓ only for noeviction. Everything else is a ✗, including the two cases that are not
    (yet) losing anything, because what they risk is silent loss of accepted messages and the
    fix costs lastword nothing:

    - a policy that evicts, with no maxmemory: nothing is evicted today, but limits get set
      at the worst moment (memory pressure, a resize, a managed plan), often at run time by
      someone who does not know lastword's needs, and eviction then starts without a word.
      Choosing an eviction policy at all says a limit is expected.
    - a policy the server will not tell (only a server whose INFO lacks it and whose CONFIG
      is refused; real Redis 5+ and Valkey always report it in INFO): ✓ means checked, and
      this was not, so it stays ✗ until someone looks.
    """
    if found.policy is None:
        return Check(
            "memory",
            False,
            f"could not check maxmemory-policy{where}: {found.refused}",
            f"check by hand that maxmemory-policy is {SAFE_POLICY} (CONFIG GET maxmemory-policy "
            "as an admin, or the provider's console); any other policy may evict leases, "
            "debounce windows and accepted messages",
        )
    if found.maxmemory:
        limit = f"maxmemory {_bytes(found.maxmemory)}"
        if found.used:
            limit += f" ({found.used} used)"
    else:
        limit = "no maxmemory"
    if found.policy == SAFE_POLICY:
        detail = f"maxmemory-policy {SAFE_POLICY}, {limit}{where}"
        if found.maxmemory:
            detail += ": at the limit writes fail with OOM and lastword holds messages"
        return Check("memory", True, detail)
    evicts = (
        "keys with a TTL (leases, windows and, for retention, every conversation key)"
        if found.policy.startswith("volatile-")
        else "any key"
    )
    what = "leases, debounce windows and accepted but unanswered messages"
    if found.maxmemory:
        detail = (
            f"maxmemory-policy {found.policy}, {limit}{where}: at the limit Redis evicts "
            f"{evicts}, and may drop {what}"
        )
    else:
        detail = (
            f"maxmemory-policy {found.policy}, {limit}{where}: nothing is evicted while there "
            f"is no limit, but once maxmemory is set Redis evicts {evicts}, and may drop {what}"
        )
    return Check("memory", False, detail, POLICY_FIX)


def _bytes(count: int) -> str:
    """A byte count for people: 104857600 -> "100.0 MiB"."""
    size, unit = float(count), "B"
    for bigger in ("KiB", "MiB", "GiB"):
        if size < 1024:
            break
        size, unit = size / 1024, bigger
    return f"{count} B" if unit == "B" else f"{size:.1f} {unit}"
