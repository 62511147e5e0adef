"""One interrupted burst across two replicas, traced into a real trace store nobody here wrote:
Arize Phoenix, read back through Phoenix's own client.

    python -m benchmarks.traces --phoenix /path/to/phoenix-venv/bin/phoenix [--screenshot out.png]

Phoenix is about 140 packages, so it is not among lastword's: install it in a venv of its own
(`python3 -m venv /tmp/phoenix && /tmp/phoenix/bin/pip install arize-phoenix`) and name its
`phoenix` command. The script starts `phoenix serve` on a free port, two `lastword run` replicas
(Telegram, webhook mode, against the loopback fakes of the Bot API and of the provider) traced
to it, and sends one person's burst: the first message to one replica, the second to the other
while the model is still answering the first, so the generation is interrupted and the reply
covers both. Once the replicas have stopped (their last spans flushed), it reads the trace
back with `phoenix.client` (run by Phoenix's own interpreter) and prints its spans, by replica.
With `--screenshot`, a headless Chromium (if installed) photographs the trace in Phoenix's UI.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks.command_line import timed_run
from benchmarks.wakeup import print_table, temporary_server
from tests.support.fakes.loopback import free_port
from tests.support.fakes.openai_server import FAKE_MODEL_ID, FakeOpenAI, RecordedRequest
from tests.support.fakes.telegram_server import FakeTelegram
from tests.support.telegram_runs import webhook_bot

NOT_INSTALLED = (
    "phoenix is not installed: python3 -m venv /tmp/phoenix && /tmp/phoenix/bin/pip install "
    "arize-phoenix, then --phoenix /tmp/phoenix/bin/phoenix"
)
CHAT = 4242
# The first generation takes this long: long enough for the second message to cut it.
FIRST_ANSWER_S = 3.0
# What the script asks Phoenix's client for, printed as JSON lines.
READ_BACK = """
import json, sys
from phoenix.client import Client

def flat(prefix, value, out):
    if isinstance(value, dict):
        for key, inner in value.items():
            flat(prefix + "." + key, inner, out)
    elif not (isinstance(value, float) and value != value):
        out[prefix] = value

client = Client(base_url=sys.argv[1])
frame = client.spans.get_spans_dataframe(project_identifier="default")
for _, row in frame.iterrows():
    attributes = {}
    for column, value in row.items():
        if column.startswith("attributes."):
            flat(column[len("attributes."):], value, attributes)
    parent = row["parent_id"] if isinstance(row["parent_id"], str) else ""
    print(json.dumps({
        "name": row["name"], "trace": row["context.trace_id"], "span": row["context.span_id"],
        "parent": parent, "start": str(row["start_time"]), "attributes": attributes,
    }, default=str))
"""


@contextlib.asynccontextmanager
async def phoenix(command: str, folder: Path) -> AsyncIterator[str]:
    """`phoenix serve` on a free port, its data in `folder`; its base URL once it answers."""
    port = free_port()
    env = os.environ | {
        "PHOENIX_PORT": str(port),
        "PHOENIX_HOST": "127.0.0.1",
        "PHOENIX_WORKING_DIR": str(folder),
        "PHOENIX_GRPC_PORT": str(free_port()),
    }
    log = (folder / "phoenix.log").open("w")
    process = await asyncio.create_subprocess_exec(
        command, "serve", env=env, stdout=log, stderr=subprocess.STDOUT
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        async with aiohttp.ClientSession() as session:
            while True:
                with contextlib.suppress(aiohttp.ClientError):
                    async with session.get(url + "/healthz") as answer:
                        if answer.status == 200:
                            break
                if process.returncode is not None or time.monotonic() > deadline:
                    raise SystemExit(f"phoenix did not start; see {folder / 'phoenix.log'}")
                await asyncio.sleep(0.5)
        yield url
    finally:
        process.terminate()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(process.wait(), 20)
        if process.returncode is None:
            process.kill()
        log.close()


def slow_first(request: RecordedRequest) -> float:
    """The first request (the one the second message cuts) is slow; the rest are quick."""
    return FIRST_ANSWER_S if "second" not in json.dumps(request.messages) else 0.3


def traced(endpoint: str, replica: str) -> dict[str, str]:
    return {
        "LASTWORD_REPLICA_ID": replica,
        "LASTWORD_TRACES__ENABLED": "true",
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "200",
        "LASTWORD_TELEGRAM__DRAFTS": "false",
    }


async def burst(url: str, folder: Path) -> None:
    """Two replicas, one interrupted burst, traced to Phoenix at `url`; stopped at the end."""
    async with (
        temporary_server() as server,
        FakeOpenAI() as model,
        FakeTelegram() as fake,
    ):
        model.delay_for = slow_first
        llm = {
            "LASTWORD_LLM__PROVIDER": "openai",
            "LASTWORD_LLM__BASE_URL": model.base_url,
            "LASTWORD_LLM__API_KEY": "sk-bench",
            "LASTWORD_LLM__MODEL": FAKE_MODEL_ID,
        }
        async with (
            webhook_bot(server, fake, folder / "a", **traced(url, "replica-a"), **llm) as a,
            webhook_bot(server, fake, folder / "b", **traced(url, "replica-b"), **llm) as b,
        ):
            assert await a.post(fake.private_text_update(CHAT, CHAT, "first, the weather?")) == 200
            await model.wait_for_request(lambda r: True, timeout=30)
            await asyncio.sleep(0.5)
            assert (
                await b.post(fake.private_text_update(CHAT, CHAT, "second: and tomorrow?")) == 200
            )
            await fake.wait_for_calls("sendMessage", 1, timeout=30)


def read_back(python: str, url: str) -> list[dict[str, Any]]:
    """The spans Phoenix holds, through its own client."""
    done = subprocess.run(
        [python, "-c", READ_BACK, url], capture_output=True, text=True, timeout=120, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"phoenix's client failed:\n{done.stderr[-2000:]}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def screenshot(url: str, trace: str, path: Path) -> str:
    """The trace in Phoenix's UI, photographed by a headless Chromium; what happened."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        return "no screenshot: chromium is not installed"
    # The default project's id, as Phoenix's UI routes it (base64 of "Project:1").
    page = f"{url}/projects/UHJvamVjdDox/traces/{trace}"
    command = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
    command += ["--window-size=1600,900", "--virtual-time-budget=20000"]
    command += [f"--screenshot={path}", page]
    subprocess.run(command, capture_output=True, timeout=120, check=False)
    return f"screenshot of {page} (trace {trace}) in {path}" if path.exists() else "no screenshot"


async def run(args: argparse.Namespace, command: str) -> None:
    python = str(Path(command).with_name("python"))
    folder = Path(tempfile.mkdtemp(prefix="lw-traces-", dir="/tmp"))
    try:
        async with phoenix(command, folder) as url:
            began = time.monotonic()
            await burst(url, folder)
            # The replicas flushed their spans as they stopped; Phoenix writes them in batches.
            spans: list[dict[str, Any]] = []
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                spans = read_back(python, url)
                if any(span["name"] == "commit" for span in spans):
                    break
                await asyncio.sleep(1)
            print(f"phoenix at {url}; the burst took {time.monotonic() - began:.1f} s")
            print_table(["span", "replica", "trace", "parent", "what"], rows(spans))
            traces = {span["trace"] for span in spans}
            replicas = {span["attributes"].get("lastword.replica", "-") for span in spans}
            print(f"\n{len(spans)} spans in {len(traces)} trace(s), from {sorted(replicas)}")
            if args.screenshot and traces:
                print(screenshot(url, next(iter(traces)), Path(args.screenshot)))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def rows(spans: Sequence[dict[str, Any]]) -> list[list[str]]:
    keys = (
        "lastword.window",
        "lastword.ended",
        "lastword.fence",
        "lastword.verdict",
        "lastword.outcome",
        "gen_ai.usage.output_tokens",
    )
    out = []
    for span in sorted(spans, key=lambda s: s["start"]):
        attributes = span["attributes"]
        what = ", ".join(f"{k.split('.')[-1]}={attributes[k]}" for k in keys if k in attributes)
        parent = str(span["parent"] or "-")
        replica = str(attributes.get("lastword.replica", "-"))
        out.append([span["name"], replica, str(span["trace"])[:12], parent[:8], what])
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.traces", description=__doc__)
    parser.add_argument("--phoenix", help="the `phoenix` command of Phoenix's venv")
    parser.add_argument("--screenshot", help="write a PNG of the trace in Phoenix's UI here")
    args = parser.parse_args(argv)
    command = args.phoenix or shutil.which("phoenix")
    if command is None or not Path(command).is_file():
        raise SystemExit(NOT_INSTALLED)
    with timed_run():
        asyncio.run(run(args, command))


if __name__ == "__main__":
    main()
