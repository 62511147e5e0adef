"""What media adds to a burst: the time to read one photo, one 10-second voice note, one PDF,
split into download, transcription and encoding.

    python -m benchmarks.media [--repeat 20] [--photo-px 3000x2000]

Everything real but the remote services: the Telegram adapter fetches through
python-telegram-bot (getFile, then the download) from the loopback fake Bot API; the voice note
goes through the official OpenAI client to the fake provider's /audio/transcriptions; the
transcript cache and the store are a real server; images are decoded, turned, scaled and
re-encoded by Pillow as in production. The fakes answer at once, so the figures are
lastword's own cost: a real platform and a real transcription service add their network and
model time on top. Each case is one burst of one message; medians over `--repeat` bursts.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import SecretStr

from adapters.telegram import TelegramAdapter, TelegramSettings
from benchmarks.command_line import timed_run
from benchmarks.wakeup import print_table, temporary_server
from bot.config.settings import InstalledSettings, LLMSettings, MediaSettings
from bot.llm.media import Media, Timings
from bot.llm.transcribe import OpenAITranscriber
from bot.message import Attachment, InboundMessage
from bot.service.app import make_store
from bot.store.connect import make_client
from tests.support.fakes import files
from tests.support.fakes.openai_server import FakeOpenAI
from tests.support.fakes.telegram_server import FakeTelegram


@dataclass
class Case:
    name: str
    kind: str
    data: bytes
    mime: str
    name_of_file: str


@dataclass
class Measured:
    timings: list[Timings]
    total_s: list[float]

    def median_ms(self, value: str) -> str:
        if value == "total":
            return f"{statistics.median(self.total_s) * 1000:.1f}"
        return f"{statistics.median(getattr(t, value) for t in self.timings) * 1000:.1f}"


async def measure(args: argparse.Namespace) -> list[tuple[Case, Measured]]:
    width, height = (int(n) for n in args.photo_px.split("x"))
    cases = [
        Case(f"photo {width}x{height} JPEG", "photo", files.photo(width, height), "", ""),
        Case("voice note, 10 s", "voice", files.voice(10), "audio/ogg", "voice.ogg"),
        Case("PDF, 2 pages", "document", files.pdf("Results", "More"), "application/pdf", "r.pdf"),
    ]
    results: list[tuple[Case, Measured]] = []
    async with temporary_server() as server, FakeTelegram() as telegram, FakeOpenAI() as provider:
        llm = LLMSettings(
            provider="openai", base_url=provider.base_url, api_key=SecretStr("sk-bench")
        )
        settings = InstalledSettings(platform="console", redis_url=server.url, llm=llm)
        redis = make_client(server.url)
        store = make_store(settings, redis)
        adapter = TelegramAdapter(
            TelegramSettings(token=SecretStr(telegram.token), api_url=telegram.api_url)
        )
        transcriber = OpenAITranscriber(MediaSettings(), llm)
        media = Media(MediaSettings(), "gpt-4o", adapter, store, transcriber)
        async with adapter.bot:
            for case in cases:
                measured = Measured([], [])
                for i in range(args.repeat):
                    # A new file each time: nothing is cached between bursts.
                    file_id = telegram.add_file(case.data)
                    attachment = Attachment(
                        case.kind,
                        file_id,
                        mime=case.mime,
                        size=len(case.data),
                        name=case.name_of_file,
                        file_key=f"bench-{case.kind}-{i}",
                    )
                    message = InboundMessage(
                        "telegram", "1", "1", f"m{i}", "", attachments=(attachment,)
                    )
                    began = time.perf_counter()
                    prepared = await media.prepare("telegram:1", [message])
                    measured.total_s.append(time.perf_counter() - began)
                    measured.timings.append(prepared.timings)
                    assert not prepared.unseen, f"{case.name} was not read"
                results.append((case, measured))
        await redis.aclose()
    return results


def report(results: list[tuple[Case, Measured]], args: argparse.Namespace) -> None:
    print(
        f"one burst of one message each; medians of {args.repeat}; fakes answer at once, "
        "so this is lastword's own cost\n"
    )
    headers = ["case", "bytes", "download ms", "transcription ms", "encoding ms", "added ms"]
    rows = [
        [
            case.name,
            f"{len(case.data):,}",
            m.median_ms("download_s"),
            m.median_ms("transcription_s"),
            m.median_ms("encoding_s"),
            m.median_ms("total"),
        ]
        for case, m in results
    ]
    print_table(headers, rows)
    print(
        "\nadded: the whole of Media.prepare for the burst (download + transcription + "
        "encoding + the transcript cache's round trips)"
    )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--photo-px", default="3000x2000", help="the photo's size, WxH")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    with timed_run():
        args = parse_args(argv)
        report(asyncio.run(measure(args)), args)


if __name__ == "__main__":
    main()
