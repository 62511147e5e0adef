"""What every area of the store shares: the settings the scripts are told with each call, the
delays the flow sets, and the day the counters count in."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime

from bot.config.settings import Settings
from bot.store.durability import DEFAULT_LEVEL, DEFAULT_WAIT_MS, Level

# After a failed attempt at a conversation (a platform or store error), the next one waits
# this long, doubling per failure in a row up to the cap, whichever replica makes it.
RETRY_AFTER_ERROR_MS = 1000
RETRY_AFTER_ERROR_CAP_MS = 60_000
# A time the store holds further ahead than the flow ever sets one, by more than this, was set
# by a clock that has since moved back (a failover to a node behind): it counts as run out.
CLOCK_SLACK_MS = 1000
# A day's counts outlive the day, so a status read just after midnight still sees them.
DAY_KEEP_MS = 2 * 86_400_000


def utc_today() -> date:
    """The day the counters count in. The replica's clock picks it: a skew of seconds at
    midnight does not matter."""
    return datetime.now(UTC).date()


@dataclass(frozen=True)
class StoreSettings:
    """What the scripts are told with each call. Replaced whole by a reload (`Store.configure`)."""

    quiet_ms: int
    max_wait_ms: int
    ttl_ms: int
    history_cap: int
    starvation_limit: int
    starvation_age_ms: int = 0
    rate_per_minute: int = 0
    retention_ms: int = 30 * 86_400_000
    # What ingest, pre-send and commit wait for (bot.store.durability).
    durability: Level = DEFAULT_LEVEL
    # How long each of those waits before the step counts as a store outage.
    durability_wait_ms: int = DEFAULT_WAIT_MS
    # Speculation starts this long after a message, if the window is still open then (0: off).
    speculate_ms: int = 0
    # The learned window's floor (0: the window does not learn; `quiet_ms` is its ceiling).
    learn_floor_ms: int = 0
    # A group room's context: at most this many messages said to others, none older than
    # `room_keep_ms` (`GroupsSettings`).
    room_messages: int = 30
    room_keep_ms: int = 3_600_000

    @property
    def horizon_ms(self) -> int:
        """The longest delay the flow sets (a window, a lease, a backoff), with slack: a time
        the store holds further ahead than this is the work of a clock that moved back."""
        return max(self.max_wait_ms, self.ttl_ms, RETRY_AFTER_ERROR_CAP_MS) + CLOCK_SLACK_MS

    @property
    def trusted_age_ms(self) -> int:
        """The oldest age of the oldest unanswered message the starvation guard believes (0:
        the guard's age is off): the guard's age, a window (max_wait) and a generation (lease
        TTL) more; at the pre-send check also the time the cycle has worked (`presend`'s
        `worked_ms`). An age beyond it is taken for a clock that moved forward; the guard's
        clock then starts again, and only the discard count can force a reply meanwhile."""
        if not self.starvation_age_ms:
            return 0
        return self.starvation_age_ms + self.max_wait_ms + self.ttl_ms

    @classmethod
    def of(cls, settings: Settings) -> StoreSettings:
        debounce = settings.debounce
        return cls(
            quiet_ms=debounce.quiet_ms,
            max_wait_ms=debounce.max_wait_ms,
            ttl_ms=settings.lease.ttl_ms,
            history_cap=settings.history_cap,
            starvation_limit=settings.starvation_limit,
            starvation_age_ms=settings.starvation_age_ms,
            rate_per_minute=settings.access.rate_per_minute,
            retention_ms=int(settings.retention_days * 86_400_000),
            durability=settings.durability,
            durability_wait_ms=settings.durability_wait_ms,
            # Speculating without interrupts would let a burst's every message start a
            # generation that runs to its end.
            speculate_ms=debounce.speculate_ms if settings.llm.interrupt else 0,
            # A floor of 0 would mean "no learning" to the script: learning means at least 1 ms.
            learn_floor_ms=max(min(debounce.floor_ms, debounce.quiet_ms), 1)
            if debounce.learn
            else 0,
            room_messages=settings.groups.context_messages,
            room_keep_ms=settings.groups.context_minutes * 60_000,
        )
