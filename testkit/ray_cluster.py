"""A throw-away Ray cluster for tests and benches: a head node and a second worker node on
127.0.0.1.

Each node is one ``ray start --block`` process in its own process group with one CPU, so the
cluster has two workers on two nodes (as two machines would); stopping kills exactly those
process groups (never ``ray stop``, which would stop every Ray on the machine). Use it through
the ``ray_cluster`` fixture of tests/conftest.py: ``cluster.address`` goes to
``aisafety evaluate --executor ray --address ...``.

Each node's output goes to ``<temp_dir>-head.log`` / ``<temp_dir>-worker.log`` beside the
cluster's temporary directory (outside it: Ray writes its own session there). A clean stop
removes both and the directory; a cluster that failed (a start that did not finish, a node
that exited on its own before the stop) keeps them and names them: they are the evidence.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from postgres_server import free_port

# The `ray` command of this interpreter's Ray (its console script's module): a `ray` found
# beside sys.executable or on PATH may belong to another installation (a virtual environment
# without its own script), whose nodes would then start workers of another Python.
RAY = [sys.executable, "-m", "ray.scripts.scripts"]


@dataclass
class RayCluster:
    """``env`` must be in the environment of every process that connects (``aisafety
    evaluate --address``): the cluster's own authentication token."""

    address: str
    temp_dir: Path
    env: dict[str, str]
    nodes: list[subprocess.Popen] = field(default_factory=list)

    @property
    def logs(self) -> list[Path]:
        """Each node's output (head, then worker), beside ``temp_dir``."""
        return [self.temp_dir.parent / f"{self.temp_dir.name}-{n}.log" for n in ("head", "worker")]

    def worker_pids(self, busy_with: str = "") -> list[int]:
        """PIDs of this cluster's worker processes (``ray::<task>`` titles), optionally only
        those running a task whose name contains ``busy_with``."""
        out = subprocess.run(
            ["ps", "-eo", "pid,args"], capture_output=True, text=True, check=True
        ).stdout
        pids = []
        for line in out.splitlines()[1:]:
            pid, _, args = line.strip().partition(" ")
            busy = args.startswith("ray::") and "IDLE" not in args and busy_with in args
            if busy and self._ours(int(pid)):
                pids.append(int(pid))
        return pids

    def _ours(self, pid: int) -> bool:
        """Whether ``pid`` descends from one of this cluster's node processes."""
        roots = {p.pid for p in self.nodes}
        while pid > 1:
            if pid in roots:
                return True
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
            except OSError:
                return False
            pid = int(stat.rsplit(")", 1)[1].split()[1])
        return False

    def stop(self, failed: bool = False) -> None:
        """SIGKILL to each node's process group (its raylet, GCS and workers): a throw-away
        cluster needs no draining, which takes Ray 30 s after SIGTERM. Its files are removed,
        unless it ``failed`` or a node had exited before the kill: then they are kept, and
        a warning names them."""
        exited = [node.args for node in self.nodes if node.poll() is not None]
        for node in reversed(self.nodes):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(node.pid, signal.SIGKILL)
        for node in self.nodes:
            node.wait(30)
        if failed or exited:
            why = "it failed to start" if failed else "a node had exited before the stop"
            warnings.warn(f"Ray cluster {self.address}: {why}; {self.evidence()}", stacklevel=2)
            return
        for log in self.logs:
            log.unlink(missing_ok=True)
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def evidence(self) -> str:
        """Where this cluster's logs are (kept when it failed)."""
        logs = ", ".join(str(log) for log in self.logs if log.exists())
        return f"the nodes' output is in {logs or '(no log written)'}, Ray's in {self.temp_dir}"


def _start(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [*RAY, *args],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: stop() kills exactly it
        env={**os.environ, **env},
    )


def one_cpu_nodes(address: str, temp_dir: Path) -> tuple[list[str], list[str]]:
    """The `ray start` arguments of the head and the worker node: one CPU each."""
    common = ["--num-cpus=1", "--object-store-memory=200000000", "--node-ip-address=127.0.0.1",
              "--block", "--disable-usage-stats"]  # fmt: skip
    head = ["start", "--head", f"--port={address.rsplit(':', 1)[1]}", f"--temp-dir={temp_dir}",
            "--include-dashboard=false", *common]  # fmt: skip
    return head, ["start", f"--address={address}", *common]


def start_ray_cluster(
    timeout: float = 300.0,  # a hang guard: idle, both nodes are up in 15-19 s
    nodes: Callable[[str, Path], tuple[list[str], list[str]]] = one_cpu_nodes,
    env: dict[str, str] | None = None,
) -> RayCluster:
    """Head + one worker node (``nodes(address, temp_dir)``: their `ray start` arguments);
    returns once both nodes are alive. ``env``: the nodes' and drivers' environment, by
    default token authentication with a token of its own."""
    temp_dir = Path(tempfile.mkdtemp(prefix="aisafety-ray-"))
    env = env or {
        "OMP_NUM_THREADS": "1",
        "RAY_AUTH_MODE": "token",  # Ray's default for `ray start`; a token of its own
        "RAY_AUTH_TOKEN": secrets.token_hex(32),
    }
    env = {"RAY_USAGE_STATS_ENABLED": "0", **env}
    cluster = RayCluster(f"127.0.0.1:{free_port()}", temp_dir, env)
    head, worker = nodes(cluster.address, temp_dir)
    head_log, worker_log = cluster.logs
    cluster.nodes.append(_start(head, head_log, env))
    try:
        _wait_for_gcs(cluster, timeout)  # was a fixed 2 s
        cluster.nodes.append(_start(worker, worker_log, env))
        _wait_for_nodes(cluster, 2, timeout)
    except BaseException:
        cluster.stop(failed=True)
        raise
    return cluster


def _wait_for_gcs(cluster: RayCluster, timeout: float) -> None:
    """Until the head's GCS accepts connections on the cluster's port, where the worker
    node connects: the worker starts as soon as it can be answered, not after a guess."""
    host, port = cluster.address.rsplit(":", 1)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cluster.nodes[0].poll() is not None:
            raise RuntimeError(f"the Ray head node exited; {cluster.evidence()}")
        with contextlib.suppress(OSError), socket.create_connection((host, int(port)), 1):
            return
        time.sleep(0.05)
    raise RuntimeError(
        f"the Ray head's GCS at {cluster.address} is not up after {timeout} s; {cluster.evidence()}"
    )


# Connects once and asks the GCS every 0.2 s for up to argv[3] seconds: a new process per
# question (Ray's import and a driver's connection, 2-3 s each) had the second node's start
# waiting for a whole question after it was up.
_COUNT_NODES = """
import sys, time
import ray
ray.init(address=sys.argv[1], logging_level="ERROR")
count, until = int(sys.argv[2]), time.monotonic() + float(sys.argv[3])
alive = sum(n["Alive"] for n in ray.nodes())
while alive < count and time.monotonic() < until:
    time.sleep(0.2)
    alive = sum(n["Alive"] for n in ray.nodes())
print(alive)
"""


def _wait_for_nodes(cluster: RayCluster, count: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(node.poll() is not None for node in cluster.nodes):
            raise RuntimeError(f"a Ray node exited; {cluster.evidence()}")
        wait = str(min(30.0, max(deadline - time.monotonic(), 0.0)))  # then a node check
        result = subprocess.run(
            [sys.executable, "-c", _COUNT_NODES, cluster.address, str(count), wait],
            capture_output=True, text=True, env={**os.environ, **cluster.env},
        )  # fmt: skip
        lines = result.stdout.strip().splitlines()
        if result.returncode == 0 and lines and int(lines[-1]) >= count:
            return
        time.sleep(1)
    raise RuntimeError(
        f"the Ray cluster at {cluster.address} has not {count} nodes after {timeout} s; "
        f"{cluster.evidence()}"
    )
