"""5. The model: does the endpoint answer, know the model and take the key; a base URL without
its API prefix named as such.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from bot.config.settings import Settings
from bot.llm.openai import failure_of, openai_client
from bot.masking import redact
from bot.ops.check import Check, guarded

if TYPE_CHECKING:
    import openai


# Base URLs as OpenAI-compatible servers want them: the API's root, its prefix included.
BASE_URL_EXAMPLES = (
    "OpenAI https://api.openai.com/v1, Ollama http://localhost:11434/v1, "
    "LM Studio http://localhost:1234/v1, OpenRouter https://openrouter.ai/api/v1"
)


# The prefix most OpenAI-compatible servers serve their API under.
API_PREFIX = "/v1"


def llm_url(settings: Settings) -> str:
    return redact(settings.llm.base_url or "https://api.openai.com/v1")


def llm_client(settings: Settings, timeout_s: float) -> openai.AsyncOpenAI:
    """The client the bot makes of the LLM endpoint (`bot.llm.openai.openai_client`), with no
    retries: doctor reports what it finds at once."""
    llm = settings.llm
    return openai_client(llm.base_url, llm.api_key, timeout_s, headers=llm.extra_headers)


async def llm_check(settings: Settings, timeout_s: float) -> Check:
    """Does the endpoint answer, and know the model? The library is loaded before the clock
    starts: importing it takes a loaded machine seconds, which are not the endpoint's silence."""
    if settings.llm_provider == "echo":
        return Check("llm", True, "offline echo model")
    importlib.import_module("openai")
    silent = Check(
        "llm",
        False,
        f"no answer within {timeout_s:g} s from {llm_url(settings)}",
        f"check {settings.base_url_source} and that the server is up",
    )
    return await guarded(_llm_answer(settings, timeout_s), timeout_s, silent)


async def _llm_answer(settings: Settings, timeout_s: float) -> Check:
    import openai

    llm = settings.llm
    shown = llm_url(settings)
    client = llm_client(settings, timeout_s)
    try:
        listed = await _models_listed(client, settings)
    except openai.NotFoundError as exc:
        return await _not_found(client, exc, settings)
    except openai.APIError as exc:
        return _llm_failure(exc, settings, timeout_s)
    finally:
        await client.close()
    if listed is None:
        return Check("llm", True, f"model {llm.model} answered at {shown} (no /models)")
    if llm.model not in listed:
        shown_models = ", ".join(listed[:10]) + (", ..." if len(listed) > 10 else "")
        return Check(
            "llm",
            False,
            f"model {llm.model} is not listed at {shown} (it has: {shown_models or 'none'})",
            "set LASTWORD_LLM__MODEL to one of the listed models",
        )
    return Check("llm", True, f"model {llm.model} is listed at {shown}")


async def _models_listed(client: openai.AsyncOpenAI, settings: Settings) -> list[str] | None:
    """The models the endpoint lists; None when it has no /models but the model answered a
    one-token request instead (not every OpenAI-compatible server has /models)."""
    import openai

    llm = settings.llm
    try:
        page = await client.models.list()
    except openai.NotFoundError:
        await client.chat.completions.create(
            model=llm.model,
            messages=[{"role": "user", "content": "ping"}],
            max_tokens=1,
            extra_body=llm.extra_body or None,
        )
        return None
    return sorted(model.id for model in page.data)


async def _not_found(
    client: openai.AsyncOpenAI, exc: openai.NotFoundError, settings: Settings
) -> Check:
    """/models and the one-token chat request both answered 404. A 404 that speaks of the
    model is about the model; otherwise the base URL is the likelier culprit, most often
    written without its API prefix (Ollama's `http://localhost:11434`, whose API is under
    `/v1`): said so for sure when the prefixed URL answers /models."""
    import openai

    from bot.llm.openai import provider_words

    llm, shown, source = settings.llm, llm_url(settings), settings.base_url_source
    said = provider_words(exc)
    if exc.code == "model_not_found" or "model" in said.lower():
        return Check(
            "llm",
            False,
            f"{shown} does not know model {llm.model}",
            "set LASTWORD_LLM__MODEL to a model the provider serves",
        )
    examples = f"the API's root, its prefix included: {BASE_URL_EXAMPLES}"
    base = str(client.base_url).rstrip("/")
    if not base.endswith(API_PREFIX):
        try:
            await client.with_options(base_url=base + API_PREFIX).models.list()
        except openai.APIError:
            pass
        else:
            return Check(
                "llm",
                False,
                f"{shown} answers 404 to /models and /chat/completions, and "
                f"{redact(base + API_PREFIX)} answers: the base URL lacks its API prefix "
                f"{API_PREFIX}",
                f"set {source} to {redact(base + API_PREFIX)} ({examples})",
            )
    if not urlsplit(base).path.strip("/"):
        return Check(
            "llm",
            False,
            f"{shown} answers 404 to /models and /chat/completions: the base URL has no API "
            f"prefix (OpenAI-compatible servers serve theirs under one, most under "
            f"{API_PREFIX})",
            f"set {source} to {examples}",
        )
    return Check(
        "llm",
        False,
        f"{shown} answers 404 to /models and to a chat request for model {llm.model}: the "
        "base URL's path or the model is wrong",
        f"check {source} ({examples}) and LASTWORD_LLM__MODEL",
    )


def _llm_failure(exc: Exception, settings: Settings, timeout_s: float) -> Check:
    """What the endpoint's refusal or silence means, and what to fix: the provider's error
    read as the bot reads it (`bot.llm.openai.failure_of`), said for an operator."""
    import openai

    llm, shown = settings.llm, llm_url(settings)
    failure = failure_of(exc)
    if failure == "key":
        if llm.api_key is None:
            return Check(
                "llm",
                False,
                f"{shown} wants an API key, and none is set",
                "set LASTWORD_LLM__API_KEY (or OPENAI_API_KEY)",
            )
        return Check("llm", False, f"{shown} refused the API key", f"fix {settings.key_source}")
    found: tuple[str, str]
    if failure == "access":
        found = (
            f"{shown} refused the API key access (403)",
            f"fix {settings.key_source}, or its permissions at the provider",
        )
    elif failure == "timeout":
        found = (
            f"no answer within {timeout_s:g} s from {shown}",
            f"check {settings.base_url_source} and that the server is up",
        )
    elif failure == "unreachable":
        found = (
            f"cannot connect to {shown}",
            f"fix {settings.base_url_source}, or start the server it names",
        )
    elif isinstance(exc, openai.APIStatusError):
        found = (
            f"{shown} answered {exc.status_code}: {exc.message[:200]}",
            f"check {settings.base_url_source} and LASTWORD_LLM__MODEL",
        )
    else:
        found = (f"{shown}: {type(exc).__name__}", f"check {settings.base_url_source}")
    return Check("llm", False, *found)
