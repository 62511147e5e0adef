"""`lastword status`: what every replica and conversation is doing, read from Redis alone.

An operator running several replicas needs one view of the shared state: which replicas are
alive, who holds the platform's poller or gateway role, which conversations still owe a reply
and for how long they have waited, who holds their leases, and whether wake-ups are running
late. Everything here is read from Redis, so the view is the same whichever machine runs it,
and ages are measured on the server's clock (`TIME`), the one every deadline uses.

Replicas are found by their heartbeats (`bot.core.heartbeat`); every key read here is named in
`bot.store.keys`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from bot.message import BOT_SCOPE
from bot.outbound.pacing import HELD_LONG_S
from bot.plural import counted
from bot.store.census import (
    LeaseInfo,
    Status,
)
from bot.tokens import spent


def bot_held(ms: float) -> str:
    """What `/healthz` and `lastword status` say while the platform holds every call of the
    bot for `ms` more after a 429 (longer than `HELD_LONG_S`)."""
    left = duration(round(ms))
    return f"held: the platform takes no call from the bot for another {left} (a 429)"


def duration(ms: int | None) -> str:
    """A short human duration: 850ms, 12.3s, 4m05s, 2h03m, 3d04h; "-" for unknown."""
    if ms is None:
        return "-"
    sign, ms = ("-", -ms) if ms < 0 else ("", ms)
    if ms < 1000:
        text = f"{ms}ms"
    elif ms < 60_000:
        text = f"{ms / 1000:.1f}s"
    elif ms < 3600_000:
        text = f"{ms // 60_000}m{ms // 1000 % 60:02d}s"
    elif ms < 86_400_000:
        text = f"{ms // 3600_000}h{ms // 60_000 % 60:02d}m"
    else:
        text = f"{ms // 86_400_000}d{ms // 3600_000 % 24:02d}h"
    return sign + text


def _relative(ms: int) -> str:
    """A time relative to now, `ms` ahead of it (negative: in the past)."""
    return f"in {duration(ms)}" if ms >= 0 else f"overdue {duration(-ms)}"


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Columns left-aligned to their widest cell, two spaces apart, like kubectl's."""
    widths = [max(len(row[i]) for row in [headers, *rows]) for i in range(len(headers))]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in [headers, *rows]
    ]


def _holder(lease: LeaseInfo | None) -> str:
    if lease is None:
        return "none"
    return lease.holder if lease.holder is not None else f"? ({lease.token[:8]})"


def _section(title: str, headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """A titled table, indented, after a blank line; "none" when it has no rows."""
    body = ["  " + line for line in _table(headers, rows)] if rows else ["  none"]
    return ["", title, *body]


def render(status: Status) -> str:
    """The snapshot as text for a terminal: one aligned table per section, "none" if empty."""
    when = datetime.fromtimestamp(status.now_ms / 1000, UTC).isoformat(timespec="seconds")
    lines = [f"lastword status at {when.replace('+00:00', 'Z')} (server clock)"]
    sections = (_replicas, _roles, _held, _heard, _waiting, _leases, _wakeup, _tokens, _access)
    for section in sections:
        lines += section(status)
    return "\n".join(lines) + "\n"


def _replicas(status: Status) -> list[str]:
    rows = []
    for r in status.replicas:
        leases = sum(1 for held in status.leases if held.lease.holder == r.id)
        roles = ",".join(role.name for role in status.roles if role.lease.holder == r.id)
        up = None if r.started_at_ms is None else status.now_ms - r.started_at_ms
        rows.append(
            [
                r.id,
                r.host or "-",
                "-" if r.pid is None else str(r.pid),
                r.platform or "-",
                duration(up),
                f"{duration(r.beat_age_ms)} ago",
                str(leases),
                roles or "-",
                " ".join(f"{k}={v}" for k, v in r.info.items()) or "-",
            ]
        )
    headers = ["ID", "HOST", "PID", "PLATFORM", "UP", "LAST BEAT", "LEASES", "ROLES", "INFO"]
    return _section(f"replicas ({len(status.replicas)})", headers, rows)


def _roles(status: Status) -> list[str]:
    rows = [
        [role.name, _holder(role.lease), str(role.lease.fence), duration(role.lease.expires_in_ms)]
        for role in status.roles
    ]
    headers = ["NAME", "HOLDER", "FENCE", "EXPIRES IN"]
    return _section(f"roles ({len(status.roles)})", headers, rows)


def _held(status: Status) -> list[str]:
    rows = [[h.platform, h.scope, duration(h.ends_in_ms)] for h in status.held]
    title = f"held after a 429 ({len(status.held)}): no replica sends under these"
    # The hold /healthz reports, flagged where an operator looks.
    flags = [
        f"  {h.platform}: {bot_held(h.ends_in_ms)}"
        for h in status.held
        if h.scope == BOT_SCOPE and h.ends_in_ms > HELD_LONG_S * 1000
    ]
    return _section(title, ["PLATFORM", "SCOPE", "ENDS IN"], rows) + flags


def _heard(status: Status) -> list[str]:
    rows = [[h.platform, h.kind, f"{h.count:,}", duration(h.held_ms)] for h in status.heard]
    title = "429s heard by every replica, kept a day"
    return _section(title, ["PLATFORM", "KIND", "429S", "HELD"], rows)


def _waiting(status: Status) -> list[str]:
    rows = [
        [
            w.conversation,
            str(w.unanswered),
            duration(w.waited_ms),
            _relative(w.next_look_ms),
            _holder(w.lease),
            "yes" if w.outbox else "no",
        ]
        for w in status.waiting
    ]
    headers = ["CONVERSATION", "UNANSWERED", "WAITED", "NEXT LOOK", "LEASE", "OUTBOX"]
    return _section(f"conversations waiting ({len(status.waiting)})", headers, rows)


def _leases(status: Status) -> list[str]:
    rows = [
        [
            held.conversation,
            _holder(held.lease),
            str(held.lease.fence),
            duration(held.lease.expires_in_ms),
        ]
        for held in status.leases
    ]
    headers = ["CONVERSATION", "HOLDER", "FENCE", "EXPIRES IN"]
    return _section(f"leases held ({len(status.leases)})", headers, rows)


def _wakeup(status: Status) -> list[str]:
    wakeup = status.oldest_wakeup
    rows = [] if wakeup is None else [[wakeup.conversation, _relative(-wakeup.overdue_ms)]]
    return _section("oldest wake-up", ["CONVERSATION", "DUE"], rows)


def _tokens(status: Status) -> list[str]:
    tokens = status.tokens_today
    if tokens is None:
        return []
    # Counted as /usage and /stats count them (`bot.tokens.spent`).
    title = (
        f"tokens today ({tokens.day}, UTC): {spent(tokens.prompt, tokens.completion)} "
        f"in {counted(tokens.generations, 'generation')}; "
        f"{counted(tokens.replies, 'reply', 'replies')} to {counted(tokens.users, 'user')}, "
        f"{tokens.interrupted:,} interrupted, {tokens.forced:,} forced"
    )
    rows = [[spender.conversation, f"{spender.tokens:,}"] for spender in tokens.top]
    # No "none" under it: the totals line says as much.
    return _section(title, ["CONVERSATION", "TOKENS"], rows) if rows else ["", title]


def _access(status: Status) -> list[str]:
    rows = [
        [
            record.user,
            record.access or "-",
            "-" if record.budget is None else f"{record.budget:,}",
            record.by,
            f"{duration(status.now_ms - record.at_ms)} ago",
        ]
        for record in status.access
    ]
    headers = ["USER", "ACCESS", "DAILY BUDGET", "BY", "WHEN"]
    return _section(f"access changed in chat ({len(status.access)})", headers, rows)
