"""A loopback port nothing listens on, for tests of what a refused connection looks like."""

from __future__ import annotations

import socket


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
