"""Setting names nobody reads: a misspelt variable or TOML key, and the real one meant.

pydantic-settings ignores a name it does not know, so `LASTWORD_LLM__MODLE=gpt-4o` or
`[debounse]` would leave the bot on its defaults with nothing said. Every `LASTWORD_*`
variable (environment and `.env`), every credential file and every TOML key is matched
against the settings tree here, and the first unknown one becomes a `ConfigError` naming the
closest real name.
"""

from __future__ import annotations

import difflib
import types
from collections.abc import Iterator, Mapping
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel

# Names that are not settings but are read by lastword all the same.
NOT_SETTINGS = ("CONFIG",)


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The settings group a field holds (`LLMSettings`...), or None for a value."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if get_origin(annotation) in (Union, types.UnionType):
        for arg in get_args(annotation):
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                return arg
    return None


def _opens_keys(annotation: Any) -> bool:
    """Whether a field is a free-form mapping (`extra_headers`): any key below it is its own."""
    return annotation is dict or get_origin(annotation) is dict


def leaves(model: type[BaseModel], path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every setting of `model` as its path of field names, groups walked into."""
    for name, field in model.model_fields.items():
        group = _model_of(field.annotation)
        if group is not None:
            yield from leaves(group, (*path, name))
        else:
            yield (*path, name)


def env_name(prefix: str, path: tuple[str, ...]) -> str:
    """The environment variable of a setting: `LASTWORD_LLM__MODEL`."""
    return prefix + "__".join(path).upper()


def _open_paths(model: type[BaseModel], path: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    found: set[tuple[str, ...]] = set()
    for name, field in model.model_fields.items():
        group = _model_of(field.annotation)
        if group is not None:
            found |= _open_paths(group, (*path, name))
        elif _opens_keys(field.annotation):
            found.add((*path, name))
    return found


def _suggest(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def unknown_variable(
    names: list[str], model: type[BaseModel], prefix: str, where: str
) -> str | None:
    """The first of `names` (variables with the prefix) that names no setting, as one line
    with the closest real name; None when all are known."""
    known = [env_name(prefix, path) for path in leaves(model)]
    known += [prefix + extra for extra in NOT_SETTINGS]
    opened = [env_name(prefix, path) + "__" for path in _open_paths(model)]
    for name in sorted(names):
        upper = name.upper()
        if upper in known or upper.startswith(tuple(opened)):
            continue
        return f"{name}{where}: no such setting{_suggest(upper, known)}"
    return None


def unknown_key(table: Mapping[str, Any], model: type[BaseModel], where: str) -> str | None:
    """The first key of a TOML table that names no setting, as one line with the closest real
    key, in TOML's own spelling (`[debounce]`, `llm.model`); None when all are known."""
    return _unknown_in(table, model, (), where)


def _unknown_in(
    table: Mapping[str, Any], model: type[BaseModel], path: tuple[str, ...], where: str
) -> str | None:
    fields = model.model_fields
    for key, value in table.items():
        dotted = ".".join((*path, key))
        if key not in fields:
            groups = [name for name, f in fields.items() if _model_of(f.annotation)]
            plain = [name for name in fields if name not in groups]
            if isinstance(value, Mapping):
                close = difflib.get_close_matches(key, groups, n=1, cutoff=0.6)
                hint = f" (did you mean [{'.'.join((*path, close[0]))}]?)" if close else ""
                return f"{where}: [{dotted}]: no such group of settings{hint}"
            close = difflib.get_close_matches(key, plain + groups, n=1, cutoff=0.6)
            hint = f" (did you mean {'.'.join((*path, close[0]))}?)" if close else ""
            return f"{where}: {dotted}: no such setting{hint}"
        group = _model_of(fields[key].annotation)
        if group is not None and isinstance(value, Mapping):
            found = _unknown_in(value, group, (*path, key), where)
            if found:
                return found
    return None
