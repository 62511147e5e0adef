"""What a secret looks like, and how text and URLs are shown without one: the one place that
knows it. Log lines (`bot.service.logs`), the lines that end the process, `lastword doctor`,
the settings' errors and the MCP servers' stderr all mask with the same `Scrub`, and show URLs
through `store_url`, `redact` and `masked_url`. Which values are secrets is the settings'
business (`bot.config.secrets`); this module knows only their shapes and names.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from urllib.parse import SplitResult, unquote, urlsplit

# What a secret is replaced with.
MASK = "***"
# A value shorter than this is never masked: it is too short to be a secret, and masking it
# would mangle ordinary text (an empty value would put a mask between every two characters).
MIN_SECRET_CHARS = 4

# An environment variable whose name says it holds a credential.
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|AUTH|CREDENTIAL", re.IGNORECASE)


def maskable(values: Iterable[str]) -> list[str]:
    """The values worth masking, each once, longest first (so a secret that contains another
    is hidden whole): none shorter than `MIN_SECRET_CHARS`."""
    return sorted({v for v in values if len(v) >= MIN_SECRET_CHARS}, key=len, reverse=True)


def secret_env(env: Mapping[str, str]) -> list[str]:
    """The values of an environment whose names say they hold a credential (an API key by
    any name that says so)."""
    return [value for name, value in env.items() if SECRET_NAME.search(name)]


def secret_args(args: Iterable[str]) -> list[str]:
    """The credentials on a command line, as far as their names tell: the value of an
    option that says it is one (`--token X`, `--api-key=X`, `GITHUB_TOKEN=X`), and those of a
    URL given as an argument. (A bare token with no name before it cannot be told apart.)"""
    found: list[str] = []
    named = False
    for arg in args:
        name, equals, value = arg.partition("=")
        if named:
            found.append(arg)
        elif equals and SECRET_NAME.search(name):
            found.append(value)
        found += url_secrets(arg) if "://" in arg else []
        named = arg.startswith("-") and not equals and bool(SECRET_NAME.search(arg))
    return found


def url_secrets(url: str) -> list[str]:
    """A URL's credentials: the password of its user info and the values of its query
    parameters whose names say they are credentials (`?password=`, which redis-py takes,
    `?api_key=`), each as written and percent-decoded (a library may show either)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return []
    userinfo, at, _ = parts.netloc.rpartition("@")
    values = [userinfo.partition(":")[2]] if at else []
    pairs = (pair.partition("=") for pair in parts.query.split("&"))
    values += (value for name, _, value in pairs if SECRET_NAME.search(name))
    return [form for value in values if value for form in (value, unquote(value))]


class Scrub:
    """Replaces secrets in text: those long enough to be secrets (`maskable`), longest
    first, whoever gathered them."""

    def __init__(self, secrets: Iterable[str]) -> None:
        self.secrets = maskable(secrets)

    def __call__(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, MASK)
        return text


def redact(url: str) -> str:
    """A web URL (an API's, the LLM's) fit for logs and error messages: its password and the
    query values named as credentials (`?password=`, `?api_key=`) shown as `***`, and its
    path too when the URL cannot be read as written (`_split`). Works on the raw text, so it
    cannot fail on a malformed URL."""
    split = _split(url)
    if split is None:
        return _scheme(url) + MASK
    parts, clear = split
    query = "&".join(
        f"{name}={MASK}" if equals and SECRET_NAME.search(name) else f"{name}{equals}{value}"
        for name, equals, value in (pair.partition("=") for pair in parts.query.split("&"))
    )
    userinfo, at, _ = parts.netloc.rpartition("@")
    user = userinfo.partition(":")[0] + ":" + MASK if ":" in userinfo else userinfo
    shown = f"{parts.scheme}://{user}{at}{_hosts(parts.netloc)}"
    if not clear:
        return f"{shown}/{MASK}"
    return shown + parts.path + (f"?{query}" if parts.query else "")


def store_url(url: str) -> str:
    """A store's URL (`LASTWORD_REDIS_URL`) as logs, errors, doctor and status show it: its
    scheme, host(s) and port(s), and which database (its number, the primary a Sentinel URL
    names, a socket's path). User info is `***`; the rest (a `?password=`, TLS options) is
    left out. Works on the raw text, so it cannot fail."""
    split = _split(url)
    if split is None or not split[1]:
        # An '@' after the host: the password's tail, once misread, could be anywhere.
        return _scheme(url) + MASK
    parts = split[0]
    _, at, _ = parts.netloc.rpartition("@")
    path = parts.path if re.fullmatch(r"[\w./~+-]*", parts.path) else "/" + MASK
    db = [
        value
        for name, _, value in (pair.partition("=") for pair in parts.query.split("&"))
        if name == "db" and value.isdigit()
    ]
    return f"{parts.scheme}://{MASK + at if at else ''}{_hosts(parts.netloc)}{path}" + (
        f"?db={db[0]}" if db else ""
    )


def masked_url(url: str) -> str:
    """The URL as scheme, host and port only, for a URL whose every other part may be a
    credential (an MCP server's `?api_key=…` or `/s/<secret>/`): user info, path, query and
    fragment are each shown as `***` when present. Works on the raw text, so it cannot fail."""
    split = _split(url)
    if split is None:
        return _scheme(url) + MASK
    parts = split[0]
    _, at, _ = parts.netloc.rpartition("@")
    shown = f"{parts.scheme}://{MASK + at if at else ''}{_hosts(parts.netloc)}"
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        return f"{shown}/{MASK}"
    return shown + parts.path


def _split(url: str) -> tuple[SplitResult, bool] | None:
    """The URL's parts, and whether they are clear: no '@' after the host. A password holding
    an unencoded /, ?, # or @ leaves its tail past the host, where any part may be the
    password's, and the user info before it is then read as the host (`_hosts` masks a port
    that is no number). None for text that is no URL (`scheme://` first), or one whose
    brackets are left open."""
    if not _scheme(url):
        return None
    try:
        parts = urlsplit(url)
    except ValueError:
        return None
    return parts, "@" not in parts.path + parts.query + parts.fragment


def _scheme(url: str) -> str:
    """The URL's `scheme://`, empty for text that does not start with one."""
    scheme, sep, _ = url.partition("://")
    return scheme + sep if re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*", scheme) and sep else ""


def _hosts(netloc: str) -> str:
    """The host(s) and port(s) of a URL's authority, user info left out: a host or port that
    cannot be one (the tail of a password misread as `host:port`) shown as `***`."""
    shown = []
    for hostport in netloc.rpartition("@")[2].split(","):
        host, colon, port = hostport.rpartition(":")
        if not colon or (host.startswith("[") and not host.endswith("]")):
            host, colon, port = hostport, "", ""
        host = host if re.fullmatch(r"\[[0-9A-Fa-f:.]*\]|[\w.-]*", host) else MASK
        shown.append(host + colon + (port if port.isdigit() or not colon else MASK))
    return ",".join(shown)
