"""/stop and /retry, and /help saying what they do: in-process against the real store and the
loopback fake model. A /stop with nothing being written says there was nothing to stop, not
"Stopped."; a /retry after a /stop writes the answer the /stop cut short, which is what /help
says of both."""

from __future__ import annotations

import pytest

from bot.commands import HELP, NOTHING_TO_STOP, STOPPED, plan
from tests.support.builders import message
from tests.support.commands import CONV, Start
from tests.support.fakes.openai_server import FakeOpenAI, RecordedRequest
from tests.support.waits import settled


@pytest.mark.parametrize(
    ("texts", "answer"),
    [
        (["/stop"], NOTHING_TO_STOP),
        (["/stop", "/stop"], NOTHING_TO_STOP),
        (["hi", "/stop"], STOPPED),
        # The second /stop stops nothing, but the first stopped "hi": the burst was stopped.
        (["hi", "/stop", "/stop"], STOPPED),
        # An owed command answer is an answer being written too.
        (["/usage", "/stop"], STOPPED),
    ],
)
def test_a_stop_says_whether_it_stopped_anything(texts: list[str], answer: str) -> None:
    stopped = plan(watermark=3, unanswered=[message(t, n=4 + i) for i, t in enumerate(texts)])
    assert (stopped.answers, stopped.for_model) == ((answer,), ())


async def test_a_stop_with_nothing_being_written_says_there_was_nothing_to_stop(
    bot: Start, fake: FakeOpenAI
) -> None:
    runtime, outbound = await bot()
    assert await runtime.ingest(message("hello", n=1))
    await settled(runtime, CONV)
    assert await runtime.ingest(message("/stop", n=2))
    await settled(runtime, CONV)
    assert outbound.texts()[1:] == [NOTHING_TO_STOP]
    assert len(fake.requests) == 1


def help_line(name: str) -> str:
    [line] = [line for line in HELP.splitlines() if line.startswith(f"/{name}:")]
    return line


async def test_retry_after_stop_writes_the_stopped_answer_as_help_says(
    bot: Start, fake: FakeOpenAI
) -> None:
    def first_is_slow(request: RecordedRequest) -> float:
        return 30.0 if fake.requests.index(request) == 0 else 0.0

    fake.delay_for = first_is_slow
    fake.reply = lambda request: f"about: {request.last_user_text}"
    runtime, outbound = await bot()
    assert await runtime.ingest(message("write me an essay", n=1))
    essay = await fake.wait_for_request(timeout=10)
    assert await runtime.ingest(message("/stop", n=2))
    await settled(runtime, CONV)
    assert essay.cancelled
    assert outbound.texts() == [STOPPED]
    assert await runtime.ingest(message("/retry", n=3))
    await settled(runtime, CONV)
    # The answer /stop cut short, to the very question it cut short.
    assert outbound.texts() == [STOPPED, "about: write me an essay"]
    assert fake.requests[-1].messages == essay.messages
    # What /help says of both: /stop points at /retry, and /retry writes the stopped answer.
    assert "/retry" in help_line("stop")
    assert "stopped" in help_line("retry")
