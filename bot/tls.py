"""The TLS context every HTTPS client of a process shares.

Making one loads the whole certificate store (about 30 ms of CPU), and httpx makes one per
client unless it is given one. A replica makes several clients (the model's, the platform's
long poll and downloads, one per MCP server over HTTP), and doctor and the reloads make more.
A context holds only trust settings, and the standard library lets one serve many
connections at once, so the process makes it once."""

from __future__ import annotations

import functools
import ssl

import httpx2


@functools.cache
def client_context() -> ssl.SSLContext:
    """The verifying context httpx would make (certifi's roots, or `SSL_CERT_FILE` and
    `SSL_CERT_DIR` when set), made on first use."""
    return httpx2.create_ssl_context()
