"""1. The settings: do they load, and what they name (the platform, the store)."""

from __future__ import annotations

from collections.abc import Callable

from pydantic import BaseModel

from bot.config.settings import ConfigError, Settings, displayed
from bot.masking import MASK, store_url
from bot.ops.check import Check
from bot.ops.doctor.llm import llm_url
from bot.store.embedded import store_dir


def check_settings(source: Settings | Callable[[], Settings]) -> tuple[Check, Settings | None]:
    if isinstance(source, Settings):
        settings = source
    else:
        try:
            settings = source()
        except ConfigError as exc:
            # The line names the setting, what was given and what is expected: the fix.
            return Check("settings", False, str(exc)), None
    parts = [_platform_shown(settings), f"store {store_name(settings)}"]
    if settings.llm_provider == "openai":
        origin = settings.key_source
        key = f"key from {origin}" if origin else "no API key set"
        parts.append(f"LLM openai, model {settings.llm.model} at {llm_url(settings)} ({key})")
    else:
        parts.append("LLM echo (offline)")
    replica = getattr(settings, "replica_id", None)
    if replica:
        parts.append(f"replica {replica}")
    return Check("settings", True, ", ".join(parts)), settings


def _platform_shown(settings: Settings) -> str:
    """The platform, with the settings of its own that were given, as an error line would
    quote them (`bot.config.settings.displayed`: a secret as ***, a URL without its credentials)."""
    section = getattr(settings, settings.platform, None)
    if not isinstance(section, BaseModel) or not section.model_fields_set:
        return f"platform {settings.platform}"
    given = [
        f"{name} {displayed((settings.platform, name), getattr(section, name), 80) or MASK}"
        for name in type(section).model_fields
        if name in section.model_fields_set
    ]
    return f"platform {settings.platform} ({', '.join(given)})"


def store_name(settings: Settings) -> str:
    if settings.redis_url:
        return store_url(settings.redis_url)
    return f"embedded in {store_dir(settings)}"
