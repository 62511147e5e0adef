"""What a replica counts about its own work (`Stats`): for /metrics, the logs, the benchmarks
and the tests. Kept in the replica only; what every replica did together is in the store's
day totals (/stats, `lastword status`)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

# The bucket bounds the GenAI semantic conventions advise for these two histograms.
TOKEN_BOUNDS = tuple(float(4**n) for n in range(14))
SECONDS_BOUNDS = tuple(0.01 * 2**n for n in range(14))


@dataclass
class Buckets:
    """A histogram kept as cumulative bucket counts, the shape Prometheus exposes."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.bounds)

    def observe(self, value: float) -> None:
        self.total += value
        self.count += 1
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[i] += 1


@dataclass
class Stats:
    """Counters a replica keeps about its own work, for metrics, logs, benchmarks and tests."""

    # Intake (counted by the runtime): messages taken in, dropped as redeliveries, dropped by
    # the rate limit, refused by the allow-list, said in a group to others (kept as the
    # room's context only); windows opened, and messages that found their window at its
    # hard cap.
    ingested: int = 0
    duplicates: int = 0
    rate_limited: int = 0
    refused: int = 0
    overheard: int = 0
    windows_opened: int = 0
    windows_capped: int = 0
    # Users' typing signals passed on to the store (one a second per person at most); of
    # those, the ones that held an open window, and the speculative generations they cut.
    typing_signals: int = 0
    typing_held: int = 0
    typing_cut: int = 0
    # Cycles that took the lease; wake-ups with nothing owed (no-op) or not yet due / held
    # elsewhere (deferred).
    cycles: int = 0
    noop: int = 0
    deferred: int = 0
    replies: int = 0
    parts: int = 0
    renewal_failures: int = 0
    discarded: int = 0
    forced: int = 0
    apologies: int = 0
    # Bursts answered with an apology because their reply failed `llm.attempts` times.
    given_up: int = 0
    resent: int = 0
    lost: int = 0
    # Attempts that failed (a platform or store error) and were handed back, backed off;
    # replies given up after a permanent error or too many failures; replies to users who
    # cannot be reached (they blocked the bot, or closed their DMs).
    failed: int = 0
    abandoned: int = 0
    # Commits that failed for good after their reply was sent (the conversation moved on
    # without them: `Store.settle`).
    commits_failed: int = 0
    unreachable: int = 0
    # Generations cancelled because a newer message arrived, and the tokens they had
    # streamed by then; tokens of finished replies thrown away by the pre-send check.
    interrupted: int = 0
    interrupted_tokens: int = 0
    # Speculation: generations started with the window still open; of those, cut short by a
    # message of the same burst (and the tokens they had streamed), and replies that waited
    # for their window to close.
    speculated: int = 0
    restarted: int = 0
    restarted_tokens: int = 0
    held: int = 0
    # Tool calls run, and those whose recorded result a later generation of the burst reused.
    tool_calls: int = 0
    tool_calls_reused: int = 0
    discarded_tokens: int = 0
    # What the interrupts saved, estimated: a cancelled generation would likely have gone on
    # to the mean length of the finished ones (0 until one has finished).
    saved_tokens: int = 0
    finished: int = 0
    finished_tokens: int = 0
    over_budget: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # The most recent wake-up latenesses; bounded so a long-running replica does not grow.
    lateness_ms: deque[int] = field(default_factory=lambda: deque(maxlen=10_000))
    lateness: Buckets = field(
        default_factory=lambda: Buckets((5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000))
    )
    # Live drafts shown (where the platform has them), and how long after the generation
    # started the first one was.
    drafts: int = 0
    first_draft_seconds: Buckets = field(
        default_factory=lambda: Buckets((0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8))
    )
    # Seconds from the request to the answer, for generations that finished.
    llm_seconds: Buckets = field(
        default_factory=lambda: Buckets((0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 128))
    )
    # OpenTelemetry's GenAI client metrics, per model request: its tokens by type, and its
    # duration, by (operation, provider, model[, token type | error type]). The models are the
    # settings' (a handful), so the keys stay few.
    gen_ai_tokens: dict[tuple[str, ...], Buckets] = field(default_factory=dict)
    gen_ai_seconds: dict[tuple[str, ...], Buckets] = field(default_factory=dict)

    def model_request(
        self, provider: str, model: str, tokens: tuple[int, int], seconds: float, error: str = ""
    ) -> None:
        """One request to the model: its (input, output) tokens and how long it took."""
        for kind, count in zip(("input", "output"), tokens, strict=True):
            key = ("chat", provider, model, kind)
            self.gen_ai_tokens.setdefault(key, Buckets(TOKEN_BOUNDS)).observe(count)
        key = ("chat", provider, model, error)
        self.gen_ai_seconds.setdefault(key, Buckets(SECONDS_BOUNDS)).observe(seconds)
