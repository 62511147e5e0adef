"""Traces from real `lastword run` replicas (three, webhook mode) to a receiver that decodes
OTLP as a collector does: a burst is one trace whichever replicas touch it, a holder killed
mid-burst included, and a collector that is slow or down delays no reply."""

from __future__ import annotations

from pathlib import Path

import pytest
from redis.asyncio import Redis

from bot.store import Keys
from bot.store.embedded import EmbeddedRedis
from tests.support.fakes.loopback import free_port
from tests.support.fakes.openai_server import FAKE_MODEL_ID, FakeOpenAI
from tests.support.fakes.otlp_receiver import FakeOTLP, ReceivedSpan
from tests.support.fakes.telegram_server import FakeTelegram
from tests.support.waits import eventually
from tests.support.webhook_fleet import fleet, post, replies

pytestmark = pytest.mark.timeout(90)


def traced(model: FakeOpenAI, endpoint: str, n: int, timeout_s: int = 2) -> dict[str, str]:
    """Replica n's settings: traced to `endpoint`, in batches sent every 0.2 s, each export
    given `timeout_s`."""
    return {
        "LASTWORD_REPLICA_ID": f"replica-{n}",
        "LASTWORD_TRACES__ENABLED": "true",
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "200",
        "OTEL_EXPORTER_OTLP_TIMEOUT": str(timeout_s),
        "LASTWORD_LLM__PROVIDER": "openai",
        "LASTWORD_LLM__BASE_URL": model.base_url,
        "LASTWORD_LLM__API_KEY": "sk-secret-key",
        "LASTWORD_LLM__MODEL": FAKE_MODEL_ID,
        "LASTWORD_TELEGRAM__DRAFTS": "false",
    }


async def test_a_burst_is_one_trace_across_replicas_and_a_killed_holder(
    server: EmbeddedRedis, redis: Redis, short_dir: Path
) -> None:
    chat = 51_000
    conversation = f"telegram:{chat}"
    async with (
        FakeOTLP() as otlp,
        FakeOpenAI() as model,
        FakeTelegram() as fake,
        fleet(server, fake, short_dir, each=lambda n: traced(model, otlp.endpoint, n)) as replicas,
    ):
        model.hold()
        update = fake.private_text_update(chat, chat, "hello there")
        assert await post(replicas[0], update) == 200
        await model.wait_for_request(lambda r: True, timeout=20)

        async def ingested() -> list[ReceivedSpan]:
            return otlp.named("ingest")

        [ingest] = await eventually(ingested, within_s=10)
        # The replica holding the lease, killed while the model answers.
        token = await redis.hget(Keys(conversation).lease, "token")
        assert token is not None
        holder = (token.decode() if isinstance(token, bytes) else token).split("/")[0]
        [killed] = [r for n, r in enumerate(replicas) if f"replica-{n}" == holder]
        await killed.bot.kill()
        model.release()

        async def answered() -> bool:
            return chat in replies(fake)

        await eventually(answered, within_s=30)

        async def a_reply_span() -> list[ReceivedSpan]:
            return otlp.named("reply")

        [reply] = await eventually(a_reply_span, within_s=10)
        # The taker's spans join the burst's trace, below its first ingest.
        assert reply.trace_id == ingest.trace_id
        assert ingest.parent_id == ""
        assert ingest.resource["service.instance.id"] == "replica-0"
        assert reply.resource["service.instance.id"] != holder
        assert reply.attributes["lastword.fence"] >= 2  # the takeover
        chats = [span for span in otlp.named("chat") if span.resource == reply.resource]
        assert chats and {span.trace_id for span in chats} == {ingest.trace_id}
        assert chats[-1].attributes["gen_ai.request.model"] == FAKE_MODEL_ID
        # Batched: fewer requests than spans.
        assert otlp.requests < len(otlp.spans)
        everything = repr([(s.name, s.attributes, s.resource) for s in otlp.spans])
        for secret_or_content in ("sk-secret-key", "hello there", conversation):
            assert secret_or_content not in everything


async def test_a_collector_slow_or_down_delays_no_reply(
    server: EmbeddedRedis, short_dir: Path
) -> None:
    chats = range(52_000, 52_006)
    async with FakeOTLP() as slow, FakeOpenAI() as model, FakeTelegram() as fake:
        slow.delay_s = 30.0
        down = f"http://127.0.0.1:{free_port()}"
        endpoints = [slow.endpoint, down, slow.endpoint]
        async with fleet(
            # Each export waits up to 10 s for the slow one: were it sent on the way of a
            # reply, that reply would wait as long.
            server,
            fake,
            short_dir,
            each=lambda n: traced(model, endpoints[n], n, timeout_s=10),
        ) as replicas:
            for n, chat in enumerate(chats):
                update = fake.private_text_update(chat, chat, f"hi {chat}")
                assert await post(replicas[n % len(replicas)], update) == 200

            async def all_answered() -> bool:
                return set(chats) <= set(replies(fake))

            # As soon as without traces: the window (0.3 s) and the model's answer, with slack.
            await eventually(all_answered, within_s=10)
            assert all(replica.bot.process.returncode is None for replica in replicas)
            # A stop does not wait on the collector past its bound (3 s): within the 10 s a stop
            # may take.
            code, took = await replicas[0].bot.terminate()
            assert (code, took < 10) == (0, True), took
