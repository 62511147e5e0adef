"""What poison media costs a replica (issue 19), before and after: the event loop's worst stall
while six hostile PDFs are read, the peak memory of decoding a PNG of a few hundred kB that
claims tens of millions of pixels, and the transcriptions paid for one voice note whose cycle
is interrupted five times. And what a provider that holds its stream open after `[DONE]` costs
a reply (issue 31).

    python -m benchmarks.poison [--before /tmp/before] [--window 70] [--rows media,held]

`--before` is another checkout of lastword (`git worktree add /tmp/before 8aad770`): each
measurement runs in a fresh process with that tree's `bot` on its path, then with this one's,
on the same files (made here, by tests/support/fakes/files.py). Media is driven in process as a
cycle drives it (`Media.prepare`, cancelled for an interrupt), with a real server for the caches and
the fake provider for transcriptions; the files come from a stand-in platform at once.

- stall: six `prepare`s of six users' hostile PDFs at once (a few kB each, one content stream
  of 3.5 MB of operators shared by 20 pages); a 10 ms timer measures how late the loop runs,
  and a `getaddrinfo` every 250 ms (the default executor, which DNS needs) how long a lookup
  waits. Measured for `--window` seconds at most.
- memory: the peak RSS growth of the process decoding the image (the image function alone,
  what runs in a worker process after, in the replica before), and its CPU time.
- transcriptions: five `prepare`s cancelled 0.3 s in, then one that finishes; the fake
  service takes 2 s per transcription.
- held: a `lastword run` of each tree (webhook mode, the real Telegram adapter and OpenAI
  client) against the fake Bot API and a fake provider that sends `[DONE]` and then keeps the
  stream open, with a keep-alive comment every second or silent. `HELD_USERS` users write at
  once; per reply, the time from the answer's last byte (`[DONE]`) to the reply's
  `sendMessage`, p50 and worst, and how many replies were the apology instead. The read
  timeout is `HELD_TIMEOUT_S` and the deadline `HELD_DEADLINE_S`, as an operator might set
  them; the defaults (60 s and 120 s) only make "before" longer.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.support.fakes.openai_server import AfterDone

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent
# What each measuring process is given at most.
CHILD_TIMEOUT_S = 180
HOSTILE = 6
HELD_USERS = 10
HELD_TIMEOUT_S = 10
HELD_DEADLINE_S = 20
HELD_SECRET = "poison-webhook-secret"


# -- the measuring processes (run with either tree's `bot` on the path) ------------------------


def stand_in(shelved: dict[str, bytes]) -> Any:
    """A platform that holds files: RecordingOutbound (both trees have it) that can fetch."""
    from tests.support.fakes.outbound import RecordingOutbound

    @dataclass
    class Shelf(RecordingOutbound):
        files: dict[str, bytes] = field(default_factory=dict)
        fetches: int = 0

        async def fetch(self, attachment: Any, max_bytes: int) -> bytes:
            self.fetches += 1
            return self.files[attachment.ref]

    return Shelf(files=shelved)


def burst(attachment: Any) -> list[Any]:
    from bot.message import InboundMessage

    return [InboundMessage("telegram", "1", "1", "m1", "", attachments=(attachment,))]


async def closed(media: Any) -> None:
    """Stop the media's worker processes, where it has any (after)."""
    close = getattr(media, "close", None)
    if close is not None:
        await close()


async def stall(folder: Path, window_s: float) -> None:
    from benchmarks.wakeup import temporary_server
    from bot.config.settings import InstalledSettings, MediaSettings
    from bot.llm.media import Media
    from bot.message import Attachment
    from bot.service.app import make_store
    from bot.store.connect import make_client

    pdfs = {f"r{i}": (folder / f"hostile-{i}.pdf").read_bytes() for i in range(HOSTILE)}
    loop = asyncio.get_running_loop()
    worst = {"stall": 0.0, "dns": 0.0}

    async def tick() -> None:
        while True:
            began = loop.time()
            await asyncio.sleep(0.01)
            worst["stall"] = max(worst["stall"], loop.time() - began - 0.01)

    async def lookup() -> None:
        while True:
            began = loop.time()
            await loop.getaddrinfo("localhost", 80)
            worst["dns"] = max(worst["dns"], loop.time() - began)
            await asyncio.sleep(0.25)

    async with temporary_server() as server:
        redis = make_client(server.url)
        store = make_store(InstalledSettings(platform="console", redis_url=server.url), redis)
        media = Media(MediaSettings(), "gpt-4o", stand_in(pdfs), store, None)
        watchers = [asyncio.create_task(tick()), asyncio.create_task(lookup())]
        began = time.monotonic()
        reading = [
            asyncio.create_task(
                media.prepare(
                    f"telegram:{i}",
                    burst(Attachment("document", ref, "application/pdf", 6000, f"{ref}.pdf", ref)),
                )
            )
            for i, ref in enumerate(pdfs)
        ]
        done, _ = await asyncio.wait(reading, timeout=window_s)
        result = {
            "stall_ms": worst["stall"] * 1000,
            "dns_ms": worst["dns"] * 1000,
            "finished": len(done),
            "seconds": time.monotonic() - began,
            "notes": sorted({t.result().texts[0].split(": ", 1)[-1] for t in done}),
        }
        for watcher in watchers:
            watcher.cancel()
        await closed(media)
        # No orderly stop: before, the parses still hold every thread of the default
        # executor, which the server's own stop would wait for. The server dies with us.
        shutil.rmtree(server.data_dir.parent, ignore_errors=True)
        _print_and_exit(result)


def image_function(data: bytes) -> Callable[[], object]:
    """The tree's image encoding, on `data`: bot.llm.media's own (before) or bot.llm.heavy's
    (after). Told apart by bot.llm.media, not by importing bot.llm.heavy: the editable install would
    find this tree's bot.llm.heavy for a tree that has none."""
    media = importlib.import_module("bot.llm.media")
    if hasattr(media, "encode_image"):
        return partial(media.encode_image, data, 1568, 85)
    heavy = importlib.import_module("bot.llm.heavy")
    return partial(heavy.encode_image, data, 1568, 85, 24_000_000)


def memory(path: Path) -> dict[str, Any]:
    import PIL.Image

    del PIL.Image  # the decoder's own import is not the image's cost
    data = path.read_bytes()
    run = image_function(data)
    base_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    cpu = time.process_time()
    try:
        run()
        outcome = "encoded"
    except Exception as exc:
        outcome = f"refused: {exc}"
    return {
        "peak_mb": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base_kb) / 1024,
        "cpu_s": time.process_time() - cpu,
        "outcome": outcome,
    }


async def transcriptions(folder: Path) -> dict[str, Any]:
    from pydantic import SecretStr

    from benchmarks.wakeup import temporary_server
    from bot.config.settings import InstalledSettings, LLMSettings, MediaSettings
    from bot.llm.media import Media
    from bot.llm.transcribe import OpenAITranscriber
    from bot.message import Attachment
    from bot.service.app import make_store
    from bot.store.connect import make_client
    from tests.support.fakes.openai_server import FakeOpenAI

    voice = (folder / "voice.ogg").read_bytes()
    note = Attachment("voice", "v", "audio/ogg", len(voice), "voice.ogg", "uniq-v")
    async with temporary_server() as server, FakeOpenAI() as provider:
        provider.transcription_delay_s = 2.0
        llm = LLMSettings(
            provider="openai", base_url=provider.base_url, api_key=SecretStr("sk-bench")
        )
        redis = make_client(server.url)
        store = make_store(
            InstalledSettings(platform="console", redis_url=server.url, llm=llm), redis
        )
        shelf = stand_in({"v": voice})
        media = Media(
            MediaSettings(), "gpt-4o", shelf, store, OpenAITranscriber(MediaSettings(), llm)
        )
        for _ in range(5):
            interrupted = asyncio.create_task(media.prepare("telegram:1", burst(note)))
            await asyncio.sleep(0.3)
            interrupted.cancel()
            await asyncio.gather(interrupted, return_exceptions=True)
        said = await media.prepare("telegram:1", burst(note))
        # Transcriptions that carried on after their cycle (before) are counted too.
        await asyncio.sleep(provider.transcription_delay_s + 0.5)
        await closed(media)
        await redis.aclose()
    return {
        "transcriptions": len(provider.transcriptions),
        "downloads": shelf.fetches,
        "heard": "transcribed" in said.texts[0],
    }


def child(what: str, folder: Path, window_s: float) -> None:
    """Measure `what` in this process and print it as one JSON line. Exits at once, so the
    threads a cancelled parse leaves behind (before) do not hold the process."""
    if what == "stall":
        asyncio.run(stall(folder, window_s))
    elif what == "transcriptions":
        asyncio.run(_and_exit(transcriptions(folder)))
    else:
        _print_and_exit(memory(folder / what))


async def _and_exit(measuring: Coroutine[Any, Any, dict[str, Any]]) -> None:
    _print_and_exit(await measuring)


def _print_and_exit(result: dict[str, Any]) -> None:
    print(json.dumps(result), flush=True)
    os._exit(0)


# -- the report, from this tree ------------------------------------------------------------------


@dataclass
class Images:
    name: str
    width: int
    height: int


IMAGES = [Images("huge.png", 7000, 7000), Images("big.png", 4800, 4800)]


def make_files(folder: Path) -> dict[str, int]:
    from tests.support.fakes import files

    made = {f"hostile-{i}.pdf": files.hostile_pdf(seed=i) for i in range(HOSTILE)}
    made |= {i.name: files.huge_png(i.width, i.height) for i in IMAGES}
    made["voice.ogg"] = files.voice(60)
    for name, data in made.items():
        (folder / name).write_bytes(data)
    return {name: len(data) for name, data in made.items()}


def measure(tree: Path, what: str, folder: Path, window_s: float) -> dict[str, Any]:
    env = os.environ | {"PYTHONPATH": str(tree)}
    command = [sys.executable, str(HERE), "--child", what, "--files", str(folder)]
    command += ["--window", str(window_s)]
    done = subprocess.run(
        command, env=env, cwd=tree, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise SystemExit(f"{what} in {tree} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def media_rows(
    trees: dict[str, Path], folder: Path, window_s: float
) -> tuple[list[list[str]], list[str]]:
    """The poison media rows, and what follows the table: what the PDFs became."""
    sizes = make_files(folder)
    measured: dict[str, dict[str, dict[str, Any]]] = {}
    for label, tree in trees.items():
        measured[label] = {
            what: measure(tree, what, folder, window_s)
            for what in ("stall", *(i.name for i in IMAGES), "transcriptions")
        }
    rows = [
        ["worst event-loop stall, 6 hostile PDFs (ms)"]
        + [f"{m['stall']['stall_ms']:.0f}" for m in measured.values()],
        ["worst getaddrinfo meanwhile (ms)"]
        + [f"{m['stall']['dns_ms']:.0f}" for m in measured.values()],
        [f"PDFs done within {window_s:g} s"]
        + [f"{m['stall']['finished']}/{HOSTILE}" for m in measured.values()],
    ]
    for image in IMAGES:
        what = f"{sizes[image.name] / 1000:.0f} kB PNG {image.width}x{image.height} EXIF 6"
        rows.append(
            [f"peak memory, {what} (MB)"]
            + [f"{m[image.name]['peak_mb']:.0f}" for m in measured.values()]
        )
        rows.append(
            ["  CPU (s) / outcome"]
            + [
                f"{m[image.name]['cpu_s']:.2f} / {m[image.name]['outcome'][:28]}"
                for m in measured.values()
            ]
        )
    rows.append(
        ["transcriptions, voice note interrupted 5x"]
        + [
            f"{t['transcriptions']} ({t['downloads']} downloads)"
            for t in (m["transcriptions"] for m in measured.values())
        ]
    )
    notes = [f"hostile PDF: {sizes['hostile-0.pdf']:,} bytes each"]
    notes += [
        f"{label}: what the six PDFs became: {m['stall']['notes']}" for label, m in measured.items()
    ]
    return rows, notes


async def held_stream(tree: Path, folder: Path, after: AfterDone) -> dict[str, Any]:
    """Replies of `tree`'s `lastword run` to a provider that holds its streams open after
    `[DONE]` as `after` says ("keep-alive" or "silent"); this tree's fakes and server."""
    from benchmarks.wakeup import temporary_server
    from tests.support.fakes.loopback import free_port
    from tests.support.fakes.openai_server import FakeOpenAI
    from tests.support.fakes.telegram_server import FakeTelegram, post_update
    from tests.support.running import Running, run_env

    async with temporary_server() as server, FakeTelegram() as telegram, FakeOpenAI() as provider:
        provider.after_done = after
        port = free_port()
        env = run_env("telegram", server.url, folder / f"held-{after}") | {
            "PYTHONPATH": str(tree),
            "LASTWORD_TELEGRAM__TOKEN": telegram.token,
            "LASTWORD_TELEGRAM__API_URL": telegram.api_url,
            "LASTWORD_TELEGRAM__MODE": "webhook",
            "LASTWORD_TELEGRAM__WEBHOOK_LISTEN": f"127.0.0.1:{port}",
            "LASTWORD_TELEGRAM__WEBHOOK_SECRET": HELD_SECRET,
            "LASTWORD_TELEGRAM__WEBHOOK_URL": "https://bot.example/telegram",
            "LASTWORD_LLM__PROVIDER": "openai",
            "LASTWORD_LLM__BASE_URL": provider.base_url,
            "LASTWORD_LLM__API_KEY": "sk-bench",
            "LASTWORD_LLM__TIMEOUT_S": str(HELD_TIMEOUT_S),
            "LASTWORD_LLM__DEADLINE_S": str(HELD_DEADLINE_S),
        }
        running = await Running.start(env, cwd=tree)
        try:
            await telegram.wait_for_calls("setWebhook", 1, timeout=30)
            url = f"http://127.0.0.1:{port}/telegram"
            for chat in range(1, HELD_USERS + 1):
                update = telegram.private_text_update(chat, chat, f"question {chat}")
                await post_update(url, update, HELD_SECRET)
            await telegram.wait_for_sent(HELD_USERS, timeout=HELD_DEADLINE_S + 30)
        finally:
            await running.terminate()
    waits: list[float] = []
    for sent in telegram.sent_messages:
        asked = [r for r in provider.requests if f"question {sent.chat_id}" in r.last_user_text]
        if asked and asked[0].ended_at is not None:
            waits.append(sent.at - asked[0].ended_at)
    waits.sort()
    answered = sum((m.text or "").startswith("You said") for m in telegram.sent_messages)
    return {
        "p50_ms": waits[len(waits) // 2] * 1000 if waits else None,
        "worst_ms": waits[-1] * 1000 if waits else None,
        "apologies": HELD_USERS - answered,
    }


def held_rows(trees: dict[str, Path], folder: Path) -> list[list[str]]:
    rows = []
    afters: tuple[AfterDone, ...] = ("keep-alive", "silent")
    for after in afters:
        measured = [asyncio.run(held_stream(tree, folder, after)) for tree in trees.values()]
        rows.append(
            [f"[DONE] then {after}: last byte -> reply sent, p50 / worst (ms)"]
            + [f"{m['p50_ms']:.0f} / {m['worst_ms']:.0f}" for m in measured]
        )
        rows.append(
            [f"  apologies instead of the answer, of {HELD_USERS}"]
            + [str(m["apologies"]) for m in measured]
        )
    return rows


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--before", type=Path, help="a checkout of the code to compare with")
    parser.add_argument("--window", type=float, default=70.0, help="seconds the PDFs get")
    parser.add_argument(
        "--rows", default="media,held", help="which rows to run: media, held (comma-separated)"
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--files", type=Path, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child:
        child(args.child, args.files, args.window)
        return
    from benchmarks.command_line import timed_run
    from benchmarks.wakeup import print_table

    with timed_run(), tempfile.TemporaryDirectory(prefix="lw-poison-") as folder:
        trees = ({"before": args.before} if args.before else {}) | {"after": ROOT}
        wanted = args.rows.split(",")
        rows: list[list[str]] = []
        notes: list[str] = []
        if "media" in wanted:
            rows, notes = media_rows(trees, Path(folder), args.window)
        if "held" in wanted:
            rows += held_rows(trees, Path(folder))
        print(f"the trees: {trees}\n")
        print_table(["measure", *trees], rows)
        for note in notes:
            print(f"\n{note}")


if __name__ == "__main__":
    main()
