"""What went wrong, in the user's words: a property an error takes on where it is raised.

A reply that fails every attempt ends in one apology that says what failed ("one of the files
you sent could not be read"). Each area says it of its own errors, at its boundary, with
`blamed`: the first area an error leaves names it, so a transcription's error read while a
file is prepared is the voice note's, not the file's. An error no area claimed is
`SOMETHING` went wrong. Moving a module changes nothing of this.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

FILES = "one of the files you sent could not be read"
VOICE = "a voice note could not be transcribed"
MODEL = "the AI service sent an answer I could not read"
COMMAND = "a command could not be carried out"
SOMETHING = "something went wrong on my side"

# The attribute an error carries its cause in: named for lastword, so no library's is taken.
_ATTRIBUTE = "lastword_cause"


@contextmanager
def blamed(cause: str) -> Iterator[None]:
    """Any error leaving the block is `cause`'s, unless an area within named it first."""
    try:
        yield
    except Exception as exc:
        if not hasattr(exc, _ATTRIBUTE):
            setattr(exc, _ATTRIBUTE, cause)
        raise


def blames(
    cause: str,
) -> Callable[[Callable[P, Coroutine[Any, Any, T]]], Callable[P, Coroutine[Any, Any, T]]]:
    """`blamed`, around every call of a coroutine function: an area's entry point."""

    def wrap(function: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, Coroutine[Any, Any, T]]:
        @functools.wraps(function)
        async def blaming(*args: P.args, **kwargs: P.kwargs) -> T:
            with blamed(cause):
                return await function(*args, **kwargs)

        return blaming

    return wrap


def cause_of(exc: BaseException) -> str:
    """What went wrong, for the user, as the area the error left said it."""
    cause = getattr(exc, _ATTRIBUTE, SOMETHING)
    return cause if isinstance(cause, str) else SOMETHING
