"""Real Redis Cluster and Sentinel topologies for the tests, made of redis-server processes of
the test session's own on free loopback ports.

Every wait polls (never a fixed sleep) under one generous deadline, ``TIMEOUT``, so that a
loaded two-core machine is slow but not flaky. Processes are stopped by PID in ``stop()``,
which ``atexit`` also calls in case a session ends without its fixture teardown.

Resharding uses the migration protocol itself (``CLUSTER SETSLOT IMPORTING/MIGRATING``,
``GETKEYSINSLOT`` + ``MIGRATE``, ``SETSLOT NODE``) rather than ``redis-cli --cluster reshard``:
the latter picks the slots itself (it takes a count, not slot numbers) and stops at the first
``BUSYKEY``, while a test needs to move one known slot while clients write to it.
"""

from __future__ import annotations

import atexit
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import redis
import redis.sentinel
from redis.crc import key_slot

from tests.conftest import _free_port

#: The longest any wait here lasts (a startup, a failover, a migration), in seconds.
TIMEOUT = 60.0
HOST = "127.0.0.1"
#: A cluster node's bus listens on its port plus this.
BUS_OFFSET = 10000
SLOTS = 16384

T = TypeVar("T")
Address = tuple[str, int]


def poll(check: Callable[[], T | None], what: str, timeout: float = TIMEOUT) -> T:
    """Call ``check`` until it returns something truthy, and return that; a Redis error counts
    as not yet. ``TimeoutError`` naming ``what`` (and the last error) after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while True:
        try:
            result = check()
            if result:
                return result
        except redis.RedisError as exc:
            last = exc
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"waited {timeout:.0f} s for {what}" + (f" (last error: {last!r})" if last else "")
            )
        time.sleep(0.05)


def _port_pair_free(port: int) -> bool:
    """Whether the cluster bus port of ``port`` (a free one) can be bound now."""
    if port + BUS_OFFSET > 65535:
        return False
    with socket.socket() as sock:
        try:
            sock.bind((HOST, port + BUS_OFFSET))
        except OSError:
            return False
    return True


def _free_cluster_port() -> int:
    """A free port whose bus port (port + 10000) is free too."""

    def pair() -> int | None:
        port = _free_port()
        return port if _port_pair_free(port) else None

    return poll(pair, "a free port pair")


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def start_redis(
    args: list[str], port: int, log: Path, *, password: str | None = None
) -> subprocess.Popen[bytes]:
    """Start ``redis-server args`` and wait until it answers PING on ``port``.

    Unlike ``tests.conftest._wait_for`` this notices the process exiting (typically: the
    port was taken since it was found free) and raises ``OSError`` with its log at once,
    so that the caller can retry on another port.
    """
    process = subprocess.Popen(
        [shutil.which("redis-server") or "redis-server", *args, "--logfile", str(log)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    client = redis.Redis(host=HOST, port=port, password=password, socket_timeout=5)

    def up() -> bool:
        if process.poll() is not None:
            raise OSError(f"redis-server on port {port} exited with {process.returncode}:\n{_tail(log)}")
        return bool(client.ping())

    try:
        poll(up, f"redis-server on port {port}")
    except BaseException:
        stop_process(process)
        raise
    finally:
        client.close()
    return process


def on_free_port(spawn: Callable[[int], None], find: Callable[[], int] = _free_port) -> int:
    """Call ``spawn`` with a port from ``find`` until it starts (another process may take a
    port between our finding it free and redis-server binding it); the port."""
    for _attempt in range(4):
        port = find()
        try:
            spawn(port)
            return port
        except OSError:
            continue
    port = find()
    spawn(port)
    return port


def stop_process(process: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    """Send ``sig`` to ``process`` (SIGKILL if it has not exited 10 s later) and reap it."""
    if process.poll() is None:
        process.send_signal(sig)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class ClusterServers:
    """A Redis Cluster of ``primaries`` masters with ``replicas`` replicas each, every node
    a redis-server of our own; ``url`` is a startup node for ``RedisCluster.from_url``.

    A node that is killed stays dead (``processes[port]`` has exited) until ``restart`` or
    ``heal`` brings it back, as a replica of whichever node took its slots over.
    """

    def __init__(self, *, primaries: int = 3, replicas: int = 1, node_timeout_ms: int = 3000) -> None:
        self.primary_count = primaries
        self.replicas = replicas
        # A short node timeout makes failure detection, and so failover, take about a second.
        self.node_timeout_ms = node_timeout_ms
        self.dir = Path(tempfile.mkdtemp(prefix="pm-redis-cluster-"))
        self.ports: list[int] = []
        self.processes: dict[int, subprocess.Popen[bytes]] = {}
        self.url = ""

    # -- processes -----------------------------------------------------------------------

    def _spawn(self, port: int) -> None:
        args = [
            "--port", str(port), "--bind", HOST, "--cluster-enabled", "yes",
            "--cluster-config-file", str(self.dir / f"nodes-{port}.conf"),
            "--cluster-node-timeout", str(self.node_timeout_ms),
            "--save", "", "--appendonly", "no", "--dir", str(self.dir),
        ]  # fmt: skip
        self.processes[port] = start_redis(args, port, self.dir / f"node-{port}.log")

    def start(self) -> None:
        """Start the nodes, create the cluster with redis-cli, and wait until it is ok."""
        atexit.register(self.stop)
        for _ in range(self.primary_count * (1 + self.replicas)):
            self.ports.append(on_free_port(self._spawn, _free_cluster_port))
        self.url = f"redis://{HOST}:{self.ports[0]}/0"
        create = subprocess.run(
            [
                shutil.which("redis-cli") or "redis-cli",
                "--cluster",
                "create",
                *(f"{HOST}:{port}" for port in self.ports),
                "--cluster-replicas",
                str(self.replicas),
                "--cluster-yes",
            ],
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
        if create.returncode:
            raise RuntimeError(f"redis-cli --cluster create failed:\n{create.stdout}{create.stderr}")
        self.wait_ok()

    def stop(self) -> None:
        """Stop every node by PID and remove the cluster's folder. Idempotent."""
        for process in self.processes.values():
            stop_process(process)
        self.processes.clear()
        shutil.rmtree(self.dir, ignore_errors=True)
        atexit.unregister(self.stop)

    def alive(self) -> list[int]:
        """Ports of the nodes whose process runs."""
        return [port for port, process in self.processes.items() if process.poll() is None]

    def node(self, port: int) -> redis.Redis:
        """A plain client on one node (close it when done)."""
        return redis.Redis(host=HOST, port=port, socket_timeout=10, decode_responses=True)

    def _ask(self, port: int, *command: Any) -> Any:
        with self.node(port) as client:
            return client.execute_command(*command)

    def kill(self, port: int) -> None:
        """SIGKILL one node: a crash, not a shutdown."""
        stop_process(self.processes[port], signal.SIGKILL)

    def restart(self, port: int, *, timeout: float = TIMEOUT) -> None:
        """Start a killed node again on its port and nodes file; it rejoins (as a replica if
        its slots were failed over) and the cluster is waited for until ok."""
        if self.processes[port].poll() is None:
            raise RuntimeError(f"node {port} is running")
        self._spawn(port)
        self.wait_ok(timeout)

    def heal(self, *, timeout: float = TIMEOUT) -> None:
        """Restart every killed node and wait until the cluster is ok."""
        for port in self.ports:
            if self.processes[port].poll() is not None:
                self._spawn(port)
        self.wait_ok(timeout)

    # -- topology ------------------------------------------------------------------------

    def nodes(self, port: int | None = None) -> dict[str, dict[str, Any]]:
        """``CLUSTER NODES`` as seen by ``port`` (or the first live node), by "host:port"."""
        return self._ask(port or self.alive()[0], "CLUSTER NODES")

    def slot_owners(self, port: int) -> dict[int, int]:
        """Slot -> port of its master, as ``port`` sees it (``CLUSTER SLOTS``)."""
        owners: dict[int, int] = {}
        for start, end, master, *_replicas in self._ask(port, "CLUSTER SLOTS"):
            owners.update(dict.fromkeys(range(start, end + 1), int(master[1])))
        return owners

    def primaries(self) -> list[Address]:
        """The (host, port) of every master that serves slots, as the first live node sees it."""
        return sorted(
            (address.rsplit(":", 1)[0], int(address.rsplit(":", 1)[1]))
            for address, node in self.nodes().items()
            if "master" in node["flags"] and "fail" not in node["flags"] and node["slots"]
        )

    def primary_for_slot(self, slot: int) -> Address:
        return HOST, self.slot_owners(self.alive()[0])[slot]

    def primary_for_key(self, key: str | bytes) -> Address:
        """The (host, port) of the master holding ``key``'s slot."""
        return self.primary_for_slot(key_slot(key.encode() if isinstance(key, str) else key))

    def node_id(self, port: int) -> str:
        return self._ask(port, "CLUSTER MYID")

    def _healthy(self) -> bool:
        """Every live node says ok with all slots served, all agree on who serves each slot
        and it is a live node, and every live node without slots is a connected replica."""
        alive = self.alive()
        views = []
        for port in alive:
            with self.node(port) as client:
                info = client.execute_command("CLUSTER INFO")
                if info["cluster_state"] != "ok" or int(info["cluster_slots_ok"]) != SLOTS:
                    return False
                role = client.execute_command("ROLE")
            owners = self.slot_owners(port)
            if role[0] == "slave" and role[3] != "connected":
                return False
            if role[0] == "master" and port not in owners.values():
                return False
            views.append(owners)
        first = views[0]
        return all(view == first for view in views) and set(first.values()) <= set(alive)

    def wait_ok(self, timeout: float = TIMEOUT) -> None:
        """Wait until the live nodes form a healthy cluster (see ``_healthy``)."""
        poll(self._healthy, "the cluster to be ok", timeout)

    def failover_kill_primary(self, port: int, *, timeout: float = TIMEOUT) -> Address:
        """Kill the master on ``port``, wait until one of its replicas has taken its slots over
        and the surviving nodes are ok; the new master's (host, port)."""
        slots = [slot for slot, owner in self.slot_owners(port).items() if owner == port]
        if not slots:
            raise ValueError(f"node {port} serves no slots")
        self.kill(port)
        self.wait_ok(timeout)
        return self.primary_for_slot(slots[0])

    def manual_failover(self, port: int, *, timeout: float = TIMEOUT) -> None:
        """``CLUSTER FAILOVER`` on the replica on ``port``; wait until its master has become
        its replica (the cluster took the new configuration, not only the replica).

        The command is asked again whenever the replica's log says an attempt came to
        nothing, as Redis does not retry it: the replica has 5 s (``CLUSTER_MF_TIMEOUT``) to
        catch up with its paused master and win the election, which a loaded machine can
        miss ("Manual failover timed out"); and a replica that won an election less than
        4 node timeouts ago (a failover back and forth) reuses that election's votes and
        epoch, now too old: the cluster overrules it at once ("Reconfiguring myself as a
        replica"), and the next attempt, once that election is over, holds a new one."""
        log = self.dir / f"node-{port}.log"

        def attempts_ended() -> tuple[int, int]:
            text = log.read_text(errors="replace")
            return text.count("Manual failover timed out"), text.count("Reconfiguring myself as a replica")

        deadline = time.monotonic() + timeout
        with self.node(port) as node, self.node(node.execute_command("ROLE")[2]) as master:

            def taken_over() -> bool:
                role = master.execute_command("ROLE")
                return role[0] == "slave" and int(role[2]) == port

            def ready() -> bool:
                return taken_over() or node.info("replication").get("master_link_status") == "up"

            while not taken_over():
                poll(ready, f"the replica on {port} to be linked to its master", deadline - time.monotonic())
                before = attempts_ended()
                try:
                    node.execute_command("CLUSTER FAILOVER")
                except redis.ResponseError as exc:  # promoted meanwhile, or its master not reachable yet
                    if time.monotonic() > deadline:
                        raise TimeoutError(
                            f"waited {timeout:.0f} s for the replica on {port} to take over"
                        ) from exc
                    time.sleep(0.05)
                    continue
                try:
                    poll(
                        lambda before=before: taken_over() or attempts_ended() != before,
                        f"the replica on {port} to take over",
                        deadline - time.monotonic(),
                    )
                except TimeoutError as exc:
                    raise TimeoutError(f"{exc}; its log ends:\n{_tail(log, 40)}") from None

    def add_primary(self) -> int:
        """Start a node and join it to the cluster as a master without slots (give it some
        with ``migrate_slots``, before ``wait_ok``, which wants every master to serve some);
        its port."""
        port = on_free_port(self._spawn, _free_cluster_port)
        self.ports.append(port)
        self._ask(self.alive()[0], "CLUSTER MEET", HOST, port)
        everyone = {f"{HOST}:{node}" for node in self.alive()}
        poll(
            lambda: all(everyone <= set(self.nodes(node)) for node in self.alive()),
            f"every node to know {port}",
        )
        poll(lambda: self._ask(port, "CLUSTER INFO")["cluster_state"] == "ok", f"{port} to know every slot")
        return port

    # -- data ----------------------------------------------------------------------------

    def flush(self) -> None:
        """FLUSHALL on every master (replicas follow)."""
        for _host, port in self.primaries():
            self._ask(port, "FLUSHALL")

    def migrate_slots(
        self, slots: Iterable[int], source_port: int, target_port: int, *, batch: int = 100
    ) -> int:
        """Move ``slots`` from the master on ``source_port`` to the one on ``target_port`` by
        the cluster's migration protocol, which clients may keep writing through (they get
        ASK, then MOVED); the number of keys moved. Waits until every node agrees."""
        source_id, target_id = self.node_id(source_port), self.node_id(target_port)
        moved = 0
        with self.node(source_port) as source, self.node(target_port) as target:
            for slot in slots:
                target.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", source_id)
                source.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", target_id)
                # A key created meanwhile goes to the target (ASK), so the slot only empties.
                while keys := source.execute_command("CLUSTER GETKEYSINSLOT", slot, batch):
                    source.migrate(HOST, target_port, keys, 0, 10_000, replace=True)
                    moved += len(keys)
                # The target first, so that it owns the slot before the source stops answering
                # for it; then every other master (replicas learn it from their masters).
                target.execute_command("CLUSTER SETSLOT", slot, "NODE", target_id)
                source.execute_command("CLUSTER SETSLOT", slot, "NODE", target_id)
                for _host, port in self.primaries():
                    if port not in (source_port, target_port):
                        self._ask(port, "CLUSTER SETSLOT", slot, "NODE", target_id)
        self.wait_ok()
        return moved


class SentinelServers:
    """A primary, one replica and three sentinels monitoring them as ``service``.

    With ``password`` the data nodes require it (and authenticate to each other with it,
    so a failed-over primary can rejoin as a replica) and the sentinels use it; with
    ``sentinel_password`` the sentinels themselves require one. ``primary_port`` and
    ``replica_port`` follow failovers (``wait_failover``).
    """

    service = "mymaster"

    def __init__(self, *, password: str | None = None, sentinel_password: str | None = None) -> None:
        self.password = password
        self.sentinel_password = sentinel_password
        self.dir = Path(tempfile.mkdtemp(prefix="pm-redis-sentinel-"))
        self.primary_port = 0
        self.replica_port = 0
        self.sentinel_ports: list[int] = []
        self.processes: dict[int, subprocess.Popen[bytes]] = {}

    @property
    def sentinels(self) -> list[str]:
        """The sentinels as "host:port"."""
        return [f"{HOST}:{port}" for port in self.sentinel_ports]

    def _spawn_data(self, port: int, *, replica_of: int | None = None) -> None:
        args = [
            "--port",
            str(port),
            "--bind",
            HOST,
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.dir),
            # Each node its own file (they share the folder), and a replica's first sync at once.
            "--dbfilename",
            f"dump-{port}.rdb",
            "--repl-diskless-sync-delay",
            "0",
        ]
        if self.password:
            args += ["--requirepass", self.password, "--masterauth", self.password]
        if replica_of:
            args += ["--replicaof", HOST, str(replica_of)]
        self.processes[port] = start_redis(args, port, self.dir / f"redis-{port}.log", password=self.password)

    def _spawn_sentinel(self, port: int) -> None:
        conf = self.dir / f"sentinel-{port}.conf"  # each its own: sentinels rewrite their conf
        lines = [
            f"port {port}",
            f"bind {HOST}",
            f"dir {self.dir}",
            f"sentinel monitor {self.service} {HOST} {self.primary_port} 2",
            f"sentinel down-after-milliseconds {self.service} 3000",
            f"sentinel failover-timeout {self.service} 5000",
        ]
        if self.password:
            lines.append(f"sentinel auth-pass {self.service} {self.password}")
        if self.sentinel_password:
            # Sentinels also authenticate to each other with their requirepass.
            lines.append(f"requirepass {self.sentinel_password}")
        conf.write_text("\n".join(lines) + "\n")
        log = self.dir / f"sentinel-{port}.log"
        self.processes[port] = start_redis(
            [str(conf), "--sentinel"], port, log, password=self.sentinel_password
        )

    def start(self) -> None:
        """Start the primary, its replica and three sentinels; wait until the replica is in
        sync and every sentinel knows the primary, the replica and the two other sentinels."""
        atexit.register(self.stop)
        self.primary_port = on_free_port(self._spawn_data)
        self.replica_port = on_free_port(lambda port: self._spawn_data(port, replica_of=self.primary_port))
        self.sentinel_ports = [on_free_port(self._spawn_sentinel) for _ in range(3)]
        poll(self._settled, "the sentinels to see the primary, its replica and each other")

    def stop(self) -> None:
        """Stop every process by PID and remove the folder. Idempotent."""
        for process in self.processes.values():
            stop_process(process)
        self.processes.clear()
        shutil.rmtree(self.dir, ignore_errors=True)
        atexit.unregister(self.stop)

    def data_client(self, port: int) -> redis.Redis:
        """A plain client on one data node (close it when done)."""
        return redis.Redis(
            host=HOST, port=port, password=self.password, socket_timeout=10, decode_responses=True
        )

    def sentinel_client(self, port: int) -> redis.Redis:
        """A plain client on one sentinel (close it when done)."""
        return redis.Redis(
            host=HOST, port=port, password=self.sentinel_password, socket_timeout=10, decode_responses=True
        )

    def sentinel(self, **connection_kwargs: Any) -> redis.sentinel.Sentinel:
        """A ``redis.sentinel.Sentinel`` over our sentinels, with the passwords filled in."""
        return redis.sentinel.Sentinel(
            [(HOST, port) for port in self.sentinel_ports],
            sentinel_kwargs={"password": self.sentinel_password, "socket_timeout": 10},
            password=self.password,
            **connection_kwargs,
        )

    def _settled(self) -> bool:
        with self.data_client(self.primary_port) as primary:
            replication = primary.info("replication")
            # The replica connected and done with its first sync (a failover to one that is not
            # would promote an empty node). Not "caught up": writers may be running.
            if replication["connected_slaves"] != 1 or replication["slave0"]["state"] != "online":
                return False
        for port in self.sentinel_ports:
            with self.sentinel_client(port) as sentinel:
                if sentinel.sentinel_get_master_addr_by_name(self.service) != (HOST, self.primary_port):
                    return False
                replicas = sentinel.sentinel_slaves(self.service)
                # Its flags are just "slave" once the replica is known and not down.
                if [(r["port"], r["flags"]) for r in replicas] != [(self.replica_port, "slave")]:
                    return False
                if len(sentinel.sentinel_sentinels(self.service)) != 2:
                    return False
        return True

    def master_address(self) -> Address:
        """The primary's (host, port) as the first live sentinel reports it."""
        port = next(port for port in self.sentinel_ports if self.processes[port].poll() is None)
        with self.sentinel_client(port) as sentinel:
            return sentinel.sentinel_get_master_addr_by_name(self.service)

    def kill_primary(self) -> Address:
        """SIGKILL the current primary; its (host, port)."""
        old = self.master_address()
        stop_process(self.processes[old[1]], signal.SIGKILL)
        return old

    def wait_failover(self, old: Address, timeout: float = TIMEOUT) -> Address:
        """Wait until every sentinel reports a primary other than ``old`` and that node says
        ROLE master; its (host, port)."""

        def promoted() -> Address | None:
            answers = set()
            for port in self.sentinel_ports:
                with self.sentinel_client(port) as sentinel:
                    answers.add(sentinel.sentinel_get_master_addr_by_name(self.service))
            if len(answers) != 1 or old in answers:
                return None
            new = answers.pop()
            with self.data_client(new[1]) as client:
                return new if client.execute_command("ROLE")[0] == "master" else None

        new = poll(promoted, f"a failover away from {old}", timeout)
        self.primary_port, self.replica_port = new[1], old[1]
        return new

    def flush(self) -> None:
        """FLUSHALL on the primary (the replica follows)."""
        with self.data_client(self.primary_port) as primary:
            primary.flushall()

    def heal(self, *, timeout: float = TIMEOUT) -> None:
        """Restart a killed data node as the current primary's replica and wait until the
        sentinels see the pair as at start."""
        # A loaded machine can stall a primary long enough for the sentinels to fail it over
        # on their own: follow them.
        master = self.master_address()[1]
        if master == self.replica_port:
            self.primary_port, self.replica_port = master, self.primary_port
        for port in (self.primary_port, self.replica_port):
            if self.processes[port].poll() is not None:
                self._spawn_data(port, replica_of=self.master_address()[1])
        try:
            poll(self._settled, "the sentinels to see the primary and its replica again", timeout)
        except TimeoutError:
            # Seen once in many runs on a loaded machine: the sentinels kept a stale view.
            # A fresh set (new ports; tests read ``sentinels`` each time) is as good.
            self.stop()
            self.dir = Path(tempfile.mkdtemp(prefix="pm-redis-sentinel-"))
            self.start()


def redis_binaries_missing() -> str | None:
    """Why the topologies cannot be started here, or None."""
    missing = [name for name in ("redis-server", "redis-cli") if shutil.which(name) is None]
    return f"{' and '.join(missing)} not installed" if missing else None


__all__ = ["TIMEOUT", "ClusterServers", "SentinelServers", "poll", "redis_binaries_missing", "start_redis"]
