"""The settings' secrets: every value of a settings tree that no log line, error or doctor
report may show, gathered for `bot.masking.Scrub`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from pydantic import BaseModel, SecretStr

from bot.masking import SECRET_NAME, maskable, secret_args, secret_env, url_secrets

if TYPE_CHECKING:
    from bot.config.settings import McpServer, Settings


def secrets_of(settings: Settings) -> list[str]:
    """The values that must never appear in a log line, an error message or a doctor report:
    every secret setting of the whole tree (a platform's own too, whatever it names them),
    the credentials of every URL in it (the Redis password, in its user info or its query),
    every value under a name that says it is a credential (`extra_body`'s `api_key`), the
    LLM's header values and each MCP server's (`server_secrets`)."""
    values = list(_secret_values(settings))
    # Headers sent to the LLM may carry credentials of their own (an Authorization header).
    values += settings.llm.extra_headers.values()
    for server in settings.tools.mcp_servers.values():
        values += server_secrets(server)
    return maskable(values)


def server_secrets(server: McpServer) -> list[str]:
    """An MCP server's values that no log line may show: its headers, its environment's
    credentials, the credentials among its arguments (`secret_args`), and of its URL the whole
    text (an MCP URL often carries its credential in its path or query: the HTTP library logs
    every request's URL) and its credentials (`url_secrets`)."""
    values = [*server.headers.values(), *secret_env(server.env), *secret_args(server.args)]
    if server.url is not None:
        values += [str(server.url), *url_secrets(str(server.url))]
    return values


def _secret_values(node: object, name: str = "") -> Iterator[str]:
    """Every secret in a settings tree, in its models, lists and mappings: each `SecretStr`,
    the credentials of each URL, and each text under a name (a field's or a key's) that says
    it is a credential."""
    if isinstance(node, SecretStr):
        yield node.get_secret_value()
    elif isinstance(node, str):
        if SECRET_NAME.search(name):
            yield node
        if "://" in node:
            yield from url_secrets(node)
    elif isinstance(node, BaseModel):
        for field in type(node).model_fields:
            yield from _secret_values(getattr(node, field), field)
    elif isinstance(node, dict):
        for key, value in node.items():
            yield from _secret_values(value, str(key))
    elif isinstance(node, list | tuple):
        for value in node:
            yield from _secret_values(value, name)
