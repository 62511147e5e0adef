"""The store's Lua scripts, each one step of the flow, declared with its KEYS and ARGV by name.

Every script file next to this module is one step; `prelude.lua` holds their shared helpers
and is loaded in front of each. A script's header reads each key and argument into a local of
the declared name, in the declared order (`local state = KEYS[1]`, `local ttl_ms =
tonumber(ARGV[3])`), and tests/store/test_scripts.py holds every header to its declaration here: a
caller names what it passes (`Script.ordered_keys`, `Script.ordered_args`), so adding one
touches the declaration, the script and the caller, nothing positional. A script with more
than a scalar to say answers with a JSON object (`cjson.encode`) that `bot.store.replies`
decodes into the store's dataclasses.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any


def _load(name: str) -> str:
    folder = resources.files(__package__)
    prelude = folder.joinpath("prelude.lua").read_text()
    return prelude + "\n" + folder.joinpath(f"{name}.lua").read_text()


@dataclass(frozen=True)
class Script:
    """One script: its file's name, its KEYS and ARGV by name in their order, and `rest`, the
    name of what ARGV holds past the named arguments (repeated groups), if anything; likewise
    `rest_keys` for KEYS."""

    name: str
    keys: tuple[str, ...]
    args: tuple[str, ...]
    rest: str = ""
    rest_keys: str = ""
    source: str = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "source", _load(self.name))

    def ordered_keys(self, named: Mapping[str, str], rest: Sequence[str] = ()) -> list[str]:
        """KEYS for a call, in the script's order, from every key by its declared name, then
        `rest` (only if the script has one)."""
        if rest and not self.rest_keys:
            raise TypeError(f"{self.name}.lua takes no keys past {', '.join(self.keys)}")
        ordered: list[str] = self._ordered("keys", named, self.keys)
        return ordered + list(rest) if rest else ordered

    def ordered_args(
        self, named: Mapping[str, str | int], rest: Sequence[str | int] = ()
    ) -> list[str | int]:
        """ARGV for a call, in the script's order, then `rest` (only if the script has one)."""
        if rest and not self.rest:
            raise TypeError(f"{self.name}.lua takes no arguments past {', '.join(self.args)}")
        ordered: list[str | int] = self._ordered("args", named, self.args)
        return ordered + list(rest) if rest else ordered

    def _ordered(self, what: str, named: Mapping[str, Any], declared: tuple[str, ...]) -> list[Any]:
        """`named` in the declared order. A name missing or unknown is a caller's bug: caught
        here, not as a script's misreading of a shifted position. (Checked by count and
        lookup, not with sets: this runs on every call of every step.)"""
        try:
            if len(named) == len(declared):
                return [named[name] for name in declared]
        except KeyError:
            pass
        missing = sorted(set(declared) - named.keys())
        unknown = sorted(named.keys() - set(declared))
        raise TypeError(f"{self.name}.lua {what}: missing {missing}, unknown {unknown}")


INGEST = Script(
    "ingest",
    keys=(
        "state",
        "pending",
        "seen",
        "window",
        "due",
        "rate",
        "active",
        "history",
        "outbox",
        "usage",
        "access",
        "group",
        "room",
    ),
    args=(
        "conversation",
        "message_id",
        "message",
        "quiet_ms",
        "max_wait_ms",
        "seen_cap",
        "rate_limit",
        "rate_window_ms",
        "active_keep_ms",
        "seen_keep_ms",
        "retention_ms",
        "verdict",
        "user",
        "speculate_ms",
        "learn_floor_ms",
        "in_group",
        "addressed",
        "said",
        "room_messages",
        "room_keep_ms",
        "typing",
        "trace",
    ),
)
TYPING = Script(
    "typing",
    keys=("state", "window", "due"),
    args=("conversation", "hold_ms", "max_wait_ms", "every_ms", "window_bound_ms"),
)
NOTICE = Script("notice", keys=("notice",), args=("period_ms",))
ACQUIRE = Script(
    "acquire",
    keys=("state", "window", "lease", "due", "pending", "history", "outbox", "room"),
    args=(
        "conversation",
        "token",
        "ttl_ms",
        "history_entries",
        "max_wait_ms",
        "backoff_cap_ms",
        "slack_ms",
        "trusted_age_ms",
        "starvation_limit",
        "starvation_age_ms",
        "room_keep_ms",
    ),
)
RENEW = Script("renew", keys=("lease", "due"), args=("conversation", "token", "fence", "ttl_ms"))
RELEASE = Script(
    "release",
    keys=("lease", "state", "window", "due"),
    args=("conversation", "token", "failed", "backoff_ms", "backoff_cap_ms"),
)
INTERRUPT = Script(
    "interrupt",
    keys=("lease", "state", "window", "due", "totals", "outbox"),
    args=("conversation", "token", "fence", "totals_keep_ms"),
)
PRESEND = Script(
    "presend",
    keys=("lease", "state", "outbox", "window", "due", "totals"),
    args=(
        "conversation",
        "token",
        "fence",
        "version",
        "text",
        "starvation_limit",
        "reset",
        "retention_ms",
        "starvation_age_ms",
        "replaces",
        "unsaid",
        "totals_keep_ms",
        "changes",
        "trusted_age_ms",
        "window_bound_ms",
        "tools",
        "turn",
    ),
)
COMMIT = Script(
    "commit",
    keys=(
        "lease",
        "state",
        "pending",
        "history",
        "outbox",
        "window",
        "due",
        "seen",
        "usage",
        "totals",
        "tools",
    ),
    args=(
        "conversation",
        "token",
        "fence",
        "history_cap",
        "outcome",
        "retention_ms",
        "totals_keep_ms",
    ),
)
SETTLE = Script(
    "settle",
    keys=("lease", "state", "pending", "outbox", "window", "due"),
    args=("conversation", "token", "fence"),
)
DUE = Script(
    "due", keys=("due", "access"), args=("limit", "horizon_ms"), rest_keys="further_shards_pairs"
)
USAGE = Script(
    "usage",
    keys=("usage", "day", "totals", "ranking", "month"),
    args=(
        "prompt",
        "completion",
        "user",
        "day_keep_ms",
        "conversation",
        "retention_ms",
        "month_keep_ms",
        "cost",
    ),
)
PERSON = Script(
    "person",
    keys=("rate", "places", "counted"),
    args=(
        "place",
        "message_id",
        "counts",
        "rate_limit",
        "rate_window_ms",
        "places_cap",
        "keep_ms",
    ),
)
PERSON_USAGE = Script(
    "person_usage",
    keys=("day", "month"),
    args=("prompt", "completion", "cost", "day_keep_ms", "month_keep_ms"),
)
ROLE = Script("role", keys=("role", "fences"), args=("mode", "name", "token", "fence", "ttl_ms"))
ROLE_RELEASE = Script("role_release", keys=("role",), args=("token",))
HEARTBEAT = Script(
    "heartbeat", keys=("heartbeat",), args=("ttl_ms", "started_at"), rest="field_value_pairs"
)
ACCESS_SET = Script(
    "access_set", keys=("records", "sequence"), args=("user", "field", "value", "by")
)
ACCESS_COPY = Script(
    "access_copy",
    keys=("shard",),
    args=("whole_after", "whole_before"),
    rest="user_record_seq_triples",
)
TRANSCRIPT = Script(
    "transcript", keys=("transcript", "heard"), args=("file_key", "text", "retention_ms")
)
FORGET = Script(
    "forget",
    keys=("state", "history", "heard", "tools", "room"),
    args=("mode", "confirm_ms", "user"),
)
GROUP_SET = Script("group_set", keys=("group",), args=("allowed", "by"))
GROUP_MOVE = Script("group_move", keys=("group",), args=("allowed", "from"))
GROUP_ADOPT = Script(
    "group_adopt",
    keys=("state", "history", "tools"),
    args=("version", "persona", "model", "retention_ms", "record"),
    rest="history_entries",
)
PERSONA = Script("persona", keys=("state",), args=("persona",))
MEMORY_SAVE = Script(
    "memory_save",
    keys=("memory",),
    args=("text", "where", "key", "replace", "cap", "evict", "keep_ms"),
)
MEMORY_DROP = Script("memory_drop", keys=("memory",), args=("n", "erase"))
MEMORY_SWITCH = Script("memory_switch", keys=("memory",), args=("name", "on", "keep_ms"))
TOOL_STEP = Script(
    "tool_step",
    keys=("lease", "tools"),
    args=("token", "fence", "turn", "step", "calls", "version", "id", "retention_ms"),
)
TOOL_BEGIN = Script(
    "tool_begin",
    keys=("lease", "tools", "window", "state"),
    args=(
        "token",
        "fence",
        "turn",
        "call",
        "side_effects",
        "version",
        "window_bound_ms",
        "retention_ms",
    ),
)
TOOL_END = Script(
    "tool_end",
    keys=("tools",),
    args=("token", "turn", "call", "status", "text", "error", "retention_ms"),
)

# The shared outbound budget (bot/store/budget.py). budget_take: ARGV past the named ones are
# the stamps' count and each stamp's (grant, used, scope count), then each ask's (kind, ticket,
# order_ms, grant, person, keep_free_pct, scope count) and its scopes' (name, count, per_ms,
# fair); KEYS past the named ones, each stamp's scopes' sent, then each ask's scopes' (sent,
# queue, hold, people) in turn.
BUDGET_TAKE = Script(
    "budget_take",
    keys=("tickets", "holds", "epoch", "previews_hold", "freed"),
    args=("in_flight_ms", "lapse_ms", "poll_ms", "fair_burst", "epoch_keep_ms", "seen"),
    rest="stamps_then_asks_each_with_its_scopes",
    rest_keys="stamps_sent_then_asks_sent_queue_hold_people",
)
BUDGET_HOLD = Script(
    "budget_hold",
    keys=("hold", "holds", "heard", "recent", "bot_hold"),
    args=("scope", "hold_ms", "spread", "spread_count", "spread_ms", "bot_scope", "heard_keep_ms"),
)
BUDGET_KEEP = Script(
    "budget_keep",
    keys=("tickets", "freed"),
    args=("lapse_ms", "freed_keep_ms"),
    rest="tickets_then_calls_in_flight",
    rest_keys="calls_in_flight_sent",
)
BUDGET_LEAVE = Script(
    "budget_leave",
    keys=("tickets", "freed"),
    args=("ticket", "freed_keep_ms"),
    rest_keys="queues",
)

# Every script, by its file's name (each `.lua` file but the prelude is one).
ALL: dict[str, Script] = {
    script.name: script
    for script in (
        INGEST,
        TYPING,
        NOTICE,
        ACQUIRE,
        RENEW,
        RELEASE,
        INTERRUPT,
        PRESEND,
        COMMIT,
        SETTLE,
        DUE,
        GROUP_SET,
        GROUP_MOVE,
        GROUP_ADOPT,
        USAGE,
        PERSON,
        PERSON_USAGE,
        ROLE,
        ROLE_RELEASE,
        HEARTBEAT,
        ACCESS_SET,
        ACCESS_COPY,
        TRANSCRIPT,
        FORGET,
        PERSONA,
        MEMORY_SAVE,
        MEMORY_DROP,
        MEMORY_SWITCH,
        TOOL_STEP,
        TOOL_BEGIN,
        TOOL_END,
        BUDGET_TAKE,
        BUDGET_HOLD,
        BUDGET_KEEP,
        BUDGET_LEAVE,
    )
}
