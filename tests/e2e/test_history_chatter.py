"""The model sees the conversation, not the chatter (issue 32, problems 4 and 5).

Command replies, notices and the commands themselves never reach the model; a request never
opens with an assistant turn, and user and assistant turns alternate (adjacent turns of one
role merged), so a provider with a strict chat template (vLLM, llama.cpp: the fake's
`strict_roles`) takes every request: after /reset, after /forget, after a burst of commands.
/retry after /stop asks the stopped question again, without "/stop". The prompt's shape first,
then through `lastword run` (Telegram webhook, the OpenAI client on the fake provider, a real
server)."""

from __future__ import annotations

import html
from typing import Any, Literal

import pytest

from bot.commands import HELP, RESET, STOPPED, WELCOME
from bot.commands.forget import CONFIRM, FORGOTTEN
from bot.core.cycle import APOLOGY
from bot.core.history import conversation_of, last_reply
from bot.llm.prompt import FOLD_HEADER, Image, Prompt, Turn, Used
from bot.store import HistoryEntry
from tests.support.fakes.openai_server import FakeOpenAI, RecordedRequest, strict_turns
from tests.support.waits import settled
from tests.support.world import CHAT, CONVERSATION, Bot, World

pytestmark = pytest.mark.timeout(60)


def turns(messages: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    """Each message's role and content, tool calls left aside."""
    return [(m["role"], m["content"]) for m in messages]


# -- the prompt's shape ----------------------------------------------------------------------


def test_the_strict_fake_refuses_what_a_strict_template_refuses() -> None:
    system: dict[str, Any] = {"role": "system", "content": "sys"}
    user: dict[str, Any] = {"role": "user", "content": "q"}
    said: dict[str, Any] = {"role": "assistant", "content": "a"}
    calls: dict[str, Any] = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "t", "arguments": ""}}
        ],
    }
    result: dict[str, Any] = {"role": "tool", "tool_call_id": "c1", "content": "r"}
    refused = [
        [system, said, user],
        [system, user, user],
        [system, user, said, said, user],
        [system, user, said, calls, result, said, user],
        [system, user, calls, result, user],
        [system, user, said, system, user],
    ]
    for messages in refused:
        assert strict_turns(messages) is not None, turns(messages)
    taken = [
        [system, user],
        [system, user, said, user],
        [system, user, calls, result, said, user],
        [system, user, calls, result, calls, result, said, user],
        # A reply's steps under way: the model is asked to go on after its calls' results.
        [system, user, calls, result],
    ]
    for messages in taken:
        assert strict_turns(messages) is None, turns(messages)


def test_a_history_trimmed_to_a_reply_starts_with_the_user() -> None:
    history = (Turn("assistant", "an old answer"), Turn("user", "q"), Turn("assistant", "a"))
    messages = Prompt("sys", history, ("next",)).messages()
    assert turns(messages) == [
        ("system", "sys"),
        ("user", "q"),
        ("assistant", "a"),
        ("user", "next"),
    ]


def test_adjacent_turns_of_one_role_are_merged_with_a_blank_line() -> None:
    # A message left without an answer (stopped, apologised for) before the fold, and two
    # replies in a row, as a history kept before chatter was told apart can hold.
    history = (
        Turn("user", "hi"),
        Turn("assistant", "Hello."),
        Turn("assistant", "How can I help?"),
        Turn("user", "write an essay"),
    )
    messages = Prompt("sys", history, ("A", "B")).messages()
    assert turns(messages) == [
        ("system", "sys"),
        ("user", "hi"),
        ("assistant", "Hello.\n\nHow can I help?"),
        ("user", f"write an essay\n\n{FOLD_HEADER}\n1. A\n2. B"),
    ]
    assert strict_turns(messages) is None


def test_a_reply_that_called_tools_after_another_reply_is_one_assistant_turn() -> None:
    used = (Used("get_time", '{"tz": "UTC"}', "12:00"),)
    history = (
        Turn("user", "hi"),
        Turn("assistant", "Hello."),
        Turn("assistant", "It is noon.", used),
    )
    messages = Prompt("sys", history, ("thanks",)).messages()
    assert [m["role"] for m in messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "user",
    ]
    assert messages[2]["content"] == "Hello." and messages[2]["tool_calls"]
    assert messages[4]["content"] == "It is noon."
    assert strict_turns(messages) is None


def test_images_folded_after_an_unanswered_message_keep_its_text_first() -> None:
    image = Image("data:image/png;base64,AAAA", 85)
    prompt = Prompt("sys", (Turn("user", "stopped"),), ("look",), images=((image,),))
    [_, (role, content)] = turns(prompt.messages())
    assert role == "user"
    assert content[0] == {"type": "text", "text": "stopped\n\n"}
    assert [p["type"] for p in content[1:]] == ["text", "image_url"]


def entry(role: Literal["user", "assistant"], v: int, text: str, **kw: Any) -> HistoryEntry:
    """A history entry as the store reads it back: a message's words are its text."""
    words = text if role == "user" else kw.pop("words", text)
    return HistoryEntry(role, v, text, words=words, **kw)


def test_the_conversation_is_the_exchanges_the_model_answered() -> None:
    history = [
        entry("user", 1, "hi"),
        entry("assistant", 1, "Hello!", turn=1),
        entry("user", 2, "/help"),
        entry("assistant", 2, HELP, turn=2, words=""),
        entry("user", 3, "write an essay"),
        entry("user", 4, "/stop"),
        entry("assistant", 4, STOPPED, turn=3, words=""),
        entry("user", 5, "/usage"),
        entry("user", 6, "a joke?"),
        entry("assistant", 6, "Today: 5 tokens.\n\nA joke.", turn=5, words="A joke."),
    ]
    said = [(e.role, e.text) for e in conversation_of(history)]
    assert said == [
        ("user", "hi"),
        ("assistant", "Hello!"),
        ("user", "a joke?"),
        ("assistant", "A joke."),
    ]
    # /retry: the model's last answer, and what it answered, with the conversation before.
    target = last_reply(history)
    assert target is not None and (target.version, target.turn) == (6, 5)
    assert [e.text for e in target.asked] == ["a joke?"]
    assert [e.text for e in target.before] == ["hi", "Hello!"]


def test_a_retried_reply_answers_its_messages_after_the_chatter_since() -> None:
    # "a joke?" was answered again (v4, its turn 2) after a /help that came between.
    history = [
        entry("user", 1, "hi"),
        entry("assistant", 1, "Hello!", turn=1),
        entry("user", 2, "a joke?"),
        entry("user", 3, "/help"),
        entry("assistant", 3, HELP, turn=3, words=""),
        entry("assistant", 4, "Another joke.", turn=2),
    ]
    said = [(e.role, e.text) for e in conversation_of(history)]
    assert said == [
        ("user", "hi"),
        ("assistant", "Hello!"),
        ("user", "a joke?"),
        ("assistant", "Another joke."),
    ]
    target = last_reply(history)
    assert target is not None and (target.version, target.turn) == (4, 2)


def test_a_stopped_burst_is_left_out_but_a_retry_asks_it_again() -> None:
    history = [
        entry("user", 1, "hi"),
        entry("assistant", 1, "Hello!", turn=1),
        entry("user", 2, "write an essay"),
        entry("user", 3, "/stop"),
        entry("assistant", 3, STOPPED, turn=2, words=""),
    ]
    assert [e.text for e in conversation_of(history)] == ["hi", "Hello!"]
    target = last_reply(history)
    assert target is not None and (target.version, target.turn) == (3, 2)
    assert [e.text for e in target.asked] == ["write an essay"]
    # A reply never delivered: its messages are asked again, as the last ones.
    undelivered = [*history[:2], entry("user", 2, "write an essay")]
    target = last_reply(undelivered)
    assert target is not None and (target.version, target.turn) == (0, 2)
    assert last_reply([entry("user", 1, "/help"), entry("assistant", 1, HELP, words="")]) is None


# -- through `lastword run` ------------------------------------------------------------------


def numbered(provider: FakeOpenAI) -> None:
    """The strict provider, answering "answer <n>" to its n-th request."""
    provider.strict_roles = True
    provider.reply = lambda request: f"answer {len(provider.requests)}"


async def say(world: World, bot: Bot, version: int, *texts: str) -> None:
    """Send texts as one burst and wait until it is answered."""
    for text in texts:
        await bot.post(world.telegram.private_text_update(CHAT, CHAT, text))
    await settled(world.redis, CONVERSATION, version=version, within_s=15)


def sent_texts(world: World) -> list[str]:
    """The replies the user saw, as plain text (the adapter sends HTML)."""
    return [html.unescape(m.text or "") for m in world.telegram.sent_messages]


def everything_said(request: RecordedRequest) -> str:
    """All the text of a request's turns but the system prompt."""
    return "\n".join(str(m["content"]) for m in request.messages if m["role"] != "system")


async def test_command_replies_notices_and_commands_never_reach_the_model(world: World) -> None:
    provider = world.provider
    numbered(provider)
    provider.fail_next(FakeOpenAI.model_not_found())
    async with world.bot() as bot:
        await say(world, bot, 1, "are you there?")
        await say(world, bot, 2, "hi")
        await say(world, bot, 3, "/help")
        await say(world, bot, 4, "/usage")
        await say(world, bot, 5, "/start")
        await say(world, bot, 8, "/model", "/help", "tell me a joke")
        await say(world, bot, 9, "another one")
    sent = sent_texts(world)
    assert sent[:5] == [APOLOGY, "answer 2", HELP, sent[3], WELCOME]
    assert sent[3].startswith("Today:")
    # /model's answer, /help's, then the model's: one reply.
    assert "gpt-4o-mini" in sent[5] and sent[5].endswith(f"\n\n{HELP}\n\nanswer 3")
    assert sent[6] == "answer 4"
    assert provider.rejected == []
    _, hi, joke, another = provider.requests
    # The apology, and the message it alone answered, are left out.
    assert turns(hi.messages)[1:] == [("user", "hi")]
    assert turns(joke.messages)[1:] == [
        ("user", "hi"),
        ("assistant", "answer 2"),
        ("user", "tell me a joke"),
    ]
    # The reply the user saw held /model's and /help's answers: the model's words alone stay.
    assert turns(another.messages)[1:] == [
        ("user", "hi"),
        ("assistant", "answer 2"),
        ("user", "tell me a joke"),
        ("assistant", "answer 3"),
        ("user", "another one"),
    ]
    assert "/" not in everything_said(another) and "Today:" not in everything_said(another)


async def test_after_reset_and_forget_a_strict_provider_still_answers(world: World) -> None:
    provider = world.provider
    numbered(provider)
    async with world.bot() as bot:
        await say(world, bot, 1, "hi")
        await say(world, bot, 2, "/reset")
        await say(world, bot, 3, "who are you?")
        await say(world, bot, 4, "/forget")
        await say(world, bot, 5, "/forget")
        await say(world, bot, 6, "hello again")
        await say(world, bot, 9, "/usage", "/reset", "/help")
        await say(world, bot, 10, "and now?")
    sent = sent_texts(world)
    assert APOLOGY not in sent
    assert sent[:6] == ["answer 1", RESET, "answer 2", CONFIRM, FORGOTTEN, "answer 3"]
    assert sent[6] == f"{RESET}\n\n{HELP}" and sent[7] == "answer 4"
    assert provider.rejected == []
    # Each starts afresh: the system prompt, then the user's message, nothing in between.
    afresh = ("who are you?", "hello again", "and now?")
    for request, asked in zip(provider.requests[1:], afresh, strict=True):
        assert turns(request.messages)[1:] == [("user", asked)]


async def test_retry_after_stop_asks_again_without_the_command(world: World) -> None:
    provider = world.provider
    numbered(provider)
    # The first answer is slow enough to be stopped; the retried one comes at once.
    provider.delay_for = lambda request: 10.0 if provider.requests.index(request) == 1 else 0.0
    async with world.bot() as bot:
        await say(world, bot, 1, "hi")
        await bot.post(world.telegram.private_text_update(CHAT, CHAT, "write me an essay"))
        stopped = await provider.wait_for_request(lambda r: "essay" in r.last_user_text, timeout=15)
        await bot.post(world.telegram.private_text_update(CHAT, CHAT, "/stop"))
        await provider.wait_for_request(lambda r: r is stopped and r.cancelled, timeout=10)
        await settled(world.redis, CONVERSATION, version=3, within_s=15)
        await say(world, bot, 4, "/retry")
        await say(world, bot, 5, "thanks")
        # A /retry after a command: the model's last answer is written again, not the command.
        await say(world, bot, 6, "/help")
        await say(world, bot, 7, "/retry")
        await say(world, bot, 8, "bye")
    sent = sent_texts(world)
    assert sent == ["answer 1", STOPPED, "answer 3", "answer 4", HELP, "answer 5", "answer 6"]
    assert provider.rejected == []
    _, _, retried, thanks, thanked_again, bye = provider.requests
    # The same question as the stopped request, and nothing else.
    assert retried.messages == stopped.messages
    assert turns(retried.messages)[1:] == [
        ("user", "hi"),
        ("assistant", "answer 1"),
        ("user", "write me an essay"),
    ]
    assert turns(thanks.messages)[1:] == [
        ("user", "hi"),
        ("assistant", "answer 1"),
        ("user", "write me an essay"),
        ("assistant", "answer 3"),
        ("user", "thanks"),
    ]
    assert thanked_again.messages == thanks.messages
    assert turns(bye.messages)[1:] == [
        *turns(thanks.messages)[1:],
        ("assistant", "answer 5"),
        ("user", "bye"),
    ]
