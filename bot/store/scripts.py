"""The store's Lua scripts, each one step of the flow.

Every script file next to this module is one step; `prelude.lua` holds their shared helpers
and is loaded in front of each.
"""

from __future__ import annotations

from importlib import resources


def _load(name: str) -> str:
    folder = resources.files(__package__)
    prelude = folder.joinpath("prelude.lua").read_text()
    return prelude + "\n" + folder.joinpath(f"{name}.lua").read_text()


INGEST = _load("ingest")
NOTICE = _load("notice")
ACQUIRE = _load("acquire")
RENEW = _load("renew")
RELEASE = _load("release")
INTERRUPT = _load("interrupt")
USAGE = _load("usage")
PRESEND = _load("presend")
COMMIT = _load("commit")
DUE = _load("due")
ROLE = _load("role")
ROLE_RELEASE = _load("role_release")
HEARTBEAT = _load("heartbeat")
ACCESS_SET = _load("access_set")
ACCESS_COPY = _load("access_copy")
