"""What a command is: its declaration (`Command`), a use of it in a burst (`Ask`), the
context its answer is worked out in (`CommandContext`), and what it answers and changes (`Decision`,
`Change`). The registry itself, and how a burst is sorted, are in `bot.commands`."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Literal, Protocol, TypeVar

from bot.config.settings import Settings
from bot.memory import Memory
from bot.store import Store
from bot.tools import Toolbox

# A command's shape, as Telegram and Discord users type one: "/name", "/name@Bot", "/name args".
# "/etc/hosts is broken" is not one, and goes to the model.
COMMAND = re.compile(r"/([A-Za-z0-9_]{1,32})(?:@\w+)?(?:\s|$)")

# What a command does to the burst it is in, decided before anything is asked of the store:
# "reset" drops what came before it and empties the history at the commit; "stop" drops what
# came before it; "retry" writes the last reply again.
Effect = Literal["", "reset", "stop", "retry"]

Args = TypeVar("Args")


def command_of(text: str) -> str | None:
    """`"start"` for "/start", "/start@SomeBot" or "/START now"; None for what is not shaped
    like a command."""
    found = COMMAND.match(text.strip())
    return found.group(1).lower() if found else None


@dataclass(frozen=True)
class Ask:
    """One use of a command whose answer the cycle works out when it replies (with the
    store): the words after its name, who sent it, and the version of its message."""

    command: str
    argument: str = ""
    by: str = ""
    version: int = 0


class Change(Protocol):
    """What a command changes in the store, carried out only once its reply has passed the
    pre-send check (a stale reply changes nothing). It travels in the outbox with the
    reply's text, as JSON (`kind` names its class), so a reply re-sent after a crash carries
    it out too: carrying one out twice is harmless."""

    kind: ClassVar[str]

    async def apply(self, store: Store, conversation: str, memory: Memory) -> None: ...


@dataclass(frozen=True)
class Decision:
    """A command's answer, and the changes it stands for (none for misuse). `reset`: the
    history is emptied at the commit, as by /reset (a confirmed /forget)."""

    answer: str
    changes: tuple[Change, ...] = ()
    reset: bool = False


@dataclass
class CommandContext:
    """What a burst's commands are answered with. A command that picks something for the
    rest of the burst (/model, /persona) sets it here, so the model's answer to the same burst
    already follows it; the store learns of it only once the reply passes the pre-send
    check (`Change`)."""

    store: Store
    settings: Settings
    conversation: str
    picks_models: bool  # the model lets a person pick one of the configured models (`LLM`)
    model: str  # the model the user picked ("": the default)
    persona: str  # the user's own instructions ("": none)
    # A /forget earlier in this burst asked for its confirmation.
    forget_asked: bool = False
    # The replica's tools (/tools lists those offered to the asker).
    toolbox: Toolbox = field(default_factory=Toolbox)
    # Where people's facts are kept; None: the operator turned memory off.
    memory: Memory | None = None


Parse = Callable[[Sequence[str]], Args | None]
Run = Callable[[CommandContext, Ask, Args], Awaitable[Decision]]


def any_words(words: Sequence[str]) -> Sequence[str]:
    """Arguments a command reads itself, or ignores."""
    return words


def no_words(words: Sequence[str]) -> Sequence[str] | None:
    """No arguments: anything after the name is misuse."""
    return None if words else words


async def fixed(turn: CommandContext, ask: Ask, args: object) -> Decision:
    """Never run: a command with a `text` is answered without the store."""
    raise AssertionError(f"/{ask.command} has a fixed answer")


@dataclass(frozen=True)
class Command(Generic[Args]):
    """One command, declared once: `bot.commands.COMMANDS` lists them all, `/help` is made
    from them, and a burst is sorted and answered by them alone."""

    name: str
    help: str  # what /help says of it, after "/name: "
    shape: str = ""  # its arguments as /help shows them, e.g. "<user id>"
    # Its answer when it needs nothing from the store (then `run` is never called).
    text: str = ""
    # Its arguments, from the words after its name: None means misuse, answered with `usage`.
    parse: Parse[Args] = any_words  # type: ignore[assignment]
    run: Run[Args] = fixed
    usage: str = ""
    admin: bool = False  # for LASTWORD_ACCESS__ADMINS only; listed in their /help alone
    effect: Effect = ""

    async def decide(self, turn: CommandContext, ask: Ask) -> Decision:
        """Its answer to `ask`, and what it will change; nothing is changed yet."""
        args = self.parse(ask.argument.split())
        if args is None:
            return Decision(self.usage)
        return await self.run(turn, ask, args)


AnyCommand = Command[Any]
