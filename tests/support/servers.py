"""One Redis server per pytest worker, lent to one test at a time.

Starting a server for each test cost the suite ~600 server starts. A test that only reads and
writes keys gets the worker's server, flushed. A test that does something to the server itself
(stops or pauses it, changes its configuration or users) needs nothing special: when
it gives the server back, a server that is not the one lent, not answering, or not configured
as it was started is killed, and the next test gets a new one. A test that starts the server
again is marked `fresh_server` instead (tests/conftest.py): a restart replays the append-only
file, which here holds every earlier test's writes.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Literal

from redis import Redis
from redis.exceptions import RedisError

from bot.store.embedded import EmbeddedRedis

# How long a server given back has to answer before it is replaced (a test may leave it
# paused with SIGSTOP, or busy).
ANSWER_S = 2.0


class LentServer:
    """The worker's server: `lend()` before a test, `take_back()` after it."""

    def __init__(self) -> None:
        # Short: the unix socket's path must fit in ~100 bytes.
        self.folder = Path(tempfile.mkdtemp(prefix="lw-w", dir="/tmp"))
        self.started = 0
        self.embedded: EmbeddedRedis | None = None
        self.process: object = None  # the process lent, to tell a restarted server
        self.baseline: tuple[object, object] | None = None

    def lend(self) -> EmbeddedRedis:
        """The worker's server, empty; a new one if there is none or it cannot be flushed."""
        if self.embedded is not None:
            try:
                with self._client() as client:
                    client.flushall()
                return self.embedded
            except RedisError:
                self._discard()
        self.started += 1
        self.embedded = EmbeddedRedis(self.folder / str(self.started))
        self.embedded.start()
        self.process = self.embedded.process
        with self._client() as client:
            self.baseline = self._configuration(client)
        return self.embedded

    def take_back(self) -> Literal["kept", "replaced", "restarted"]:
        """Keep the server for the next test only if it is the one lent, alive and answering,
        with the configuration and users it started with; else it is replaced. "restarted":
        the test started it again (`EmbeddedRedis.start`), as a `fresh_server` test should
        have done with a server of its own."""
        embedded = self.embedded
        if embedded is None:
            return "replaced"
        process = embedded.process
        restarted = process is not None and process is not self.process
        if process is None or restarted or process.poll() is not None:
            self._discard()
            return "restarted" if restarted else "replaced"
        try:
            with self._client() as client:
                same = self._configuration(client) == self.baseline
        except RedisError:
            same = False
        if not same:
            self._discard()
            return "replaced"
        return "kept"

    def close(self) -> None:
        self._discard()
        shutil.rmtree(self.folder, ignore_errors=True)

    def _client(self) -> Redis:
        assert self.embedded is not None
        return Redis(
            unix_socket_path=str(self.embedded.socket),
            socket_timeout=ANSWER_S,
            socket_connect_timeout=ANSWER_S,
        )

    @staticmethod
    def _configuration(client: Redis) -> tuple[object, object]:
        return client.config_get("*"), client.acl_list()

    def _discard(self) -> None:
        """Kill the server (a test's server is never read again) and forget it."""
        if self.embedded is not None:
            self.embedded.kill()
            shutil.rmtree(self.embedded.data_dir, ignore_errors=True)
        self.embedded = None
        self.process = None
