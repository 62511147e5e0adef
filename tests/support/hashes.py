"""Reading a Redis hash's integer fields."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def integers(raw: Mapping[Any, Any]) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in raw.items() if v.lstrip(b"-").isdigit()}
