"""Tools a provider refuses: telling a refusal of tools from any other 400, and remembering,
per model, what was refused, so that a reply still comes and later ones do not ask again.

Two refusals are told apart. A model that takes no tools at all: Ollama's small models answer
400 "does not support tools", Groq "tool calling is not supported with this model", vLLM
without its tool parser '"auto" tool choice requires --enable-auto-tool-choice', llama.cpp
"tools param requires --jinja flag", older Azure API versions "Unrecognized request argument
supplied: tools", OpenRouter 404 "No endpoints found that support tool use". And one tool
whose schema the provider will not take (a feature such as `"format": "date-time"`), named
by the provider in its message ("Invalid schema for function 'when_is'") or by its place in
the request's `tools` (`param: tools[1].function.parameters`, Gemini's
`function_declarations[1]`). A schema refusal that names no tool sent counts as a refusal of
every tool: without tools the reply still comes.

What was refused is kept in the replica's memory (`Refusals`), `REMEMBER_S` long: it is the
provider's answer about a model and a schema, the same to every replica, so a replica that
has not heard it yet (or has restarted) pays one refused request to learn it, and no replica
needs another's to finish a conversation. Kept in the store, it would cost every request a
round trip to save a few. After `REMEMBER_S` the tools are offered again, once (the model
may have been updated, the schema fixed). At most `MAX_MODELS` models and `MAX_TOOLS` tools
each are kept.
"""

from __future__ import annotations

import logging
import re
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

# How long a refusal is remembered: bursts meanwhile go without what was refused at once.
REMEMBER_S = 600.0
# Models remembered at most (a /model pick per user may name many), the oldest forgotten
# first; tools refused per model at most, past which the model is taken to refuse them all.
MAX_MODELS = 64
MAX_TOOLS = 64
# What a provider's message quoted in a log line is cut to.
REASON_CHARS = 200
# The fix for a model that takes no tools, and for one tool it refuses.
NO_TOOLS_FIX = (
    "pick a model that supports tool calling (LASTWORD_LLM__MODEL), or remove the tools "
    "(LASTWORD_TOOLS__MCP_SERVERS, the Python tools installed)"
)
TOOL_FIX = (
    "fix the tool's schema, or remove the tool (its server in LASTWORD_TOOLS__MCP_SERVERS, "
    "or the Python tool's package)"
)

# Tools as a whole, as providers name them when they refuse them all (not a bare "tool",
# which their complaints about a history's tool messages use too).
_TOOLS = re.compile(
    r"\b(?:tools|tool[ _-]?(?:use|calls?|calling|choice|support)|"
    r"function[ _-]?(?:calls?|calling)|functions)\b",
    re.IGNORECASE,
)
_REFUSES = re.compile(
    r"not\s+support|n't\s+support|unsupported|unrecognized request argument|"
    r"no endpoints found that support|requires\s+--|"
    r"not\s+(?:be\s+)?(?:enabled|available|allowed)",
    re.IGNORECASE,
)
# A refusal of one tool's definition.
_SCHEMA = re.compile(r"schema|function_declarations|\bparameters\b", re.IGNORECASE)
_TOOLISH = re.compile(r"\b(?:tools?|functions?)\b", re.IGNORECASE)
# A tool by its place in the request: Gemini's compatible API names its function
# declarations inside one tool, OpenAI the tool itself.
_PLACES = (re.compile(r"function_declarations\[(\d+)\]"), re.compile(r"\btools\[(\d+)\]"))
_PARAMS = re.compile(r"(?:tools|tool_choice|functions)\b")


@dataclass(frozen=True)
class Refusal:
    """What a provider refused of the tools sent: one tool (`tool`, its name) or every tool
    (`tool` empty); `reason` is the provider's own message."""

    tool: str = ""
    reason: str = ""


def refusal(status: int, message: str, param: str | None, sent: Sequence[str]) -> Refusal | None:
    """What of the tools `sent` (their names, in the request's order) an error refused; None
    if the error is not about them (or no tool was sent)."""
    if status not in (400, 404, 422) or not sent:
        return None
    param = param or ""
    if param.startswith("messages"):
        return None  # a history's tool message, not the tools offered
    about_param = _PARAMS.match(param) is not None
    whole = _TOOLS.search(message) is not None and _REFUSES.search(message) is not None
    schema = _SCHEMA.search(message) is not None or about_param
    named = _named(f"{message} {param}", sent)
    reason = " ".join(message.split())[:REASON_CHARS]
    if named and schema:
        return Refusal(named, reason)
    if whole or about_param or (schema and _TOOLISH.search(message)):
        return Refusal("", reason)
    return None


def _named(text: str, sent: Sequence[str]) -> str:
    """The tool sent that `text` names: by its place in the request, else by its name (the
    first one the text mentions); '' if none."""
    for place in _PLACES:
        found = place.search(text)
        if found and int(found.group(1)) < len(sent):
            return sent[int(found.group(1))]
    mentioned = [
        (match.start(), name)
        for name in set(sent)
        if (match := re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text))
    ]
    return min(mentioned)[1] if mentioned else ""


@dataclass
class _Refused:
    until: float
    every: bool = False
    tools: set[str] = field(default_factory=set)


class Refusals:
    """What each model refused of the tools, this replica's memory of it (see the module's
    docstring). `clock` is monotonic seconds."""

    def __init__(
        self, remember_s: float = REMEMBER_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.remember_s = remember_s
        self._clock = clock
        self._models: OrderedDict[str, _Refused] = OrderedDict()

    def refused(self, model: str) -> tuple[bool, frozenset[str]]:
        """Whether `model` refuses every tool, and which tools it refuses; nothing once the
        refusal is older than `remember_s`."""
        entry = self._models.get(model)
        if entry is None:
            return False, frozenset()
        if self._clock() >= entry.until:
            del self._models[model]
            return False, frozenset()
        return entry.every, frozenset(entry.tools)

    def learn(self, model: str, refused: Refusal) -> None:
        """Remember `refused` for `model`, with one WARNING that names the model, what it
        refused and the fix."""
        entry = self._models.get(model)
        if entry is None or self._clock() >= entry.until:
            entry = _Refused(self._clock() + self.remember_s)
        self._models[model] = entry
        self._models.move_to_end(model)
        while len(self._models) > MAX_MODELS:
            self._models.popitem(last=False)
        minutes = f"{self.remember_s / 60:g} min"
        if refused.tool and len(entry.tools) < MAX_TOOLS:
            entry.tools.add(refused.tool)
            log.warning(
                "model %s refuses tool %s (%s): replies go without that tool for the next %s; %s",
                model,
                refused.tool,
                refused.reason,
                minutes,
                TOOL_FIX,
            )
            return
        entry.every = True
        log.warning(
            "model %s does not take tools (%s): replies go without them for the next %s; %s",
            model,
            refused.reason,
            minutes,
            NO_TOOLS_FIX,
        )
