"""No input silences a user (issue 19), as a property: the real cycle, over the real store,
with the real `openai` client against the fake provider, is fed bursts of messages carrying
generated files (bytes behind valid PNG, JPEG, PDF and OGG magic numbers, real files cut
short or with a byte changed, declared as what they are or as something else, fetches that
fail) while the provider answers each attempt with a generated reply (content parts of any
shape, odd usage, junk lines, cut connections, HTML pages). Every burst must end with
exactly one delivered reply, within the attempt limit, and the next message must be answered.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis

from bot.core.runtime import Runtime
from bot.llm.openai import OpenAILLM
from bot.llm.transcribe import OpenAITranscriber
from bot.message import Attachment, FetchFailed, InboundMessage
from bot.service.app import make_store
from tests.support.builders import message
from tests.support.factories import SettingsFactory
from tests.support.fakes import files
from tests.support.fakes.openai_server import FakeOpenAI, RawReply
from tests.support.waits import settled

pytestmark = pytest.mark.timeout(120)

ANSWER = "Answer."
# Only ever in reasoning: a reply that shows it let the model's thinking through.
SECRET = "SECRET-THOUGHT"
ATTEMPTS = 3
RETRIES = 1
# Per burst, with room: the window, reading up to 6 files (2 s each at most), the LLM's
# deadline; should it take ATTEMPTS cycles after all, the store's backoff (1 s, 2 s) too.
SETTLE_S = 25.0
EXAMPLES = 40

# -- files ---------------------------------------------------------------------------------

MAGIC = {"png": files.PNG_SIGNATURE, "jpeg": b"\xff\xd8\xff", "pdf": b"%PDF-", "ogg": b"OggS"}
# Real files of each format, to be cut short or changed: random bytes alone rarely get past a
# decoder's first check.
SEEDS: dict[str, list[bytes]] = {
    "png": [files.photo(48, 32, fmt="PNG"), files.transparent_png(16), files.broken_png()],
    "jpeg": [files.photo(48, 32), files.rotated_photo(40, 20)],
    "pdf": [files.pdf("Statement", "page two"), files.encrypted_pdf()],
    "ogg": [files.voice(0.2)],
}
# How a platform declares a file of each format: (kind, mime, name).
LABELS: dict[str, list[tuple[str, str, str]]] = {
    "png": [("photo", "", ""), ("document", "image/png", "x.png")],
    "jpeg": [("photo", "", ""), ("document", "image/jpeg", "scan.jpg")],
    "pdf": [("document", "application/pdf", "statement.pdf")],
    "ogg": [("voice", "audio/ogg", ""), ("audio", "audio/ogg", "song.ogg")],
}
ALL_LABELS = [label for labels in LABELS.values() for label in labels]


def changed(seed: bytes, at: int, byte: int) -> bytes:
    at %= len(seed)
    return seed[:at] + bytes([byte]) + seed[at + 1 :]


def file_bytes(fmt: str) -> st.SearchStrategy[bytes]:
    seed = st.sampled_from(SEEDS[fmt])
    return st.one_of(
        st.binary(max_size=300).map(lambda tail: MAGIC[fmt] + tail),
        st.builds(lambda s, cut: s[: len(MAGIC[fmt]) + cut % len(s)], seed, st.integers(0)),
        st.builds(changed, seed, st.integers(0), st.integers(0, 255)),
        seed,
    )


@st.composite
def a_file(draw: st.DrawFn) -> tuple[tuple[str, str, str], bytes | Exception]:
    """How a file is declared, and what fetching it gives: its bytes, or what the platform
    raises."""
    fmt = draw(st.sampled_from(sorted(MAGIC)))
    label = draw(st.sampled_from(LABELS[fmt]) | st.sampled_from(ALL_LABELS))
    failure = st.sampled_from([FetchFailed, ConnectionResetError, RuntimeError])
    # A fresh exception for each file: one raised again and again would grow its traceback.
    fetched: bytes | Exception = draw(file_bytes(fmt) | failure.map(lambda kind: kind("gone")))
    return label, fetched


# -- provider replies ----------------------------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 10**6) | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
TEXT = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12)
PART = st.one_of(
    st.builds(lambda t: {"type": "text", "text": t}, TEXT),
    st.just({"type": "thinking", "thinking": [{"type": "text", "text": SECRET}]}),
    st.just({"type": "reference", "reference_ids": [1]}),
    JSON,
)
CONTENT = TEXT | st.lists(PART, max_size=3) | JSON
USAGE = JSON | st.fixed_dictionaries(
    {"prompt_tokens": JSON | st.integers(0, 100), "completion_tokens": JSON | st.integers(0, 100)}
)
EVENT = st.one_of(
    st.builds(lambda c: RawReply.chunk({"content": c}), CONTENT),
    st.just(RawReply.chunk({"reasoning_content": SECRET})),
    st.builds(lambda u: RawReply.chunk({}, choices=[], usage=u), USAGE),
    st.builds(lambda c: RawReply.chunk({}, choices=c), JSON),
    st.sampled_from(
        [b"data: ping\n\n", b"data:\n\n", b": keep-alive\n\n", b"<p>noise</p>\n\n", b"data: 7\n\n"]
    ),
    st.just(b'data: {"choices": [{"delta": {"content": "cut\n\n'),
)
STREAM = st.builds(
    lambda events, cut: RawReply.events(*events, cut_after=cut),
    st.lists(EVENT, min_size=1, max_size=6),
    st.none() | st.none() | st.integers(0, 600),
)
# Streams above all, as the bot asks for them; then what a stream request may get instead.
REPLY = st.one_of(
    STREAM,
    STREAM,
    STREAM,
    st.builds(lambda status: RawReply.html(status), st.sampled_from([200, 502])),
    st.builds(lambda c: RawReply.json(RawReply.completion({"content": c})), CONTENT),
    st.builds(RawReply.json, JSON),
)

# -- the burst -----------------------------------------------------------------------------

# Every message carries a file: the follow-up is the text-only message of each example.
MESSAGE = st.tuples(TEXT, st.lists(a_file(), min_size=1, max_size=2))
BURST = st.lists(MESSAGE, min_size=1, max_size=3)
SCRIPT = st.lists(REPLY, max_size=ATTEMPTS * (RETRIES + 1))


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as server:
        server.reply = lambda request: ANSWER
        yield server


class World:
    """One runtime for every example, each example a conversation of its own."""

    def __init__(self, runtime: Runtime, shelf: files.Shelf, fake: FakeOpenAI) -> None:
        self.runtime = runtime
        self.shelf = shelf
        self.fake = fake
        self.chats = itertools.count(1)

    def burst(self, chat: int, burst: list[tuple[str, list[Any]]]) -> list[InboundMessage]:
        """The burst's messages, their files shelved under refs of this conversation."""
        messages = []
        for n, (text, attached) in enumerate(burst, 1):
            attachments = []
            for i, ((kind, mime, name), fetched) in enumerate(attached):
                ref = f"c{chat}-m{n}-f{i}"
                self.shelf.shelved[ref] = fetched
                attachments.append(Attachment(kind, ref, mime, 0, name, file_key=ref))
            messages.append(
                message(text, conversation=f"test:{chat}", n=n, attachments=tuple(attachments))
            )
        return messages


@pytest.fixture
async def world(
    fake: FakeOpenAI, redis: Redis, make_settings: SettingsFactory
) -> AsyncIterator[World]:
    """A started runtime, built as `runtime_factory` builds one but with a transcriber (the
    factory has none): voice notes go to the fake's transcription endpoint."""
    config = make_settings(
        debounce={"quiet_ms": 100, "max_wait_ms": 400},
        llm={
            "provider": "openai",
            "base_url": fake.base_url,
            "api_key": "sk-property",
            "model": "test-model",
            "timeout_s": 2.0,
            "retries": RETRIES,
            "retry_base_s": 0.01,
            "deadline_s": 4.0,
            "attempts": ATTEMPTS,
        },
        media={
            "vision": "on",
            "work_timeout_s": 2.0,
            "fetch_timeout_s": 2.0,
            "transcription_timeout_s": 2.0,
        },
    )
    shelf = files.Shelf()
    llm = OpenAILLM(config.llm)
    transcriber = OpenAITranscriber(config.media, config.llm)
    runtime = Runtime(config, make_store(config, redis), llm, shelf, transcriber)
    runtime.start()
    try:
        yield World(runtime, shelf, fake)
    finally:
        await runtime.stop()
        await llm.client.close()
        await transcriber.client.close()


def replies(world: World, conversation: str) -> dict[int, list[str]]:
    """The replies delivered to `conversation`: each one's parts, by the version it covers."""
    delivered: dict[int, list[str]] = {}
    for sent in world.shelf.sent:
        if sent.conversation != conversation or ":notice:" in sent.idempotency_key:
            continue
        _, version, _, _, _ = sent.idempotency_key.rsplit(":", 4)
        delivered.setdefault(int(version), []).append(sent.text)
    return delivered


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    # A failing example is reported as it was generated: shrinking would replay the real
    # cycle, seconds an example, for minutes.
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(burst=BURST, script=SCRIPT)
async def test_every_burst_ends_with_exactly_one_reply(
    world: World, burst: list[tuple[str, list[Any]]], script: list[RawReply]
) -> None:
    chat = next(world.chats)
    conversation = f"test:{chat}"
    runtime, fake = world.runtime, world.fake
    fake.raw_replies[:] = script
    failed, given_up, asked = runtime.stats.failed, runtime.stats.given_up, len(fake.requests)
    for inbound in world.burst(chat, burst):
        assert await runtime.ingest(inbound)
    await settled(runtime, conversation, version=len(burst), within_s=SETTLE_S)

    delivered = replies(world, conversation)
    assert list(delivered) == [len(burst)], delivered
    [parts] = delivered.values()
    assert "".join(parts).strip() and SECRET not in "".join(parts)
    # Well within the attempt limit: no cycle failed (so none gave up), and the one cycle
    # asked the provider at most RETRIES + 1 times. A file that cannot be read is a note to
    # the model, a reply that cannot be read an LLMError (an apology at once): only a bug
    # gets as far as the cycle's net of ATTEMPTS tries.
    assert (runtime.stats.failed - failed, runtime.stats.given_up - given_up) == (0, 0)
    assert len(fake.requests) - asked <= RETRIES + 1

    # The conversation moved on: the next message is answered as if nothing had happened.
    fake.raw_replies.clear()
    follow_up = len(burst) + 1
    assert await runtime.ingest(message("and now?", conversation=conversation, n=follow_up))
    await settled(runtime, conversation, version=follow_up, within_s=SETTLE_S)
    assert replies(world, conversation)[follow_up] == [ANSWER]
    assert runtime.accepting
