"""Every Redis key name lastword uses, built here and nowhere else.

The names are part of a deployment's data: a running bot, `lastword status` and a bot started
after an upgrade must agree on them, so none may change without a migration.

Every script touches the keys of one hash slot only, so the same code runs on Redis Cluster:
a conversation's keys and the shard of the due-index it lives in share a hash tag.

Key layout, for a conversation in shard N (of `SHARDS`):

    {lw:N}:c:<conversation>:state    hash    v (version), w (watermark), fence, discards,
                                             last (the platform id of the last new message),
                                             failures and retry_at (failed attempts in a row,
                                             when to try next), unreachable (1: the user
                                             blocked us or closed DMs; cleared when they write)
    {lw:N}:c:<conversation>:pending  hash    version -> message json, for (W, V]
    {lw:N}:c:<conversation>:seen     zset    platform message ids, for dedupe
    {lw:N}:c:<conversation>:window   hash    opened, deadline (ms, server clock)
    {lw:N}:c:<conversation>:lease    hash    token, fence; expires on its own
    {lw:N}:c:<conversation>:outbox   hash    text, version, fence of a reply being sent
    {lw:N}:c:<conversation>:history  list    json entries, oldest first, capped
    {lw:N}:c:<conversation>:rate     string  messages in the current rate-limit window
    {lw:N}:c:<conversation>:notice   string  set while a one-off notice must not repeat
    {lw:N}:c:<conversation>:usage    hash    prompt, completion (tokens), replies, user
    {lw:N}:c:<conversation>:day:<D>  hash    tokens spent on UTC day D; expires after two days
    {lw:N}:due                       zset    conversation -> when to look at it next
    {lw:N}:active                    zset    conversation -> when it last sent a new message
    {lw:N}:usage:<D>:totals          hash    prompt, completion, generations of the shard on
                                             UTC day D; expires after two days
    {lw:N}:usage:<D>:ranking         zset    conversation -> its tokens on day D; likewise

A conversation's long-lived keys (state, pending, seen, history, outbox, usage, window) expire
together after `retention_ms` without a message or a reply: every step that writes them renews
their lifetime.

Roles (one holder across all replicas for a shared job, such as a platform's single poller;
`role` and `role_release`), all in one slot:

    {lw:role}:<name>                 hash    token, fence; expires on its own
    {lw:role}                        hash    role name -> last fence handed out
    {lw:role}:kept:<name>            string  a small value a role holder keeps for the next
                                             holder (a gateway session to resume); expires

Replicas announce themselves with a heartbeat (`heartbeat`), a hash that expires on its own,
under a hash tag of its own, since it belongs to no conversation's slot:

    {lw:replica}:<replica id>        hash    pid, host, platform, started_at (ms), last_beat
                                             (ms), plus whatever the replica adds (e.g.
                                             cycles, roles)
"""

from __future__ import annotations

import zlib
from datetime import date

# Fixed for the life of a deployment: changing it moves conversations to other shards.
SHARDS = 16

# The hash tag of every role key: a role script touches this one slot only. It also names the
# hash of fence counters, which no role key can be, since every role key has a `:` after it.
ROLE_TAG = "{lw:role}"

HEARTBEAT_PREFIX = "{lw:replica}:"
# SCAN's MATCH for every heartbeat: `lastword status` finds the live replicas with it.
HEARTBEAT_PATTERN = f"{HEARTBEAT_PREFIX}*"


def shard_of(conversation: str) -> int:
    return zlib.crc32(conversation.encode()) % SHARDS


def _shard_tag(shard: int) -> str:
    return f"{{lw:{shard}}}"


def due_key(shard: int) -> str:
    return f"{_shard_tag(shard)}:due"


def active_key(shard: int) -> str:
    return f"{_shard_tag(shard)}:active"


def usage_day_keys(shard: int, when: date) -> tuple[str, str]:
    """A shard's tokens of one day: totals (hash: prompt, completion, generations), and its
    conversations ranked by tokens (sorted set). In the shard's slot, so the usage script can
    write them with the conversation's own keys."""
    base = f"{_shard_tag(shard)}:usage:{when.isoformat()}"
    return f"{base}:totals", f"{base}:ranking"


def role_key(name: str) -> str:
    """The key of a role's lease; its fence counter is a field of `ROLE_TAG`."""
    return f"{ROLE_TAG}:{name}"


def kept_key(name: str) -> str:
    return f"{ROLE_TAG}:kept:{name}"


def heartbeat_key(replica_id: str) -> str:
    return f"{HEARTBEAT_PREFIX}{replica_id}"


def replica_of(heartbeat: str) -> str:
    """The replica id a heartbeat key names."""
    return heartbeat.removeprefix(HEARTBEAT_PREFIX)


class Keys:
    """The names of one conversation's keys; all share the hash tag of its shard."""

    def __init__(self, conversation: str) -> None:
        shard = shard_of(conversation)
        # Every key of the conversation starts with this and a ":".
        self.base = f"{_shard_tag(shard)}:c:{conversation}"
        self.state = f"{self.base}:state"
        self.pending = f"{self.base}:pending"
        self.seen = f"{self.base}:seen"
        self.window = f"{self.base}:window"
        self.lease = f"{self.base}:lease"
        self.outbox = f"{self.base}:outbox"
        self.history = f"{self.base}:history"
        self.rate = f"{self.base}:rate"
        self.notice = f"{self.base}:notice"
        self.usage = f"{self.base}:usage"
        self.due = due_key(shard)
        self.active = active_key(shard)

    def day(self, when: date) -> str:
        return f"{self.base}:day:{when.isoformat()}"
