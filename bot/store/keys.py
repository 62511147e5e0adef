"""Every Redis key name lastword uses, built here and nowhere else.

The names are part of a deployment's data: a running bot, `lastword status` and a bot started
after an upgrade must agree on them, so none may change without a migration.

Every script touches the keys of one hash slot only, so the same code runs on Redis Cluster:
a conversation's keys and the shard of the due-index it lives in share a hash tag.

Conversations are spread over `SHARDS` (64) shards, `shard_of` a stable hash of the
conversation id. Shard N's hash tag is `TAGS[N]`, `{lw:N.<nonce>}`, its nonce chosen so that the
tag's cluster slot is the midpoint of the N-th 64th of the 16384 slots: the shards are spread
evenly over the slot space, so a cluster of up to 64 primaries with an even slot split gets an
even share of them (3 primaries: 21/22/21), and moving one slot moves at most a 64th of the
data. Below, {T} stands for the tag of the conversation's shard. A layout (the tags, hence the
shard count) is a value, `Layout`: this version's is `LAYOUT`, and the store, status and the
migration name their keys through the one they are given, never a count of their own.

The layout itself is recorded in the store, `{lw:meta}` (hash: shards, tags, the digest of
`TAGS`; and format, the stored format: `bot.store.format`), written at first start; a bot
whose layout or format differs refuses to start. Deployments made
before it keep their data under 16 shards tagged `{lw:0}`..`{lw:15}` (`LEGACY`), with the
same names after the tag: `lastword migrate-shards` moves it
(`bot.store.migrate`).

A group conversation (one person in one group and topic, `<platform>:<chat>|<topic>|<sender>`,
`bot.message.Place`) lives in its chat's shard: `shard_of` hashes the chat part only, which
for a DM is the whole id.

Key layout, for a conversation in the shard tagged {T}:

    {T}:c:<conversation>:state       hash    v (version), w (watermark), fence, discards,
                                             last (the platform id of the last new message),
                                             failures and retry_at (failed attempts in a row,
                                             when to try next), outages (attempts in a row cut
                                             short by an outage: backed off, not counted as
                                             failures), unreachable (1: the user
                                             blocked us or closed DMs; cleared when they write),
                                             since (when the oldest unanswered message arrived:
                                             the starvation guard's clock), model (picked with
                                             /model), persona (the user's own instructions,
                                             /persona), forget_asked (when /forget last asked
                                             for its confirmation, ms, server clock), trace
                                             (tracing on: the open burst's W3C traceparent,
                                             until its commit) and trace_prev (the last one's)
    {T}:c:<conversation>:pending     hash    version -> message json, for (W, V]
    {T}:c:<conversation>:seen        zset    platform message ids, for dedupe
    {T}:c:<conversation>:window      hash    opened, deadline (ms, server clock)
    {T}:c:<conversation>:lease       hash    token, fence; expires on its own
    {T}:c:<conversation>:outbox      hash    text, version, reset (the last /reset covered),
                                             fence and token of the lease that passed the
                                             pre-send check, changes (the admin changes the
                                             reply announces), for a reply being sent
    {T}:c:<conversation>:history     list    json entries, oldest first, capped
    {T}:c:<conversation>:rate        string  messages in the current rate-limit window
    {T}:c:<conversation>:notice      string  set while a one-off notice must not repeat
    {T}:c:<conversation>:usage       hash    prompt, completion (tokens), replies, user
    {T}:c:<conversation>:day:<D>     hash    tokens (weighed by model cost: the budget's),
                                             prompt, completion (as spent) on UTC day D;
                                             expires after two days
    {T}:c:<conversation>:month:<M>   hash    the same in UTC month M (YYYY-MM); expires
                                             after 62 days
    {T}:c:<conversation>:heard:<F>   string  the transcript of the voice note or audio file
                                             whose stable file key is F (a document's text
                                             under "doc:" and its key); expires after the
                                             conversation's retention
    {T}:c:<conversation>:heard       zset    the index of those: F -> when its entry expires
                                             (ms, server clock), so /forget erases them
                                             without a SCAN; written with each entry
                                             (`transcript`), expired entries dropped then,
                                             and lives as long as its longest-lived entry
    {T}:c:<conversation>:tools       hash    the record of tool calls of the newest 4 turns
                                             and of the last reply sent (kept: its turn; a
                                             turn t: its burst's first version): id:<t>
                                             (random, in the calls' idempotency keys),
                                             steps:<t>, s:<t>:<k> (the calls model step k
                                             asked for, json, each with its tool's identity),
                                             v:<t>:<k> (the version its prompt covered),
                                             c:<t>:<k>:<j> (call j of step k: started with
                                             the runner's token, done with its result, or
                                             unknown); lives for the conversation's retention
    {T}:g:<chat>                     hash    a group's: allowed (1 by an admin's /allow, 0
                                             by /deny), by (the admin), at (ms)
    {T}:r:<chat>|<topic>             list    a group room's context: json entries (id, user,
                                             name, text, at) of what was said to others,
                                             newest last, capped; expires with its newest
    {T}:due                          zset    conversation -> when to look at it next
    {T}:active                       zset    conversation -> when it last sent a new message
    {T}:usage:<D>:totals             hash    prompt, completion, generations, replies,
                                             interrupted, forced of the shard on UTC day D;
                                             expires after two days
    {T}:usage:<D>:ranking            zset    conversation -> its tokens on day D; likewise
    {T}:access                       hash    user id -> a copy of the user's record in
                                             `{lw:access}` (below), so ingest and the budget
                                             check read it in the conversation's own slot;
                                             and ~seq: the shard holds every change up to
                                             this seq (the sweep mends a shard behind)

A person (one user of one platform, wherever they write: `person_keys`) has keys of their own,
in the shard of their home, `<platform>:<user>`: the conversation id a DM with them has where a
DM's chat is the user (Telegram's), so such a DM shares their slot. Below, {P} stands for that
shard's tag:

    {P}:p:<platform>:<user>:rate     string  the person's messages in the current rate-limit
                                             window, in every place (ingest.lua counts a home
                                             DM's, person.lua every other place's)
    {P}:p:<platform>:<user>:counted  hash    "<conversation>\n<message id>" -> 1: the messages
                                             person.lua counted in the current window, so a
                                             retried ingest (its place's slot was out of
                                             reach) is not counted twice; expires with `rate`
    {P}:p:<platform>:<user>:places   zset    conversation -> when the person last spoke there
                                             (ms, server clock): every place but the home DM
                                             where they addressed the bot or spoke to the room,
                                             so /forget finds them; at most `PLACES_CAP`
                                             (bot.store.person), none older than the
                                             conversations' retention, and expires with them
    {P}:p:<platform>:<user>:memory   hash    the person's memory (bot.store.memory): f:<n> ->
                                             a fact (JSON: text, where, at, key), next (the
                                             last number given), off and groups (their
                                             switches); at most LASTWORD_MEMORY__FACTS facts,
                                             renewed for the retention by each write and read
    {P}:p:<platform>:<user>:day:<D>  hash    tokens (weighed), prompt, completion the person
                                             spent on UTC day D in every place: what the daily
                                             budget and /usage read; expires after two days
    {P}:p:<platform>:<user>:month:<M> hash   the same in UTC month M; expires after 62 days

A conversation's own day and month (above) are the place's share of the person's.

A conversation's long-lived keys (state, pending, seen, history, outbox, usage, window) expire
together after `retention_ms` without a message or a reply: every step that writes them renews
their lifetime. A cached transcript, and the index naming it, last `retention_ms` from when it
was written.

Roles (one holder across all replicas for a shared job, such as a platform's single poller;
`role` and `role_release`), all in one slot:

    {lw:role}:<name>                 hash    token, fence; expires on its own
    {lw:role}                        hash    role name -> last fence handed out
    {lw:role}:kept:<name>            string  a small value a role holder keeps for the next
                                             holder (a gateway session to resume); expires

The layout of the shards, written once, at the first start (`Store.check_layout`), or by
`lastword migrate-shards`, in a slot of its own:

    {lw:meta}                        hash    shards (64), tags (`TAGS_DIGEST`)

Access changed in chat by an admin (/allow, /deny, /budget; `access_set`), in a slot of its
own, and copied into every shard's `{T}:access` (`access_copy`, which never replaces a copy
with an older one):

    {lw:access}                      hash    user id -> record json: access ("allow" or
                                             "deny"), budget (daily tokens), by (the admin),
                                             at (ms), seq (orders the changes)
    {lw:access}:seq                  string  the last seq handed out (never below the
                                             server's time in ms when it was handed out)

Replicas announce themselves with a heartbeat (`heartbeat`), a hash that expires on its own,
under a hash tag of its own, since it belongs to no conversation's slot:

    {lw:replica}:<replica id>        hash    pid, host, platform, started_at (ms), last_beat
                                             (ms), plus whatever the replica adds (e.g.
                                             cycles, roles)

The outbound budget of a platform's bot (`budget_take`, `budget_hold`), shared
by every replica, in one slot per platform, {O} = `{lw:out:<platform>}` (with
LASTWORD_OUTBOUND__BUDGET=replica, `{lw:out:<platform>:<replica id>}`: each replica's own).
A scope is one limit's subject, e.g. `bot`, `chat:42`, `group:-100123`:

    {O}:tickets                      zset    waiting reply's ticket -> when it counts as
                                             gone unless it asks again (ms, server clock)
    {O}:holds                        zset    scope -> when its 429 hold ends (for status)
    {O}:sent:<scope>                 zset    call id -> when it counts from: when it was
                                             answered, or (in flight) a bound ahead; at
                                             most the scope's count within its period
    {O}:queue:<scope>                zset    ticket -> when the reply's window closed
    {O}:hold:<scope>                 string  when the scope's 429 hold ends; expires then
    {O}:people:<scope>               zset    in a scope shared fairly (a group's): person ->
                                             when they may take its next slot (ms, server
                                             clock); dropped a period after, and expires
                                             with the last
"""

from __future__ import annotations

import functools
import zlib
from dataclasses import dataclass
from datetime import date

from bot.message import GROUP_MARK, chat_of

# Fixed for the life of a deployment: changing it, or a tag, moves conversations to other
# shards. The store records both (`META_KEY`); a bot that disagrees refuses to start.
SHARDS = 64

# The hash tag of each shard. Shard N's is `{lw:N.<nonce>}` with the smallest nonce (counting
# from 0) whose CRC16 slot, as Redis Cluster computes it, is N * 256 + 128: the midpoint of the
# N-th 64th of the slot space. Computed once and kept as they are (a deployment's data lives
# under them); tests/store/test_shards.py checks the spacing. Never `{lw:<digits>}`: those are the
# legacy tags.
# fmt: off
TAGS: tuple[str, ...] = (
    "{lw:0.10592}", "{lw:1.22676}", "{lw:2.51782}", "{lw:3.2945}", "{lw:4.5785}",
    "{lw:5.23512}", "{lw:6.25708}", "{lw:7.40780}", "{lw:8.17428}", "{lw:9.288}",
    "{lw:10.108223}", "{lw:11.2953}", "{lw:12.15349}", "{lw:13.3813}", "{lw:14.944}",
    "{lw:15.801}", "{lw:16.9218}", "{lw:17.40790}", "{lw:18.19288}", "{lw:19.1908}",
    "{lw:20.416}", "{lw:21.553}", "{lw:22.9039}", "{lw:23.18979}", "{lw:24.4184}",
    "{lw:25.14108}", "{lw:26.12312}", "{lw:27.1909}", "{lw:28.2716}", "{lw:29.2243}",
    "{lw:30.1090}", "{lw:31.15618}", "{lw:32.11192}", "{lw:33.23276}", "{lw:34.16821}",
    "{lw:35.18291}", "{lw:36.15584}", "{lw:37.22112}", "{lw:38.3947}", "{lw:39.28333}",
    "{lw:40.10263}", "{lw:41.11144}", "{lw:42.1785}", "{lw:43.16079}", "{lw:44.9587}",
    "{lw:45.6945}", "{lw:46.13748}", "{lw:47.40071}", "{lw:48.8391}", "{lw:49.2821}",
    "{lw:50.17693}", "{lw:51.20205}", "{lw:52.28262}", "{lw:53.5995}", "{lw:54.13285}",
    "{lw:55.21161}", "{lw:56.2932}", "{lw:57.8282}", "{lw:58.10729}", "{lw:59.43010}",
    "{lw:60.18755}", "{lw:61.19472}", "{lw:62.38198}", "{lw:63.7934}",
)
# fmt: on
# The layout of every deployment made before the tags above: 16 shards, tagged `{lw:0}` to
# `{lw:15}`, the same hash of the conversation id. Only `lastword migrate-shards` uses it.
LEGACY_SHARDS = 16

# The recorded layout (see the module's docstring).
META_KEY = "{lw:meta}"

# The hash tag of every role key: a role script touches this one slot only. It also names the
# hash of fence counters, which no role key can be, since every role key has a `:` after it.
ROLE_TAG = "{lw:role}"

# Access changed in chat: every user's record, and the counter that orders the changes.
ACCESS_KEY = "{lw:access}"
ACCESS_SEQ_KEY = "{lw:access}:seq"

HEARTBEAT_PREFIX = "{lw:replica}:"
# SCAN's MATCH for every heartbeat: `lastword status` finds the live replicas with it.
HEARTBEAT_PATTERN = f"{HEARTBEAT_PREFIX}*"


@dataclass(frozen=True)
class Layout:
    """How conversations are spread over shards: one hash tag per shard, a conversation's
    shard a stable hash of its id, and the names of each shard's keys. A value handed to
    whatever names keys (`Keys`, the store, status, the migration), so that a store of
    another layout (the legacy one, which the migration reads) is built, not patched in."""

    tags: tuple[str, ...]

    @property
    def shards(self) -> int:
        return len(self.tags)

    @property
    def digest(self) -> str:
        """What the store records of the tags: a change of any tag changes it."""
        return f"{zlib.crc32(','.join(self.tags).encode()):08x}"

    def shard_of(self, conversation: str) -> int:
        # By its chat: a group's people share a shard with the group's own keys, so one
        # script decides whether a message there is addressed, a follow-up or overheard.
        return zlib.crc32(chat_of(conversation).encode()) % self.shards

    def due_key(self, shard: int) -> str:
        return f"{self.tags[shard]}:due"

    def active_key(self, shard: int) -> str:
        return f"{self.tags[shard]}:active"

    def access_key(self, shard: int) -> str:
        """A shard's copy of the access records (`ACCESS_KEY`)."""
        return f"{self.tags[shard]}:access"

    def usage_day_keys(self, shard: int, when: date) -> tuple[str, str]:
        """A shard's day: totals (hash: prompt, completion, generations, replies,
        interrupted, forced), and its conversations ranked by tokens (sorted set). In the
        shard's slot, so the scripts can write them with the conversation's own keys."""
        base = f"{self.tags[shard]}:usage:{when.isoformat()}"
        return f"{base}:totals", f"{base}:ranking"

    def keys(self, conversation: str) -> Keys:
        """The names of `conversation`'s keys in this layout."""
        return _keys(conversation, self)

    def person_keys(self, platform: str, user: str) -> PersonKeys:
        """The names of a person's keys (one user of `platform`) in this layout."""
        return _person_keys(platform, user, self)


# This version's layout, which the store records (`META_KEY`), and the legacy one.
LAYOUT = Layout(TAGS)
LEGACY = Layout(tuple(f"{{lw:{n}}}" for n in range(LEGACY_SHARDS)))
TAGS_DIGEST = LAYOUT.digest

# This version's names, for code that knows no other layout.
shard_of = LAYOUT.shard_of
due_key = LAYOUT.due_key
active_key = LAYOUT.active_key
access_key = LAYOUT.access_key
usage_day_keys = LAYOUT.usage_day_keys
legacy_shard_of = LEGACY.shard_of


def legacy_tag(shard: int) -> str:
    """The hash tag of a legacy shard: `{lw:N}`."""
    return LEGACY.tags[shard]


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


class BudgetKeys:
    """The names of one outbound budget's keys (a platform's, shared or one replica's); all
    share its hash tag."""

    def __init__(self, platform: str, replica: str | None = None) -> None:
        self.base = (
            f"{{lw:out:{platform}}}" if replica is None else f"{{lw:out:{platform}:{replica}}}"
        )
        self.tickets = f"{self.base}:tickets"
        self.holds = f"{self.base}:holds"
        # When this budget's keys were first written (budget_take.lua): a budget found without
        # it lost its state, and starts as if its last period were full.
        self.epoch = f"{self.base}:epoch"
        # The 429s heard, by the kind of scope: how many, and the ms held (budget_hold.lua).
        self.heard = f"{self.base}:heard"
        # The scopes a 429 named lately, each with when (budget_hold.lua: several at once
        # hold the bot).
        self.recent = f"{self.base}:recent"
        # How many places and slots were given back early (budget_leave.lua, budget_take.lua's
        # answers of calls never made): replicas' waiting replies may then come sooner than told.
        self.freed = f"{self.base}:freed"

    def scope(self, name: str) -> tuple[str, str, str]:
        """A scope's sent, queue and hold keys, in that order (as budget_take.lua reads
        them)."""
        return f"{self.base}:sent:{name}", f"{self.base}:queue:{name}", f"{self.base}:hold:{name}"

    def people(self, name: str) -> str:
        """A scope's share of each person, where it is shared fairly (budget_take.lua)."""
        return f"{self.base}:people:{name}"


class Keys:
    """The names of one conversation's keys; all share the hash tag of its shard."""

    def __init__(self, conversation: str, layout: Layout = LAYOUT) -> None:
        shard = layout.shard_of(conversation)
        # Every key of the conversation starts with this and a ":".
        self.base = f"{layout.tags[shard]}:c:{conversation}"
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
        # The index of cached transcripts; each entry's key is this, ":", its file key.
        self.heard = f"{self.base}:heard"
        self.tools = f"{self.base}:tools"
        # A group's keys, in its shard: whether admins allowed it, and each room's (topic's)
        # context. A DM's names are never written.
        chat, _, rest = conversation.partition(GROUP_MARK)
        self.group = f"{layout.tags[shard]}:g:{chat}"
        self.room = f"{layout.tags[shard]}:r:{chat}{GROUP_MARK}{rest.partition(GROUP_MARK)[0]}"
        self.due = layout.due_key(shard)
        self.active = layout.active_key(shard)
        self.access = layout.access_key(shard)
        self.shard = shard
        self.layout = layout

    def day(self, when: date) -> str:
        return f"{self.base}:day:{when.isoformat()}"

    def month(self, when: date) -> str:
        return f"{self.base}:month:{when.strftime('%Y-%m')}"

    def day_totals(self, when: date) -> str:
        """The totals of the conversation's shard on day `when` (`usage_day_keys`)."""
        return self.layout.usage_day_keys(self.shard, when)[0]

    def transcript(self, file_key: str) -> str:
        """The cached transcript of a file; forget.lua derives it from `heard` the same way."""
        return f"{self.heard}:{file_key}"


class PersonKeys:
    """The names of one person's keys: their rate, their places, their memory and their days
    and months, in the shard of their home (`home`, the id a DM with them has where a DM's
    chat is the user), so a script touching them touches one slot."""

    def __init__(self, platform: str, user: str, layout: Layout = LAYOUT) -> None:
        self.person = f"{platform}:{user}"
        self.home = self.person
        shard = layout.shard_of(self.home)
        self.base = f"{layout.tags[shard]}:p:{self.person}"
        self.rate = f"{self.base}:rate"
        self.counted = f"{self.base}:counted"
        self.places = f"{self.base}:places"
        # Their facts and memory switches (`bot.store.memory`).
        self.memory = f"{self.base}:memory"
        # The shard's copy of the access records: the budget an admin set, read with the days.
        self.access = layout.access_key(shard)
        self.shard = shard

    def day(self, when: date) -> str:
        return f"{self.base}:day:{when.isoformat()}"

    def month(self, when: date) -> str:
        return f"{self.base}:month:{when.strftime('%Y-%m')}"


# The names of the conversations and people at work lately, made once: every step of a
# reply names its keys again (about a dozen f-strings and a hash of the id each time), and
# the names of an id never change. Read-only by every caller.
NAMES_CACHED = 4096
_keys = functools.lru_cache(maxsize=NAMES_CACHED)(Keys)
_person_keys = functools.lru_cache(maxsize=NAMES_CACHED)(PersonKeys)
