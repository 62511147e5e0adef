"""Every setting of the settings model, walked field by field: for the tests that try each one."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo


def model_in(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds (alone, optional, or as the items of a list), if any."""
    for candidate in (annotation, *get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def setting_fields(
    model: type[BaseModel], path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], FieldInfo]]:
    """Every setting under `model` (groups walked into) as its path and field."""
    for name, info in model.model_fields.items():
        group = model_in(info.annotation)
        if group is not None and get_origin(info.annotation) not in (dict, list):
            yield from setting_fields(group, (*path, name))
        else:
            yield (*path, name), info
