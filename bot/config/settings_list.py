"""`lastword settings`: every setting as an operator types it, with its default and what it
means, read from the settings model (the field descriptions), so it says what
docs/settings.md's table says.

A default computed where lastword runs (the data directory, the replica id) is shown as how
it is computed, never as this machine's value: that would change from one call to the next.
"""

from __future__ import annotations

import inspect
import re
import textwrap
from collections.abc import Iterator
from typing import NamedTuple

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from bot.config.settings import ENV_PREFIX, PLATFORM_SECTIONS, settings_tree

# A meaning is wrapped to this width, under its variable.
WIDTH = 96
INDENT = "    "
# Markdown in a description that a terminal shows as it is: `code` and [text](link).
_CODE = re.compile(r"`([^`]*)`")
_LINK = re.compile(r"\[([^\]]*)\]\([^)]*\)")


class Entry(NamedTuple):
    """One setting: its variable, its default as shown, and its meaning ("" when its model
    gives none)."""

    variable: str
    default: str
    meaning: str


def computed(field: FieldInfo) -> str | None:
    """How a default that is computed where lastword runs is computed (the first paragraph
    of its factory's docstring); None for a default that is a value."""
    factory = field.default_factory
    if factory is None or factory in (dict, list):
        return None
    doc = inspect.getdoc(factory) or ""
    return doc.split("\n\n", 1)[0].replace("\n", " ").rstrip(".") or "computed at start"


def _default(field: FieldInfo, section: str) -> str:
    if field.is_required():
        return f"required when platform is {section}"
    how = computed(field)
    if how is not None:
        return f"computed: {plain(how)}"
    value = field.get_default(call_default_factory=True)
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return ",".join(map(str, value)) if value else "empty"
    return str(value)


def plain(text: str) -> str:
    """`text` (a description, written for docs/settings.md) without its Markdown."""
    return _CODE.sub(r"\1", _LINK.sub(r"\1", text))


def entries() -> Iterator[Entry]:
    """Every setting of the core and of each installed platform, in the model's order."""

    def walk(model: type[BaseModel], prefix: str) -> Iterator[Entry]:
        for name, field in model.model_fields.items():
            annotation = field.annotation
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                yield from walk(annotation, f"{prefix}{name.upper()}__")
                continue
            section = prefix.removeprefix(ENV_PREFIX).removesuffix("__").lower()
            meaning = plain(field.description or "")
            yield Entry(prefix + name.upper(), _default(field, section), meaning)

    yield from walk(settings_tree(PLATFORM_SECTIONS), ENV_PREFIX)


def render() -> str:
    """The list as `lastword settings` prints it: a line per setting (variable, default),
    its meaning wrapped under it."""
    lines = [
        "Every setting, as an environment variable (a line of ./.env, a systemd credential of",
        "that name, or a key of the TOML file: [group] name). Highest priority first:",
        "environment, credentials, ./.env, the TOML file ($LASTWORD_CONFIG, else",
        "./lastword.toml), OPENAI_API_KEY and OPENAI_BASE_URL, defaults. More in",
        "docs/settings.md.",
        "",
    ]
    for entry in entries():
        lines.append(f"{entry.variable}  default: {entry.default}")
        if entry.meaning:
            lines += textwrap.wrap(
                entry.meaning, WIDTH, initial_indent=INDENT, subsequent_indent=INDENT
            )
    return "\n".join(lines) + "\n"
