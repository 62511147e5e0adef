"""Generation end to end in one process: the real runtime, store and `openai` client against
the loopback fake provider. Interrupting a stale generation, the token budget of the prompt,
retries with Retry-After, the context-length shrink, the deadline, reasoning that must never
reach the user, and the usage counted in Redis."""

from __future__ import annotations

import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from redis.asyncio import Redis

from bot.core.cycle import APOLOGY
from bot.core.runtime import Runtime
from bot.store import Keys
from tests.support.builders import message
from tests.support.factories import RuntimeFactory
from tests.support.fakes.openai_server import FakeOpenAI, RecordedRequest
from tests.support.fakes.outbound import RecordingOutbound
from tests.support.waits import settled

pytestmark = pytest.mark.timeout(60)

CONV = "test:1"


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as server:
        server.reply = lambda request: "Answer to: " + request.last_user_text
        yield server


class Bot:
    """A started runtime over the real store, talking to the fake provider."""

    def __init__(self, runtime: Runtime, outbound: RecordingOutbound) -> None:
        self.runtime = runtime
        self.outbound = outbound

    async def say(self, n: int, text: str | None = None) -> None:
        assert await self.runtime.ingest(message(text, n=n))

    async def settled(self) -> None:
        await settled(self.runtime, CONV, within_s=15)


Start = Callable[..., Awaitable[Bot]]


@pytest.fixture
def start(fake: FakeOpenAI, runtime_factory: RuntimeFactory) -> Start:
    """Starts a runtime talking to the fake provider; keyword arguments set `llm` settings.
    `remember=False` turns memory off, for a test of the exact prompt or budget."""

    async def build(starvation_limit: int = 3, remember: bool = True, **llm: Any) -> Bot:
        config: dict[str, Any] = {
            "provider": "openai",
            "base_url": fake.base_url,
            "api_key": "sk-test",
            "model": "test-model",
            "timeout_s": 10.0,
            "retries": 3,
            "retry_base_s": 0.01,
        }
        config.update(llm)
        return Bot(
            *await runtime_factory(
                llm=config, starvation_limit=starvation_limit, memory={"enabled": remember}
            )
        )

    return build


def first_streaming(request: RecordedRequest) -> bool:
    return request.stream and request.pieces_streamed > 0


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "plain"])
async def test_a_message_mid_generation_cancels_the_request_at_once(
    fake: FakeOpenAI, start: Start, stream: bool
) -> None:
    bot = await start(stream=stream)
    # A slow provider: the first answer would take 4 s (to stream, or to come at all).
    fake.delay_for = lambda request: 4.0 if len(fake.requests) == 1 else 0.2
    await bot.say(1, "first")
    # Streamed: once tokens flow; plain: once the provider has the request.
    first = await fake.wait_for_request(first_streaming if stream else lambda r: True, timeout=10)
    said_at = time.monotonic()
    await bot.say(2, "second")
    await fake.wait_for_request(lambda r: r is first and r.cancelled, timeout=5)
    cancelled_after = time.monotonic() - said_at
    assert cancelled_after < 0.3, f"cancelled {cancelled_after:.3f}s after the new message"
    await bot.settled()

    # One reply, covering both; the cancelled generation never reached the user.
    assert bot.outbound.texts() == [f"Answer to: {fake.requests[-1].last_user_text}"]
    assert "first" in bot.outbound.texts()[0] and "second" in bot.outbound.texts()[0]
    assert len(fake.requests) == 2 and not first.finished
    stats = bot.runtime.stats
    assert stats.interrupted == 1 and stats.discarded == 0
    # The tokens it had streamed by then are counted as spent on nothing (a plain request
    # that was cut off reports none).
    if stream:
        assert 0 < stats.interrupted_tokens <= first.pieces_streamed + 1
    else:
        assert stats.interrupted_tokens == 0 == first.pieces_streamed


async def test_an_interrupt_estimates_what_it_saved_from_the_finished_generations(
    fake: FakeOpenAI, start: Start
) -> None:
    bot = await start()
    fake.reply = lambda request: "word " * 200
    await bot.say(1)
    await bot.settled()
    stats = bot.runtime.stats
    assert (stats.finished, stats.saved_tokens) == (1, 0)
    finished_tokens = stats.finished_tokens
    assert finished_tokens == len("word " * 200) // 4 + 1  # the usage the fake reports

    fake.delay_for = lambda request: 4.0 if len(fake.requests) == 2 else 0.1
    await bot.say(2)
    second = await fake.wait_for_request(
        lambda r: fake.requests.index(r) == 1 and first_streaming(r)
    )
    await bot.say(3)
    await bot.settled()
    assert second.cancelled and stats.interrupted == 1
    # The one finished generation is the yardstick: what it took, less what was streamed.
    assert stats.saved_tokens == finished_tokens - stats.interrupted_tokens > 0


async def test_with_interrupt_off_the_request_finishes_and_its_reply_is_discarded(
    fake: FakeOpenAI, start: Start
) -> None:
    bot = await start(interrupt=False)
    fake.delay_for = lambda request: 1.5 if len(fake.requests) == 1 else 0.1
    await bot.say(1, "first")
    first = await fake.wait_for_request(first_streaming, timeout=10)
    await bot.say(2, "second")
    await bot.settled()
    assert first.finished and not first.cancelled
    assert len(bot.outbound.texts()) == 1
    assert "first" in bot.outbound.texts()[0] and "second" in bot.outbound.texts()[0]
    stats = bot.runtime.stats
    assert stats.interrupted == 0 and stats.discarded == 1
    assert stats.discarded_tokens > 0


async def test_at_the_starvation_limit_a_generation_is_not_interrupted_and_goes_out(
    fake: FakeOpenAI, start: Start
) -> None:
    # A user who always writes again while the model is answering: two interrupts, then the
    # guard lets the third generation finish and go out as it is.
    bot = await start(starvation_limit=2)
    fake.delay_for = lambda request: 1.0 if len(fake.requests) <= 3 else 0.1
    await bot.say(1)
    for n in (1, 2, 3):

        def nth_streaming(r: RecordedRequest, n: int = n) -> bool:
            return fake.requests.index(r) == n - 1 and first_streaming(r)

        request = await fake.wait_for_request(nth_streaming, timeout=10)
        await bot.say(n + 1)
    await fake.wait_for_request(lambda r: r is request and (r.finished or r.cancelled), timeout=5)
    await bot.settled()

    first, second, third, fourth = fake.requests
    assert first.cancelled and second.cancelled
    assert third.finished and not third.cancelled
    stats = bot.runtime.stats
    assert (stats.interrupted, stats.forced, stats.discarded) == (2, 1, 0)
    # The forced reply covers messages 1-3; the fourth gets a reply of its own.
    assert bot.outbound.texts() == [
        f"Answer to: {third.last_user_text}",
        f"Answer to: {fourth.last_user_text}",
    ]
    assert all(f"text {n}" in third.last_user_text for n in (1, 2, 3))
    assert "text 4" in fourth.last_user_text and "text 3" not in fourth.last_user_text


async def test_history_is_trimmed_to_the_budget_and_unanswered_messages_stay_whole(
    fake: FakeOpenAI, start: Start
) -> None:
    # A budget that holds a few short turns but not the long one from the start.
    bot = await start(context_tokens=600, max_tokens=100, stream=False, remember=False)
    await bot.say(1, "old " * 300)
    await bot.settled()
    for n in range(2, 6):
        await bot.say(n, f"turn {n}")
        await bot.settled()
    long_tail = "x" * 900  # ~225 tokens: it must come through whole
    await bot.say(10, "newest")
    await bot.say(11, long_tail)
    await bot.settled()
    request = fake.requests[-1]
    contents = [m["content"] for m in request.messages]
    # The long old turn is gone, the recent ones kept in order, the burst folded whole.
    assert not any("old old" in c for c in contents)
    kept = [c for c in contents if c.startswith("turn ")]
    assert kept and kept == sorted(kept) and kept[-1] == "turn 5"
    assert "newest" in contents[-1] and long_tail in contents[-1]
    assert request.body["max_tokens"] == 100


async def test_a_burst_too_big_for_the_budget_keeps_its_newest_messages(
    fake: FakeOpenAI, start: Start
) -> None:
    bot = await start(context_tokens=600, max_tokens=100, stream=False, remember=False)
    for n in range(1, 5):
        await bot.say(n, f"part{n} " + "y" * 700)
    await bot.settled()
    folded = fake.requests[-1].messages[-1]["content"]
    assert "part4" in folded and "part3" in folded and "part1" not in folded
    assert "2 earlier messages were left out" in folded


@pytest.mark.parametrize("error", ["429", "500"])
async def test_rate_limits_and_server_errors_are_retried_then_succeed(
    fake: FakeOpenAI, start: Start, error: str
) -> None:
    bot = await start()
    failure = FakeOpenAI.rate_limited(0.4) if error == "429" else FakeOpenAI.server_error()
    fake.fail_next(failure, failure)
    await bot.say(1, "hello")
    await bot.settled()
    assert bot.outbound.texts() == ["Answer to: hello"]
    assert len(fake.requests) == 3
    if error == "429":
        # Retry-After was honoured, above the tiny configured backoff.
        gaps = [b.started_at - a.started_at for a, b in itertools.pairwise(fake.requests)]
        assert all(gap >= 0.4 for gap in gaps), gaps


async def test_a_context_length_error_shrinks_the_history_and_succeeds(
    fake: FakeOpenAI, start: Start
) -> None:
    bot = await start(stream=False)
    for n in range(1, 5):
        await bot.say(n, f"turn {n}")
        await bot.settled()
    fake.fail_next(FakeOpenAI.context_length())
    await bot.say(9, "and now?")
    await bot.settled()
    refused, retried = fake.requests[-2:]
    assert len(retried.messages) < len(refused.messages)
    assert retried.messages[-1] == refused.messages[-1]
    assert bot.outbound.texts()[-1] == "Answer to: and now?"
    assert bot.runtime.stats.apologies == 0


async def test_a_401_fails_fast_with_one_apology(fake: FakeOpenAI, start: Start) -> None:
    bot = await start()
    fake.fail_next(FakeOpenAI.unauthorized())
    for n in (1, 2, 3):
        await bot.say(n)
    await bot.settled()
    assert bot.outbound.texts() == [APOLOGY]
    assert len(fake.requests) == 1


async def test_the_deadline_bounds_every_retry(fake: FakeOpenAI, start: Start) -> None:
    bot = await start(deadline_s=1.0, retries=50, retry_base_s=0.1)
    fake.delay_s = 0.3
    fake.fail_next(*(FakeOpenAI.server_error() for _ in range(50)))
    began = time.monotonic()
    await bot.say(1)
    await bot.settled()
    assert bot.outbound.texts() == [APOLOGY]
    # The window (150 ms) plus the deadline, and not much more.
    assert time.monotonic() - began < 2.0
    assert len(fake.requests) < 10


async def test_reasoning_never_reaches_the_user_or_the_history(
    fake: FakeOpenAI, start: Start, redis: Redis
) -> None:
    bot = await start()
    fake.reply = lambda request: "<think>the secret plan</think>\n\nThe answer."
    fake.reasoning = lambda request: "more secret musing"
    await bot.say(1, "why?")
    await bot.settled()
    assert bot.outbound.texts() == ["The answer."]
    history = " ".join(entry.text for entry in await bot.runtime.store.history(CONV))
    assert "The answer." in history
    assert "secret" not in history


async def test_settings_reach_the_provider_and_usage_is_counted(
    fake: FakeOpenAI, start: Start, redis: Redis
) -> None:
    bot = await start(
        system_prompt="Today is {date}; now {time}; braces {kept}.",
        temperature=0.3,
        max_tokens=200,
        extra_headers={"X-Title": "lastword-tests"},
        extra_body={"top_k": 40},
        remember=False,
    )
    await bot.say(1, "hello")
    await bot.settled()
    [request] = fake.requests
    today = datetime.now(UTC).strftime("%Y-%m-%d")
    system = request.messages[0]["content"]
    assert system.startswith(f"Today is {today}; now ") and system.endswith("braces {kept}.")
    assert request.body["temperature"] == 0.3
    assert request.body["max_tokens"] == 200
    assert request.body["top_k"] == 40
    assert request.body["stream"] is True
    assert request.headers["x-title"] == "lastword-tests"

    usage = await redis.hgetall(Keys(CONV).usage)
    assert int(usage[b"prompt"]) > 0 and int(usage[b"completion"]) > 0
    assert usage[b"user"] == b"u1"
    stats = bot.runtime.stats
    assert (stats.prompt_tokens, stats.completion_tokens) == (
        int(usage[b"prompt"]),
        int(usage[b"completion"]),
    )
