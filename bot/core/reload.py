"""A reload (SIGHUP): which of the new settings a running replica takes on at once, and which
wait for a restart because they name what it is connected to (`reloaded`).
"""

from __future__ import annotations

from typing import Any

from bot.config.settings import PLATFORM_SECTIONS, Settings

# What a reload cannot change: these name what a running replica is connected to, so they
# are kept as they were until a restart. Everything else is taken on at once (`reloaded`).
RESTART_ONLY = (
    "platform",
    "redis_url",
    "data_dir",
    *PLATFORM_SECTIONS,
    "replica_id",
    "metrics_listen",
    "log_format",
    "sweep_interval_ms",
    # Checked against the server once, at start-up.
    "durability",
)
# Settings of a client built once at start-up (the LLM's, the transcription's).
CLIENT_FIXED = (
    "llm.provider",
    "llm.base_url",
    "llm.api_key",
    "llm.timeout_s",
    "llm.interrupt_poll_ms",
    "media.transcription_base_url",
    "media.transcription_api_key",
    # Started once per replica, their tools listed then.
    "tools.mcp_servers",
)


def reloaded(old: Settings, new: Settings) -> tuple[Settings, list[str], list[str]]:
    """What a running replica takes on from `new`: `new` with the settings that need a
    restart kept from `old`. Also the names of the settings that changed and are applied,
    and of those that changed but need a restart (platform, store, credentials, addresses)."""
    changed = _changed(old.model_dump(), new.model_dump())
    fixed = [name for name in changed if name.split(".")[0] in RESTART_ONLY or name in CLIENT_FIXED]
    keep: dict[str, Any] = {name: getattr(old, name) for name in RESTART_ONLY}
    for group in {name.split(".")[0] for name in CLIENT_FIXED}:
        leaves = [name.split(".")[1] for name in CLIENT_FIXED if name.startswith(group + ".")]
        kept = {leaf: getattr(getattr(old, group), leaf) for leaf in leaves}
        keep[group] = getattr(new, group).model_copy(update=kept)
    applied = [name for name in changed if name not in fixed]
    return new.model_copy(update=keep), applied, fixed


def _changed(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted names of the settings that differ."""
    names: list[str] = []
    for key in sorted(old.keys() | new.keys()):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            names += _changed(a, b, f"{prefix}{key}.")
        elif a != b:
            names.append(prefix + key)
    return names
