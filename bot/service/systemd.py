"""systemd's notify protocol (`Type=notify`), spoken directly over `$NOTIFY_SOCKET`.

`READY=1` once messages are accepted, `STATUS=...` with what the replica is doing,
`WATCHDOG=1` at half of `WatchdogSec=`, `STOPPING=1` on the way out. Without the variable
(not under systemd) every call does nothing.
"""

from __future__ import annotations

import os
import socket


def under_systemd() -> bool:
    """Whether a service manager listens for notifications (systemd `Type=notify`)."""
    return bool(os.environ.get("NOTIFY_SOCKET"))


def notify(state: str) -> bool:
    """Send e.g. "READY=1" to `$NOTIFY_SOCKET`. Returns False when not run under systemd, or
    when the socket is gone (a notification is never worth crashing for)."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        # An abstract socket: the leading "@" stands for a NUL byte.
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.connect(address)
            sock.sendall(state.encode())
    except OSError:
        return False
    return True


def watchdog_interval_s() -> float | None:
    """How often to send WATCHDOG=1 (half of `WatchdogSec=`), or None when systemd does not
    watch this process."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return int(usec) / 1_000_000 / 2
    except ValueError:
        return None
