"""What a `LASTWORD_REDIS_URL` may say: its schemes, and what a Sentinel URL names
(`parse_sentinel`). The settings validate the URL with it before anything connects;
`bot.store.connect` makes the client from it. Its errors never quote the URL, which may
carry a password.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlparse

SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
SCHEMES = ("redis", "rediss", "unix", *SENTINEL_SCHEMES)


@dataclass(frozen=True)
class SentinelTarget:
    """What a `redis+sentinel://` URL names."""

    sentinels: tuple[tuple[str, int], ...]
    master: str
    tls: bool
    # The data nodes' connection options as one server's URL would give them (user,
    # password, db, TLS options...), at a placeholder host: the Sentinels name the primary.
    data_url: str
    # Options for the Sentinels' connections (their own user and password).
    sentinel_options: dict[str, Any]


def parse_sentinel(url: str) -> SentinelTarget:
    """Raises ValueError, without quoting the URL (it may carry a password)."""
    parts = urlparse(url)
    if parts.scheme not in SENTINEL_SCHEMES:
        raise ValueError("must start with redis+sentinel:// or rediss+sentinel://")
    userinfo, _, hostlist = parts.netloc.rpartition("@")
    sentinels: list[tuple[str, int]] = []
    for entry in hostlist.split(","):
        host, colon, port = entry.strip().rpartition(":")
        if not colon:
            host, port = port, "26379"
        host = host.strip("[]")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError("each Sentinel must be host:port, the port a number up to 65535")
        sentinels.append((host, int(port)))
    master = unquote(parts.path.strip("/"))
    if not master or "/" in master:
        raise ValueError("the path must name the primary: redis+sentinel://host:port/<name>")
    tls = parts.scheme == "rediss+sentinel"
    query: dict[str, str] = {}
    for pair in filter(None, parts.query.split("&")):
        name, _, value = pair.partition("=")
        query[name] = value
    sentinel_options: dict[str, Any] = {}
    for name in ("sentinel_username", "sentinel_password"):
        if name in query:
            sentinel_options[name.removeprefix("sentinel_")] = unquote(query.pop(name))
    rest = "&".join(f"{k}={v}" for k, v in query.items())
    plain = f"{'rediss' if tls else 'redis'}://{userinfo + '@' if userinfo else ''}"
    return SentinelTarget(
        tuple(sentinels), master, tls, f"{plain}localhost?{rest}", sentinel_options
    )
