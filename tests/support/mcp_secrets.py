"""Secrets planted in an MCP server's URL, which no output may show."""

from __future__ import annotations

# Distinctive, so that a leak anywhere is found by a plain substring search.
PATH_SECRET = "SECRET-in-path-Jw62bc"


QUERY_SECRET = "SECRET-in-query-Tq09ld"
