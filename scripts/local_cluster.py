"""Rehearse a Ray cluster launch on one machine: a head node and worker nodes, each its own `ray start`.

    python scripts/local_cluster.py start --state FILE [--workers 1] [--gpus-per-node 1] [--cpus-per-node 8]
    python scripts/local_cluster.py status --state FILE
    python scripts/local_cluster.py kill-node --state FILE [--node worker-1]   # kill -9 its raylet: a node lost
    python scripts/local_cluster.py add-node --state FILE                      # one more worker node
    python scripts/local_cluster.py stop --state FILE

Ray places, schedules and loses these nodes as it would hosts (docs/cluster.md, "Rehearsing a cluster launch on
one machine"). Each node has its own temp folder, ports, session of processes and resources: ``--gpus-per-node``
Ray GPUs (the CPU platform's fake ones: verl asks Ray for GPUs, verl_ext/cpu/README.md) and
``--cpus-per-node`` logical CPUs. ``start`` waits until Ray's own node table lists every node alive, then prints
the address to launch with, e.g.

    RAY_ADDRESS=<printed> NNODES=2 NGPUS_PER_NODE=1 bash scripts/launch_memory.sh tiny_cpu tiny 2 ...

The nodes inherit this shell's environment, as on a cluster (export secrets and settings before ``start``).
``stop`` ends each node's processes by their session (never a machine-wide ``ray stop``, which would also end
other Ray instances of this machine) and removes the temp folders. FILE records the cluster (address, nodes, their
sessions); ``stop`` also cleans up after a ``start`` that failed half way. Exit status 2: bad usage or a state
file that does not describe a cluster; 1: Ray did not come up (the message says which node).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

# Ray's Unix sockets live under <temp folder>/session_<date>_<time>_<micros>_<pid>/sockets/ (62 more characters)
# and a socket path may have at most 107.
MAX_TEMP_DIR_CHARS = 40
NODE_WAIT_S = 120.0
START_ATTEMPTS = 3
STOP_GRACE_S = 5.0


class UsageError(Exception):
    """Bad usage or state: exit status 2."""


@dataclass
class Node:
    name: str  # head, worker-1, worker-2, ...
    temp_dir: str
    session: int  # every process of the node (daemons and Ray workers) is in this session
    node_id: str = ""  # Ray's node id, once the node registered


@dataclass
class Cluster:
    address: str = ""  # the head's GCS address, host:port: what RAY_ADDRESS takes
    dashboard: str = ""  # the head's dashboard (Ray's state API answers there)
    gpus_per_node: int = 1
    cpus_per_node: int = 8
    object_store_mb: int = 512
    nodes: list[Node] = field(default_factory=list)

    def save(self, path: Path) -> None:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2) + "\n")
        tmp.replace(path)  # never a half-written state file

    @classmethod
    def load(cls, path: Path) -> Cluster:
        try:
            data = json.loads(path.read_text())
            return cls(**{**data, "nodes": [Node(**node) for node in data["nodes"]]})
        except FileNotFoundError:
            raise UsageError(f"{path}: no such state file (nothing started with it, or already stopped)") from None
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise UsageError(f"{path}: not a state file of scripts/local_cluster.py ({err})") from None

    def node(self, name: str) -> Node:
        for node in self.nodes:
            if node.name == name:
                return node
        raise UsageError(f"no node {name!r}; nodes: {', '.join(n.name for n in self.nodes)}")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def ray_command() -> str:
    """The `ray` command of this interpreter's environment (the nodes must run the launcher's Ray)."""
    beside = Path(sys.executable).parent / "ray"
    return str(beside) if beside.is_file() else "ray"


def short_temp_dir(prefix: str) -> str:
    path = tempfile.mkdtemp(prefix=prefix)
    if len(path) > MAX_TEMP_DIR_CHARS:
        shutil.rmtree(path, ignore_errors=True)
        raise UsageError(
            f"temp folder {path} is longer than {MAX_TEMP_DIR_CHARS} characters: Ray's socket paths under it would "
            "pass the 107-character limit; set TMPDIR to a shorter folder"
        )
    return path


def node_environment() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)  # `ray start` takes the address from --address only
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    # Ray >= 2.5x may turn token authentication on for a new cluster; a launcher that joins by address sends none.
    env.setdefault("RAY_AUTH_MODE", "disabled")
    return env


def start_node(cluster: Cluster, name: str, state: Path) -> Node:
    """`ray start` for one node, tried up to :data:`START_ATTEMPTS` times: `ray start` gives a raylet a fixed 30 s
    to register with the GCS, which a loaded machine can miss (a failed try is stopped before the next)."""
    for attempt in range(1, START_ATTEMPTS + 1):
        node, log = start_node_once(cluster, name, state)
        if log is None:
            return node
        stop_node(node)
        cluster.nodes.remove(node)
        cluster.save(state)
        last = (log.strip().splitlines() or ["(no output)"])[-1]
        if attempt == START_ATTEMPTS:
            raise RuntimeError(f"`ray start` of node {name} failed {START_ATTEMPTS} times; the last time:\n{log}")
        print(f"[local_cluster] `ray start` of {name} failed ({last}); trying again", file=sys.stderr)
    raise AssertionError("unreachable")


def start_node_once(cluster: Cluster, name: str, state: Path) -> tuple[Node, str | None]:
    """One `ray start` in its own session; the node is in the state file before Ray starts it, so that ``stop``
    finds whatever it left. Returns the node and, if `ray start` failed, its output."""
    temp_dir = short_temp_dir(f"rc{name[0]}")
    args = [
        ray_command(),
        "start",
        f"--temp-dir={temp_dir}",
        f"--num-cpus={cluster.cpus_per_node}",
        f"--num-gpus={cluster.gpus_per_node}",
        f"--object-store-memory={cluster.object_store_mb * 2**20}",
        # ports of their own: two nodes share this machine (and other Ray instances may run on it)
        "--dashboard-agent-listen-port=0",
        "--metrics-export-port=0",
        "--disable-usage-stats",
    ]
    if name == "head":
        dashboard_port = free_port()
        args += ["--head", "--port=0", f"--ray-client-server-port={free_port()}", f"--dashboard-port={dashboard_port}"]
        cluster.dashboard = f"http://127.0.0.1:{dashboard_port}"
    else:
        args += [f"--address={cluster.address}"]
    log = Path(temp_dir) / "ray_start.log"
    with open(log, "w") as out:
        process = subprocess.Popen(
            args, stdout=out, stderr=subprocess.STDOUT, env=node_environment(), start_new_session=True
        )
    node = Node(name=name, temp_dir=temp_dir, session=process.pid)
    cluster.nodes.append(node)
    cluster.save(state)
    if process.wait() != 0:
        return node, log.read_text()
    if name == "head":
        cluster.address = (Path(temp_dir) / "ray_current_cluster").read_text().strip()
        cluster.save(state)
    return node, None


def wait_for_nodes(cluster: Cluster, state: Path, nodes: list[Node], timeout_s: float = NODE_WAIT_S) -> None:
    """Until Ray's node table (``ray.nodes()``) lists each of ``nodes`` alive; records their node ids. A node is
    told apart by its raylet socket, which lies in its own temp folder."""
    import ray

    ray.init(address=cluster.address, log_to_driver=False, logging_level="WARNING")
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            alive = [entry for entry in ray.nodes() if entry["Alive"]]
            for node in nodes:
                mine = [e["NodeID"] for e in alive if e["RayletSocketName"].startswith(node.temp_dir + os.sep)]
                node.node_id = mine[0] if mine else ""
            missing = [node.name for node in nodes if not node.node_id]
            if not missing:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"Ray lists no alive node for {', '.join(missing)} after {timeout_s:.0f} s")
            time.sleep(0.5)
    finally:
        ray.shutdown()
    cluster.save(state)


def session_pids(session: int) -> list[int]:
    """The live processes of a session (fields of /proc/<pid>/stat after the name: state ppid pgrp session)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == session and fields[0] != "Z":
            pids.append(int(entry))
    return pids


def raylet_pid(node: Node) -> int | None:
    for pid in session_pids(node.session):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "raylet":
                return pid
        except OSError:
            continue
    return None


def signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def stop_node(node: Node, grace_s: float = STOP_GRACE_S) -> None:
    """TERM every process of the node's session, KILL what is left after the grace, then remove its temp folder."""
    signal_all(session_pids(node.session), signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while session_pids(node.session) and time.monotonic() < deadline:
        time.sleep(0.2)
    signal_all(session_pids(node.session), signal.SIGKILL)
    deadline = time.monotonic() + grace_s
    while session_pids(node.session) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = session_pids(node.session)
    if left:
        raise RuntimeError(f"node {node.name}: processes {left} survived SIGKILL")
    shutil.rmtree(node.temp_dir, ignore_errors=True)


def stop(state: Path) -> None:
    cluster = Cluster.load(state)
    for node in reversed(cluster.nodes):  # workers first: a head stopped first leaves them retrying
        stop_node(node)
        print(f"[local_cluster] stopped {node.name}")
    state.unlink()


def start(state: Path, workers: int, gpus: int, cpus: int, object_store_mb: int) -> Cluster:
    if state.exists():
        raise UsageError(f"{state} exists: a cluster may be running (stop it first, or choose another --state)")
    if workers < 0 or gpus < 0 or cpus < 1 or object_store_mb < 64:
        raise UsageError("--workers >= 0, --gpus-per-node >= 0, --cpus-per-node >= 1, --object-store-mb >= 64")
    state.parent.mkdir(parents=True, exist_ok=True)
    cluster = Cluster(gpus_per_node=gpus, cpus_per_node=cpus, object_store_mb=object_store_mb)
    try:
        started = [start_node(cluster, "head", state)]
        started += [start_node(cluster, f"worker-{k}", state) for k in range(1, workers + 1)]
        wait_for_nodes(cluster, state, started)
    except BaseException:
        if state.exists():
            stop(state)
        raise
    return cluster


def add_node(state: Path) -> Node:
    cluster = Cluster.load(state)
    number = 1 + max([int(n.name.split("-")[1]) for n in cluster.nodes if n.name.startswith("worker-")] or [0])
    node = start_node(cluster, f"worker-{number}", state)
    wait_for_nodes(cluster, state, [node])
    return node


def kill_node(state: Path, name: str) -> int:
    """kill -9 the node's raylet, as when a host goes away: Ray finds out by missed health checks."""
    node = Cluster.load(state).node(name)
    if name == "head":
        raise UsageError("kill a worker node; the head holds the cluster's control store (GCS)")
    pid = raylet_pid(node)
    if pid is None:
        raise UsageError(f"node {name} has no raylet running (lost already?)")
    os.kill(pid, signal.SIGKILL)
    return pid


def describe(cluster: Cluster) -> str:
    lines = [f"RAY_ADDRESS={cluster.address}", f"dashboard {cluster.dashboard}"]
    for node in cluster.nodes:
        alive = "raylet running" if raylet_pid(node) else "no raylet"
        lines.append(
            f"  {node.name}: Ray node {node.node_id or '?'}, {cluster.gpus_per_node} GPU(s), {cluster.cpus_per_node} "
            f"CPU(s), {alive}, temp folder {node.temp_dir}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["start", "status", "kill-node", "add-node", "stop"])
    parser.add_argument("--state", type=Path, required=True, help="the cluster's state file (JSON)")
    parser.add_argument("--workers", type=int, default=1, help="start: worker nodes besides the head")
    parser.add_argument("--gpus-per-node", type=int, default=1, help="start: Ray GPUs of each node")
    parser.add_argument("--cpus-per-node", type=int, default=8, help="start: Ray's logical CPUs of each node")
    parser.add_argument("--object-store-mb", type=int, default=512, help="start: object store of each node")
    parser.add_argument("--node", default="worker-1", help="kill-node: which node")
    args = parser.parse_args(argv)
    state = args.state.resolve()
    try:
        if args.command == "start":
            cluster = start(state, args.workers, args.gpus_per_node, args.cpus_per_node, args.object_store_mb)
            print(describe(cluster))
            mode = node_environment()["RAY_AUTH_MODE"]  # a launcher joining by address must use the nodes' mode
            print(f"[local_cluster] launch with RAY_ADDRESS={cluster.address} RAY_AUTH_MODE={mode}")
            print(f"[local_cluster] stop with: python {sys.argv[0]} stop --state {state}")
        elif args.command == "status":
            print(describe(Cluster.load(state)))
        elif args.command == "kill-node":
            print(f"[local_cluster] killed the raylet of {args.node} (pid {kill_node(state, args.node)})")
        elif args.command == "add-node":
            node = add_node(state)
            print(f"[local_cluster] {node.name} joined: Ray node {node.node_id}")
        else:
            stop(state)
    except UsageError as err:
        print(f"[local_cluster] {err}", file=sys.stderr)
        return 2
    except RuntimeError as err:
        print(f"[local_cluster] {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
