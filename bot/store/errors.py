"""How the store's failures are told apart: what is worth a retry (`StoreUnavailable`), and
what is a bug or a misconfiguration that propagates as it is."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager

from redis.exceptions import (
    AskError,
    ClusterDownError,
    ClusterError,
    MasterDownError,
    MovedError,
    ReadOnlyError,
    RedisClusterException,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from bot.message import Unavailable


class StoreUnavailable(Unavailable):
    """Redis cannot be reached, or refuses for now (out of memory, loading, read-only after a
    failover...). Try again later."""

    def __init__(self, reason: str, *, reconnect: bool = False) -> None:
        super().__init__(reason)
        # The connections point at a node that no longer serves us (a demoted primary, a
        # moved slot): drop them so the next attempt resolves the right one.
        self.reconnect = reconnect


# Error replies that say "not now" rather than "never": the first word of the reply.
# OOM: at maxmemory with noeviction (writes refused until memory is freed); BUSY: a script or
# function runs too long; LOADING: the dataset is being loaded after a restart; MASTERDOWN,
# TRYAGAIN, CLUSTERDOWN: a failover or resharding is under way; NOSCRIPT: an empty script
# cache after a restart (scripts are reloaded on the next attempt); NOREPLICAS: writes refused
# by `min-replicas-to-write` until a replica is back in touch; MISCONF: writes refused after a
# failed background save, until one succeeds; UNBLOCKED: an operator's CLIENT UNBLOCK ended a
# wait of ours (the durability level's WAIT). Not here, as no retry outlives them: ACL and
# auth refusals (NOPERM, NOAUTH, WRONGPASS), wrong types and script bugs (ERR, WRONGTYPE).
TRANSIENT_REPLIES = frozenset(
    {
        "OOM",
        "BUSY",
        "LOADING",
        "MASTERDOWN",
        "TRYAGAIN",
        "CLUSTERDOWN",
        "NOSCRIPT",
        "NOREPLICAS",
        "MISCONF",
        "UNBLOCKED",
    }
)
# These mean the connection talks to the wrong node: a replica after a failover (READONLY),
# or a cluster node that does not own the slot, seen by a plain client (MOVED, ASK).
WRONG_NODE_REPLIES = frozenset({"READONLY", "MOVED", "ASK"})


# The cluster client's own words for a cluster it cannot use for now (its slot map could not
# be loaded: no node answers, slots uncovered mid-failover, nodes disagree mid-resharding).
CLUSTER_UNREACHABLE = (
    "Redis Cluster cannot be connected",
    "All slots are not covered",
    "startup_nodes could not agree",
)


def classify(exc: ResponseError) -> StoreUnavailable | None:
    """The retryable `StoreUnavailable` for an error reply that is transient, else None (a
    bug or a misconfiguration: the caller lets it propagate, and it is logged as an error).
    An error raised inside a script keeps its code, so this works for scripts too."""
    text = str(exc).strip()
    # redis-py strips the codes it knows from the message and keeps them here, or says
    # which it was by the exception's class (the cluster's errors).
    code = getattr(exc, "status_code", None) or text.split(" ", 1)[0]
    if code == "ERR":
        # Before Redis 7 a refused command inside a script came back as a script error,
        # "ERR Error running script (call to f_...): @user_script:9: -NOREPLICAS ...".
        code = _refused_in_script(text) or code
    if isinstance(exc, ReadOnlyError):
        code = "READONLY"
    elif isinstance(exc, AskError):
        code = "MOVED" if isinstance(exc, MovedError) else "ASK"
    elif isinstance(exc, ClusterDownError):
        code = "MASTERDOWN" if isinstance(exc, MasterDownError) else "CLUSTERDOWN"
    elif isinstance(exc, TryAgainError):
        code = "TRYAGAIN"
    if code == "READONLY":
        return StoreUnavailable(
            f"Redis is read-only (a replica after a failover?): {text}", reconnect=True
        )
    if code in WRONG_NODE_REPLIES:
        return StoreUnavailable(f"Redis answered {code}: {text}", reconnect=True)
    if code in TRANSIENT_REPLIES:
        return StoreUnavailable(f"Redis answered {code}: {text}")
    return None


# In an old server's script error: the code of the reply that a call inside the script got.
_SCRIPT_CALL_REPLY = re.compile(r"@user_script: ?\d+: -?([A-Z]+) ")


def _refused_in_script(text: str) -> str | None:
    """The code of a refusal the script met, if `text` is an old server's script error."""
    if not text.startswith("Error running script"):
        return None
    found = _SCRIPT_CALL_REPLY.findall(text)
    return found[-1] if found else None


def _raised_in_redis_py(exc: BaseException) -> bool:
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and f"{os.sep}redis{os.sep}" in tb.tb_frame.f_code.co_filename


@contextmanager
def reaching_redis() -> Iterator[None]:
    """Turn the client's connection errors and transient error replies into
    `StoreUnavailable`, which callers handle; other errors propagate as they are."""
    try:
        yield
    except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
        # Sentinel's client says so when the primary it used answers READONLY: demoted.
        demoted = "previous master is now a slave" in str(exc)
        why = str(exc) or type(exc).__name__  # MaxConnectionsError has no text
        raise StoreUnavailable(f"Redis is unreachable: {why}", reconnect=demoted) from exc
    except AttributeError as exc:
        # redis-py's cluster client closes every connection when one call fails to connect;
        # a call in flight on another connection then fails inside the library like this.
        # Only from inside the library: one of ours is a bug, and propagates.
        if not _raised_in_redis_py(exc):
            raise
        raise StoreUnavailable(f"the Redis client dropped its connection: {exc}") from exc
    except ResponseError as exc:
        unavailable = classify(exc)
        if unavailable is None:
            raise
        raise unavailable from exc
    except ClusterError as exc:
        # Redirections or CLUSTERDOWN on every retry the cluster client made.
        raise StoreUnavailable(f"Redis Cluster is not usable now: {exc}") from exc
    except RedisClusterException as exc:
        # Others of these are bugs (keys of several slots in one call): they propagate.
        if isinstance(exc, SlotNotCoveredError) or str(exc).startswith(CLUSTER_UNREACHABLE):
            raise StoreUnavailable(
                f"Redis Cluster is not usable now: {exc}", reconnect=True
            ) from exc
        raise
