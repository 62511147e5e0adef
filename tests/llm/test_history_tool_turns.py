"""A reply whose tools ran but which had no words of the model's (only a note of the bot's, say)
stays in what the model is later shown: its calls and their results, so that the model knows
those calls happened and does not make them again. The history as the store reads it back
goes through `conversation_of` and the prompt, and on to the loopback fake provider through
the real OpenAI client, which checks the calls' shape as OpenAI does."""

from __future__ import annotations

import json

from bot.core.history import conversation_of
from bot.llm.base import Usage
from bot.llm.openai import OpenAILLM
from bot.llm.prompt import Prompt, Turn, used_of
from bot.store import HistoryEntry
from tests.support.chatting import fake
from tests.support.fakes.openai_server import FakeOpenAI, strict_turns
from tests.support.provider import llm_settings

__all__ = ["fake"]  # the fixture, imported for pytest

CALLS = json.dumps([{"tool": "append_note", "arguments": '{"line": "milk"}', "result": "noted"}])


def history() -> list[HistoryEntry]:
    return [
        HistoryEntry("user", 1, "note milk down", words="note milk down"),
        # The user saw a note of the bot's; the model said nothing, but its call ran.
        HistoryEntry("assistant", 1, "(a note)", tools=CALLS, turn=1, words=""),
        HistoryEntry("user", 2, "did you?", words="did you?"),
        HistoryEntry("assistant", 2, "Yes.", turn=2, words="Yes."),
    ]


def test_a_reply_with_calls_and_no_words_stays_in_the_conversation() -> None:
    shown = conversation_of(history())
    assert [(e.role, e.version) for e in shown] == [
        ("user", 1),
        ("assistant", 1),
        ("user", 2),
        ("assistant", 2),
    ]
    # Its words, not the bot's note, with its calls.
    assert (shown[1].text, shown[1].tools) == ("", CALLS)


async def test_the_model_is_later_shown_the_calls_of_a_reply_without_words(
    fake: FakeOpenAI,
) -> None:
    turns = tuple(Turn(e.role, e.text, used_of(e.tools)) for e in conversation_of(history()))
    prompt = Prompt("Be brief.", turns, ("and eggs?",))
    llm = OpenAILLM(llm_settings(fake))
    try:
        await llm.complete(prompt, Usage())
    finally:
        await llm.close()
    [request] = fake.requests
    [call] = request.tool_calls()
    assert (call.name, call.arguments) == ("append_note", '{"line": "milk"}')
    [result] = request.tool_results()
    assert (result.name, result.text) == ("append_note", "noted")
    # As strict chat templates take them: the turns alternate from the user's.
    assert strict_turns(request.messages) is None
