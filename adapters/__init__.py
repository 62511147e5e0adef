"""Chat platforms, as plug-ins: `LASTWORD_PLATFORM` names one by its entry point.

A platform is an object registered in the `lastword.adapters` entry point group (the
built-in console, telegram and discord ones too, in pyproject.toml). Only the picked one is
loaded, so a platform's library is imported only when that platform is used.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pydantic import BaseModel

from adapters.base import Adapter
from bot.config.settings import ConfigError, Settings
from bot.ops.check import Check, PlatformCheck
from bot.plugins import entry_points

GROUP = "lastword.adapters"


@dataclass(frozen=True)
class Platform:
    """What a platform plug-in offers: its adapter, made from the settings, the check
    `lastword doctor` runs on its settings (bounded in time by itself), and the model of its
    own settings, if it has any: the `LASTWORD_<NAME>__*` variables and the `[<name>]` TOML
    table of the name it is registered under, read, checked and masked in logs with the rest
    (`Settings.section` gives them to it)."""

    create: Callable[[Settings], Adapter]
    check: PlatformCheck
    settings: type[BaseModel] | None = None


def installed() -> list[str]:
    """The names `LASTWORD_PLATFORM` may take here."""
    return sorted({entry.name for entry in entry_points(group=GROUP)})


def find(name: str) -> Platform:
    """The platform registered as `name`; a `ConfigError` naming the installed ones if none
    is."""
    found = entry_points(group=GROUP, name=name)
    if not found:
        raise ConfigError(
            f"LASTWORD_PLATFORM: no platform {name!r} is installed "
            f"(installed: {', '.join(installed()) or 'none'})"
        )
    platform = next(iter(found)).load()
    if not isinstance(platform, Platform):
        raise ConfigError(f"LASTWORD_PLATFORM: the {name!r} plug-in is not a lastword Platform")
    return platform


def create(settings: Settings) -> Adapter:
    return find(settings.platform).create(settings)


async def check(settings: Settings, timeout_s: float) -> Check:
    """The configured platform's doctor check; a failed one if it is not installed."""
    try:
        platform = find(settings.platform)
    except ConfigError as exc:
        return Check("platform", False, str(exc), "set LASTWORD_PLATFORM to an installed one")
    return await platform.check(settings, timeout_s)
