"""Only the reader's own verdict on a file is remembered (issue 31): a file reader process that
dies or overruns for reasons of its own (the OOM killer, a host starved of CPU, here SIGKILL
and SIGSTOP from the test) costs the file one more try in a fresh worker, and if that fails
too, a note for this burst only: the next burst that carries the file reads it again. A worker
that died while idle is replaced without costing the job its try. In process against Workers
and Media with a real server; the mid-job kill end to end through `lastword run`.

The workers are found the way an operator would find them: in the process tree, as the
children running `python -m bot.llm.heavy`; one burning CPU is mid-job (a worker costs ~0.1 s of
CPU to start, then waits for work)."""

from __future__ import annotations

import asyncio
import os
import signal
from dataclasses import dataclass
from pathlib import Path

import pytest
from redis.asyncio import Redis

from bot.config.settings import MediaSettings
from bot.llm.heavy import Workers
from bot.llm.media import DOCUMENT_PREFIX, Media
from bot.message import Attachment, InboundMessage
from bot.store import Keys, Store
from tests.support.fakes import files
from tests.support.media_replies import request_about, wait_for_replies
from tests.support.waits import eventually, settled
from tests.support.world import World

pytestmark = pytest.mark.timeout(60)

CONV = "telegram:3131"
# CPU a worker has used once it is surely mid-job: starting one costs ~0.1 s.
BUSY_CPU_S = 0.5
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Reader:
    """A file reader process as the process table shows it."""

    pid: int
    cpu_s: float


def readers(parent: int | None = None) -> list[Reader]:
    """The live (not zombie) `python -m bot.llm.heavy` children of `parent` (of this process,
    unless given)."""
    parent = os.getpid() if parent is None else parent
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # it ended while being read
        # After the command name (in parentheses, which may hold spaces): state, ppid, ...
        fields = stat.rsplit(")", 1)[1].split()
        state, ppid, utime, stime = fields[0], int(fields[1]), int(fields[11]), int(fields[12])
        if ppid == parent and state != "Z" and b"bot.llm.heavy" in cmdline:
            found.append(Reader(int(entry.name), (utime + stime) / CLOCK_TICKS))
    return found


def reader_pids() -> set[int]:
    """This process's live readers (another test's may still be on their way out)."""
    return {r.pid for r in readers()}


def in_process_table(pid: int) -> bool:
    """Whether `pid` runs or waits to be reaped."""
    return Path(f"/proc/{pid}").exists()


async def kill_when_busy(parent: int, spared: set[int], within_s: float = 20) -> int:
    """SIGKILL the first of `parent`'s readers not in `spared` once it is mid-job; its pid."""

    async def busy() -> list[int]:
        return [r.pid for r in readers(parent) if r.pid not in spared and r.cpu_s > BUSY_CPU_S]

    [pid, *_] = await eventually(busy, within_s, what="a file reader mid-job")
    os.kill(pid, signal.SIGKILL)
    return pid


def media(store: Store, shelf: files.Shelf, **settings: object) -> Media:
    return Media(MediaSettings.model_validate(settings), "gpt-4o", shelf, store, None)


def document(ref: str, name: str) -> Attachment:
    return Attachment("document", ref, "application/pdf", 1000, name, f"uniq-{ref}")


def burst(*attachments: Attachment) -> list[InboundMessage]:
    return [InboundMessage("telegram", "3131", "3131", "m1", "", attachments=attachments)]


async def cached(redis: Redis, conversation: str, file_key: str) -> bool:
    return bool(await redis.exists(Keys(conversation).transcript(DOCUMENT_PREFIX + file_key)))


async def test_workers_killed_while_idle_are_replaced_and_the_next_job_is_read() -> None:
    others = reader_pids()
    workers = Workers(3, 10.0, 512)
    try:
        # Three jobs at once start three workers, idle afterwards.
        await asyncio.gather(*(workers.run("pdf", files.pdf(f"{n}"), enough=100) for n in "abc"))
        reaped, *unreaped = reader_pids() - others
        assert len(unreaped) == 2
        os.kill(reaped, signal.SIGKILL)

        async def gone() -> bool:
            return not in_process_table(reaped)

        await eventually(gone, what="the killed worker reaped")
        # Killed, then handed the job at once, before the loop has reaped them: the pipe is
        # broken or the output ends on the job's first frame. No dead worker costs the job its
        # try: all three are replaced on the way to a fresh one.
        for pid in unreaped:
            os.kill(pid, signal.SIGKILL)
        read = await workers.run("pdf", files.pdf("Good news"), enough=100)
    finally:
        await workers.close()
    assert read == {"text": "Good news"}
    assert (workers.died, workers.overran, workers.started) == (3, 0, 4)


async def test_a_job_that_overruns_once_is_read_by_a_fresh_worker() -> None:
    others = reader_pids()
    workers = Workers(1, 2.0, 512)
    try:
        await workers.run("pdf", files.pdf("warm-up"), enough=100)
        [idle] = reader_pids() - others
        # Stopped, as a host starved of CPU would leave it: the first try runs out of time.
        os.kill(idle, signal.SIGSTOP)
        read = await workers.run("pdf", files.pdf("Second try"), enough=100)
    finally:
        await workers.close()
    assert read == {"text": "Second try"}
    assert (workers.overran, workers.started) == (1, 2)
    assert idle not in reader_pids()


async def test_a_file_that_fails_twice_is_a_note_for_its_burst_and_read_again_next_time(
    store: Store, redis: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    shelf = files.Shelf(
        shelved={"slow": files.hostile_pdf(), "locked": files.encrypted_pdf("secret")}
    )
    m = media(store, shelf, work_timeout_s=1.0, workers=1)
    pair = burst(document("slow", "slow.pdf"), document("locked", "locked.pdf"))
    try:
        [said] = (await m.prepare(CONV, pair)).texts
        assert "(slow.pdf) that could not be read: it took too long to read (over 1 s)" in said
        assert "(locked.pdf) that could not be read: it is password-protected" in said
        assert m.workers.overran == 2
        assert caplog.text.count("took over 1 s on a pdf job") == 2
        # The reader's own verdict is remembered; a time limit it never came back from is not.
        assert await cached(redis, CONV, "uniq-locked")
        assert not await cached(redis, CONV, "uniq-slow")
        # The sender's bytes are a clean PDF now: the next burst fetches and reads them.
        shelf.shelved["slow"] = files.pdf("Quarterly revenue rose 12%")
        again = await m.prepare(CONV, pair)
    finally:
        await m.close()
    assert "Quarterly revenue rose 12%" in again.texts[0]
    assert "it is password-protected" in again.texts[0]
    assert again.timings.cached == 1
    assert shelf.fetches == ["slow", "locked", "slow"]


async def test_a_reader_killed_mid_job_through_lastword_run_leaves_the_file_unjudged(
    world: World,
) -> None:
    telegram, chat = world.telegram, 3232
    hostile = telegram.add_file(files.hostile_pdf(), file_unique_id="report-q3")
    async with world.bot(LASTWORD_MEDIA__WORK_TIMEOUT_S="30") as bot:
        await bot.post(
            telegram.document_update(
                chat, chat, "report.pdf", "here is the report", file_id=hostile
            )
        )
        replica = bot.running.process.pid
        # The first try's worker and the fresh one given the job next, each killed mid-job.
        first = await kill_when_busy(replica, set())
        await kill_when_busy(replica, {first})
        await wait_for_replies(world, chat, 1)
        await settled(world.redis, f"telegram:{chat}", within_s=10)
        assert not await cached(world.redis, f"telegram:{chat}", "report-q3")
        # The same file (its unique id) sent again, its bytes now a clean PDF.
        clean = telegram.add_file(
            files.pdf("Quarterly revenue rose 12%"), file_unique_id="report-q3"
        )
        await bot.post(
            telegram.document_update(chat, chat, "report.pdf", "sending it again", file_id=clean)
        )
        await wait_for_replies(world, chat, 2)
        await settled(world.redis, f"telegram:{chat}", within_s=10)
        assert bot.running.said("died during a pdf job") == 2
    failed = request_about(world, "here is the report").last_user_text
    assert "(report.pdf) that could not be read: the reader failed on it" in failed
    assert "Quarterly revenue rose 12%" in request_about(world, "sending it again").last_user_text
    assert [d.file_id for d in telegram.downloads if d.status == 200] == [hostile, clean]
