"""Replica processes on a cluster or Sentinel store, and when they answered again after a kill."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from bot.store.embedded import EmbeddedRedis
from tests.support.fakes.openai_server import FakeOpenAI
from tests.support.replica_fleet import Cluster as Bots


@dataclass(frozen=True)
class At:
    """What the replica harness reads of its server: the URL the bots are given."""

    url: str


def bots(
    url: str, fake: FakeOpenAI, workdir: Path, env: dict[str, str] | None = None, size: int = 3
) -> Bots:
    """Replica processes (tests/support/replica.py) on the store `url` names: a cluster node or a
    `redis+sentinel://` URL works as well as one server."""
    return Bots(cast(EmbeddedRedis, At(url)), fake, workdir, size=size, env=env)


def first_reply_after(replicas: Bots, t: float, conversations: Iterable[str]) -> float | None:
    """Seconds from `t` to the first reply sent after it in one of `conversations`."""
    names = set(conversations)
    times = [float(e["t"]) for e in replicas.sent() if e["conversation"] in names]
    later = [x for x in times if x > t]
    return min(later) - t if later else None
