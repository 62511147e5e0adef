"""The stored format's version: recorded at the first start, checked at every start, and
an older store upgraded by `lastword migrate-shards` with nothing it meant changed.

A store of format 1 (what versions up to 0.2 wrote: replies in the history without `turn` or
`said`, an outbox's `unsaid` as a bare version, changes without a kind) is made here by
answering with this version's scripts and then writing those entries as format 1 kept them.
"""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from bot.commands import admin, encoded
from bot.core.history import Exchange, exchanges
from bot.message import InboundMessage
from bot.service.app import make_store
from bot.store import HistoryEntry, Store
from bot.store.embedded import EmbeddedRedis
from bot.store.format import (
    FORMAT,
    FormatError,
    check_format,
    upgraded_history,
    upgraded_outbox,
)
from bot.store.keys import ACCESS_KEY, META_KEY, Keys
from bot.store.migrate import check_layout, migrate
from tests.support import forked
from tests.support.console import clean_env
from tests.support.factories import RuntimeFactory, SettingsFactory
from tests.support.scripts import acquire_when_ready
from tests.support.waits import settled

pytestmark = pytest.mark.timeout(60)

CONV = "test:5"


def test_a_store_of_another_format_is_refused_with_what_to_do() -> None:
    check_format({"format": str(FORMAT)})
    with pytest.raises(FormatError, match=r"stored format 1, .*run `lastword migrate-shards`"):
        check_format({"shards": "64"})
    with pytest.raises(FormatError, match=rf"newer lastword \(stored format {FORMAT + 1}\)"):
        check_format({"format": str(FORMAT + 1)})
    with pytest.raises(FormatError, match="newer lastword"):
        check_format({"format": "two"})  # not ours to guess at
    check_format({}, older=True)  # the upgrade's own check lets an older store through
    with pytest.raises(FormatError, match="newer"):
        check_format({"format": str(FORMAT + 1)}, older=True)


async def test_a_fresh_store_records_this_format_and_a_newer_one_is_never_rewritten(
    redis: Redis,
) -> None:
    await check_layout(redis)
    assert await redis.hget(META_KEY, "format") == str(FORMAT).encode()
    await redis.hset(META_KEY, "format", FORMAT + 1)
    with pytest.raises(FormatError, match="newer"):
        await check_layout(redis)
    with pytest.raises(FormatError, match="newer"):
        await migrate(redis)
    assert await redis.hget(META_KEY, "format") == str(FORMAT + 1).encode()


def user(version: int, text: str) -> str:
    message = InboundMessage("test", "5", "u1", f"m{version}", text)
    return json.dumps({"role": "user", "v": version, "message": json.loads(message.to_json())})


def old_reply(version: int, text: str, turn: int | None = None) -> str:
    """A reply as format 1 kept it: no `said`, and a turn only if it had one."""
    entry: dict[str, Any] = {"role": "assistant", "v": version, "text": text}
    if turn is not None:
        entry["turn"] = turn
    return json.dumps(entry)


def as_meant(raw: str) -> HistoryEntry:
    """What format 1's reader made of an entry: a reply without a turn answered every message
    before it (turn 0), and one without `said` was all the model's words (None)."""
    data = json.loads(raw)
    if data["role"] == "user":
        return HistoryEntry.from_json(raw)
    return HistoryEntry(
        "assistant", int(data["v"]), data["text"], turn=int(data.get("turn", 0)), words=None
    )


def shown(found: list[Exchange]) -> list[tuple[str, int, str]]:
    return [(e.role, e.version, e.text) for x in found if x.answered for e in x.shown()]


def test_an_upgraded_history_means_what_it_meant() -> None:
    rng = random.Random(4049)
    for _ in range(300):
        entries: list[str] = []
        version = 0
        for _ in range(rng.randint(1, 12)):
            if rng.random() < 0.6:
                version += 1
                text = rng.choice(["hi", "/retry", "what now?", "/model", "ça va ✓"])
                entries.append(user(version, text))
            elif version:
                turn = rng.choice([None, None, max(1, version - rng.randint(0, 2))])
                entries.append(old_reply(version, f"reply ✓ {version}", turn))
        upgraded = upgraded_history(entries) or entries
        before = exchanges([as_meant(e) for e in entries])
        after = exchanges([HistoryEntry.from_json(e) for e in upgraded])
        assert [(x.asked, x.reply and x.reply.text) for x in after] == [
            (x.asked, x.reply and x.reply.text) for x in before
        ], entries
        assert shown(after) == shown(before)
        assert upgraded_history(upgraded) is None  # again: nothing to rewrite


def test_an_upgraded_outbox_says_the_same() -> None:
    change = '[{"user": "42", "field": "access", "value": "deny", "by": "7"}]'
    fields = {"text": "Done ✓", "unsaid": "4", "changes": change}
    upgraded = upgraded_outbox(fields)
    assert json.loads(upgraded["unsaid"]) == {"message": 4, "said": len("Done ✓".encode())}
    assert json.loads(upgraded["changes"]) == [{**json.loads(change)[0], "kind": "access"}]
    assert upgraded_outbox({**fields, **upgraded}) == {}
    assert upgraded_outbox({"text": "x", "unsaid": "", "changes": ""}) == {}


async def write_format_1(store: Store, redis: Redis) -> None:
    """An answered exchange and a reply left in the outbox by a replica that crashed, as a
    version of format 1 left them, and no format recorded."""
    await check_layout(redis)
    k = Keys(CONV)
    for n, text in enumerate(["hello", "are you there?"], start=1):
        await store.ingest(InboundMessage("test", "5", "u1", f"m{n}", text))
    grant = await acquire_when_ready(store, CONV, "old/1")
    assert (await store.presend(grant.lease, 2, "You said: hello / are you there?")).status == "ok"
    await store.commit(grant.lease)
    await store.ingest(InboundMessage("test", "5", "u1", "m3", "/deny 42"))
    grant = await acquire_when_ready(store, CONV, "old/2")
    changes = encoded([admin.Change("42", "access", "deny", "7")])
    verdict = await store.presend(grant.lease, 3, "User 42 is denied.", changes=changes)
    assert verdict.status == "ok", verdict
    await redis.delete(k.lease)  # the replica crashed between its pre-send and its commit
    kindless = [{n: v for n, v in c.items() if n != "kind"} for c in json.loads(changes)]
    await redis.hset(k.outbox, mapping={"unsaid": "0", "changes": json.dumps(kindless)})
    [reply] = [e for e in await redis.lrange(k.history, 0, -1) if b'"assistant"' in e]
    await redis.lset(k.history, 2, old_reply(2, json.loads(reply)["text"]))
    await redis.hdel(META_KEY, "format")


async def test_a_format_1_store_is_refused_then_upgraded_and_answered_as_it_meant(
    make_settings: SettingsFactory,
    redis: Redis,
    runtime_factory: RuntimeFactory,
    server: EmbeddedRedis,
    short_dir: Path,
) -> None:
    store = make_store(make_settings(), redis)
    await write_format_1(store, redis)
    env = clean_env(short_dir, LASTWORD_REDIS_URL=server.url)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return forked.run(*args, env=env, timeout=30)

    refused = run("run")
    assert refused.returncode == 2, refused
    assert "stored format 1" in refused.stderr and "lastword migrate-shards" in refused.stderr
    upgraded = run("migrate-shards")
    assert upgraded.returncode == 0, upgraded
    assert f"rewrote 1 histories and 1 outboxes in stored format {FORMAT}" in upgraded.stdout
    assert await redis.hget(META_KEY, "format") == str(FORMAT).encode()
    again = run("migrate-shards")
    assert again.returncode == 0 and "rewrote" not in again.stdout, again

    # The exchange answered before: the same messages, the reply all the model's words.
    [exchange] = exchanges(await store.history(CONV))
    assert [m.text for m in exchange.asked] == ["hello", "are you there?"]
    assert exchange.reply is not None and exchange.reply.turn == 1
    assert exchange.reply.words == "You said: hello / are you there?"
    # The crashed replica's reply goes out as it was written, and its change is made.
    runtime, outbound = await runtime_factory()
    await settled(runtime, CONV, version=3)
    assert outbound.texts(CONV) == ["User 42 is denied."]
    record = await redis.hget(ACCESS_KEY, "42")
    assert record is not None and json.loads(record)["access"] == "deny", record
    last = (await store.history(CONV))[-1]
    assert (last.role, last.version, last.words) == ("assistant", 3, "User 42 is denied.")
