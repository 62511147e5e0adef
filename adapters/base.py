"""The interface every platform adapter implements.

An adapter turns platform events into `InboundMessage`s and hands them to a `Sink` (the
core's runtime), acknowledging the platform only once `ingest` has returned. It sends what
the core asks through the `Outbound` methods. It never touches the store.
"""

from __future__ import annotations

from typing import Protocol

from bot.message import InboundMessage, Outbound


class Sink(Protocol):
    async def ingest(self, message: InboundMessage) -> bool: ...

    async def settled(self, conversation: str) -> None: ...


class Adapter(Outbound, Protocol):
    platform: str

    async def run(self, sink: Sink) -> None:
        """Receive until the platform's input ends (or the task is cancelled on shutdown)."""
