"""People in busy groups bursting at the bot while others chat: one reply per person's burst?

    python -m benchmarks.groups [--groups 4] [--people 3] [--chatters 2] [--rounds 2]
                                [--replicas 3] [--flood-s 25] [--ask-at-s 22]

`--replicas` `lastword run` replicas (the real Telegram adapter in webhook mode, the echo
model answering at once, a 1 s quiet window) on one embedded server, against the loopback
fake Bot API; every update goes to the next replica in turn, as a load balancer would. In
each of `--groups` groups, `--people` people each address the bot with a burst of three lines
(a mention, then two follow-ups without one, 100 ms apart) while `--chatters` others talk
among themselves, all at once, `--rounds` times. The same people then send the same bursts in
their DMs, for comparison. Then, against the fake enforcing Telegram's limits (20 messages a
minute in a group, one a second in a chat) with the bot keeping to them, a quiet window of
0.5 s, in one fleet: the same people burst once in their groups, first alone, then in as many
other groups `--ask-at-s` seconds into a flood, one more member of each group mentioning the
bot once a second for `--flood-s` seconds (within the per-person rate): served first come,
first served, the flood's replies would spend the group's minute and keep the others waiting
for it to pass. For each it prints:

- replies per addressed burst (1.00 is one each);
- stale replies: a reply that does not cover its person's last line;
- replies to the wrong message: not to the person's last line of the burst;
- replies to the chatter: any reply to a line not addressed to the bot (must be 0);
- last message → reply, p50 and p95 (s);

the flood's rows leave out the flooder's own bursts, and a line says whether every message of
the flood was covered by a reply in the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import random
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks import stampede
from benchmarks.command_line import timed_run
from benchmarks.wakeup import percentile, print_table, temporary_server
from bot.store.embedded import EmbeddedRedis
from tests.support.fakes.telegram_server import (
    FakeTelegram,
    RecordedCall,
    post_update,
    telegram_limits,
)

GAP_S = 0.1  # between the lines of a burst
FLOOD_GAP_S = 1.0  # between the flooder's mentions
# Replies still missing this long after the last one came are counted as not delivered.
QUIET_END_S = 15.0
SEED = 34


@dataclass
class Burst:
    """One person's burst: where, their last line's id and text, and when it was posted."""

    chat: int
    last_id: int = 0
    last_text: str = ""
    last_at: float = 0.0


@dataclass
class Workload:
    bursts: list[Burst] = field(default_factory=list)
    chatter: set[tuple[int, int]] = field(default_factory=set)  # (chat, message id)
    flood: dict[tuple[int, int], str] = field(default_factory=dict)  # (chat, id) -> its tag


def limited_env(
    server: EmbeddedRedis, fake: FakeTelegram, data_dir: Path, port: int
) -> dict[str, str]:
    """The replica in groups keeping to Telegram's own limits (its defaults), with a window
    short enough that a mention a second is a burst of its own."""
    return stampede.bot_env(server, fake, data_dir, port, "shared", 30) | {
        "LASTWORD_LLM__ECHO_WORD_MS": "0",
        "LASTWORD_GROUPS__ALLOWED": "*",
        "LASTWORD_TELEGRAM__DRAFTS": "false",
        "LASTWORD_DEBOUNCE__QUIET_MS": "500",
        "LASTWORD_DEBOUNCE__MAX_WAIT_MS": "2000",
    }


def bot_env(server: EmbeddedRedis, fake: FakeTelegram, data_dir: Path, port: int) -> dict[str, str]:
    """The stampede's replica (its webhook, the echo model, the quiet window), in groups."""
    return stampede.bot_env(server, fake, data_dir, port, "shared", 30) | {
        # Answered at once, so the figures are the bot's and not a model's pace (a DM's
        # live draft would otherwise stream the echo's words, 40 ms each).
        "LASTWORD_LLM__ECHO_WORD_MS": "0",
        "LASTWORD_GROUPS__ALLOWED": "*",
        # The lines of a burst are 100 ms apart: a window ten times that keeps them one burst
        # however slowly a loaded machine posts them.
        "LASTWORD_DEBOUNCE__QUIET_MS": "1000",
        "LASTWORD_DEBOUNCE__MAX_WAIT_MS": "4000",
        # The fake enforces no limits here: what is measured is who is answered, and when.
        "LASTWORD_TELEGRAM__CHAT_MESSAGES_PER_SECOND": "20",
        "LASTWORD_TELEGRAM__GROUP_MESSAGES_PER_MINUTE": "600",
    }


class Room:
    """Posts each update to the next replica."""

    def __init__(self, fake: FakeTelegram, urls: list[str]) -> None:
        self.fake = fake
        self.urls = itertools.cycle(urls)

    async def post(self, update: dict[str, object]) -> int:
        status = await post_update(next(self.urls), update, stampede.SECRET)
        assert status == 200, f"the webhook answered {status}"
        message = update["message"]
        assert isinstance(message, dict)
        return int(message["message_id"])


async def burst(room: Room, work: Workload, chat: int, user: int, round_: int) -> None:
    """Three lines from `user`: a mention, then two follow-ups without one."""
    lines = [f"@fake_bot question {round_} from {user}", f"detail {round_}.1", f"detail {round_}.2"]
    entry = Burst(chat)
    for n, line in enumerate(lines):
        if n:
            await asyncio.sleep(GAP_S)
        if chat < 0:
            update = room.fake.group_text_update(chat, user, line, first_name=f"P{user}")
        else:
            update = room.fake.private_text_update(chat, user, line)
        entry.last_at = time.monotonic()
        entry.last_id, entry.last_text = await room.post(update), line
    work.bursts.append(entry)


async def chat_away(room: Room, work: Workload, chat: int, user: int, lines: int) -> None:
    rng = random.Random(SEED + user)
    for n in range(lines):
        await asyncio.sleep(rng.uniform(0.05, 0.3))
        update = room.fake.group_text_update(chat, user, f"chatter {n} from {user}")
        work.chatter.add((chat, await room.post(update)))


async def flood(room: Room, work: Workload, chat: int, user: int, seconds: int) -> None:
    """A mention a second from `user`, for `seconds`."""
    began = time.monotonic()
    for n in range(seconds):
        await asyncio.sleep(max(0.0, began + n * FLOOD_GAP_S - time.monotonic()))
        tag = f"flood {n} from {user}"
        update = room.fake.group_text_update(chat, user, f"@fake_bot {tag}", first_name="Flo")
        work.flood[(chat, await room.post(update))] = tag


async def after(delay_s: float, task: Awaitable[None]) -> None:
    await asyncio.sleep(delay_s)
    await task


async def settle(fake: FakeTelegram, done: Callable[[], bool]) -> None:
    """Until `done()`, or no reply came for a while."""
    while not done():
        seen = len(fake.sent_messages)
        with contextlib.suppress(TimeoutError):
            await fake.wait_for_sent(seen + 1, timeout=QUIET_END_S)
        if len(fake.sent_messages) == seen:
            return


def answered(fake: FakeTelegram, work: Workload) -> bool:
    """Every burst's last line replied to, and every mention of a flood covered."""
    pointers = {(c.chat_id, c.reply_to_message_id) for c in fake.sent_messages}
    lasts = all((b.chat, b.last_id) in pointers for b in work.bursts)
    return lasts and flood_covered(fake, work) == len(work.flood)


def flood_covered(fake: FakeTelegram, work: Workload) -> int:
    """How many of the flood's mentions a reply covers."""
    said = [str(c.text) for c in fake.sent_messages]
    return sum(any(tag in text for text in said) for tag in work.flood.values())


def measured(work: Workload, sent: list[RecordedCall], place: str, group: bool) -> list[str]:
    """The row of one place: each burst's first reply after its last line, in its chat (in
    a group, the one replying to that line); replies pointing elsewhere are wrong, or to the
    chatter. Replies to a flood are left out."""
    sent = [c for c in sent if (c.chat_id, c.reply_to_message_id) not in work.flood]
    stale = 0
    waits: list[int] = []
    for entry in work.bursts:
        found = [
            c
            for c in sent
            if c.chat_id == entry.chat
            and c.at >= entry.last_at
            and (not group or c.reply_to_message_id == entry.last_id)
        ]
        if found:
            first = min(found, key=lambda c: c.at)
            stale += entry.last_text not in str(first.text)
            waits.append(int((first.at - entry.last_at) * 1000))
    lasts = {(b.chat, b.last_id) for b in work.bursts}
    pointers = [(c.chat_id, c.reply_to_message_id) for c in sent]
    to_chatter = sum(p in work.chatter for p in pointers)
    wrong = sum(p not in lasts and p not in work.chatter for p in pointers)
    waits.sort()
    return [
        place,
        str(len(work.bursts)),
        f"{len(sent) / max(len(work.bursts), 1):.2f}",
        str(stale),
        str(wrong) if group else "n/a",
        str(to_chatter),
        f"{percentile(waits, 50) / 1000:.2f}" if waits else "-",
        f"{percentile(waits, 95) / 1000:.2f}" if waits else "-",
    ]


async def run_place(args: argparse.Namespace, in_groups: bool) -> list[str]:
    async with (
        temporary_server() as server,
        FakeTelegram() as fake,
        stampede.replicas(
            args.replicas,
            server.data_dir.parent,
            lambda folder, port: bot_env(server, fake, folder, port),
        ) as urls,
    ):
        room, work = Room(fake, urls), Workload()
        people = [(g, p) for g in range(args.groups) for p in range(args.people)]
        for round_ in range(args.rounds):
            tasks = []
            for g, p in people:
                user = 1000 * (g + 1) + p
                chat = -(100 + g) if in_groups else user
                tasks.append(burst(room, work, chat, user, round_))
            if in_groups:
                for g in range(args.groups):
                    for c in range(args.chatters):
                        tasks.append(chat_away(room, work, -(100 + g), 900_000 + 100 * g + c, 4))
            await asyncio.gather(*tasks)
            await settle(fake, lambda: len(fake.sent_messages) >= len(work.bursts))
        place = "groups" if in_groups else "DMs"
        return measured(work, fake.sent_messages, place, in_groups)


async def run_limited(args: argparse.Namespace) -> tuple[list[list[str]], str]:
    """Under Telegram's limits, in one fleet: the people's bursts in their groups alone, then
    in other groups `--ask-at-s` into a flood of each: their rows, and what became of the
    flood."""
    async with (
        temporary_server() as server,
        FakeTelegram(limits=telegram_limits()) as fake,
        stampede.replicas(
            args.replicas,
            server.data_dir.parent,
            lambda folder, port: limited_env(server, fake, folder, port),
        ) as urls,
    ):
        room, alone, flooded = Room(fake, urls), Workload(), Workload()
        await into_groups(room, alone, args, 100, flood_s=0)
        await settle(fake, lambda: answered(fake, alone))
        await into_groups(room, flooded, args, 200, flood_s=args.flood_s)
        await settle(fake, lambda: answered(fake, flooded))
        rows = [
            measured(work, in_its_groups(fake, work), place, True)
            for work, place in (
                (alone, "groups, Telegram's limits"),
                (flooded, "groups, one flooding"),
            )
        ]
        replies = sum(
            (c.chat_id, c.reply_to_message_id) in flooded.flood for c in fake.sent_messages
        )
        return rows, (
            f"the flood: {len(flooded.flood)} mentions ({args.groups} groups, one a second for"
            f" {args.flood_s} s), {replies} replies,"
            f" {flood_covered(fake, flooded)}/{len(flooded.flood)} covered by one;"
            f" 429s: {len(fake.limits.violations) if fake.limits else 0}"
        )


async def into_groups(
    room: Room, work: Workload, args: argparse.Namespace, first_chat: int, flood_s: int
) -> None:
    """One burst from each person of each group while others chat; with `flood_s`, only
    `--ask-at-s` into a flood of each group by one more member."""
    delay = args.ask_at_s if flood_s else 0.0
    tasks = []
    for g in range(args.groups):
        chat = -(first_chat + g)
        if flood_s:
            tasks.append(flood(room, work, chat, 800_000 + g, flood_s))
        for p in range(args.people):
            tasks.append(after(delay, burst(room, work, chat, 1000 * (g + 1) + p, 0)))
        for c in range(args.chatters):
            tasks.append(after(delay, chat_away(room, work, chat, 900_000 + 100 * g + c, 4)))
    await asyncio.gather(*tasks)


def in_its_groups(fake: FakeTelegram, work: Workload) -> list[RecordedCall]:
    chats = {b.chat for b in work.bursts}
    return [c for c in fake.sent_messages if c.chat_id in chats]


async def run(args: argparse.Namespace) -> None:
    rows = [await run_place(args, in_groups=True), await run_place(args, in_groups=False)]
    limited, fate = await run_limited(args)
    rows += limited
    print(
        f"cpus: {os.cpu_count()}; {args.replicas} `lastword run` replicas (telegram webhook, echo"
        f" model, quiet 1 s); {args.groups} groups of {args.people} people bursting (3 lines,"
        f" {GAP_S * 1000:.0f} ms apart, only the first a mention) and {args.chatters} chatting;"
        f" {args.rounds} rounds; then the same bursts in DMs; then one burst each in the groups"
        f" under Telegram's limits (quiet 0.5 s), alone and {args.ask_at_s:.0f} s into a flood"
        f" (one more member of each group, a mention a second for {args.flood_s} s); one run"
    )
    headers = [
        "place",
        "bursts",
        "replies/burst",
        "stale",
        "wrong message",
        "to chatter",
        "p50 (s)",
        "p95 (s)",
    ]
    print_table(headers, rows)
    print(f"\n{fate}")
    medians = {r[0]: float(r[6]) for r in rows if r[6] != "-"}
    for over, under in (("groups", "DMs"), ("groups, one flooding", "groups, Telegram's limits")):
        if medians.get(under) and over in medians:
            ratio = medians[over] / medians[under]
            print(f"{over} / {under}, last message -> reply p50: {ratio:.2f}")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.groups",
        description=__doc__.split("\n\n")[0] if __doc__ else "",
    )
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--people", type=int, default=3, help="bursting at the bot, per group")
    parser.add_argument("--chatters", type=int, default=2, help="talking among themselves")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument(
        "--flood-s", type=int, default=25, help="the flood's length, a mention a second"
    )
    parser.add_argument(
        "--ask-at-s", type=float, default=22.0, help="when the others burst, into the flood"
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    with timed_run():
        asyncio.run(run(parse_args(argv)))


if __name__ == "__main__":
    main(sys.argv[1:])
