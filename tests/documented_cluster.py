"""docs/scale-out.md's commands as the tests run them: the block "Starting the cluster" (its
``export`` lines and both ``ray start`` lines) starts the suite's one Ray cluster (the
``ray_cluster`` fixture of tests/conftest.py), and the block "Running a plan on a cluster"
(``aisafety evaluate plan.yaml --executor ray --address auto --db ...``) is the driver
tests/test_scale_out.py's PostgreSQL test and tests/test_scale_out_docs.py run on it.

What is changed in the documented lines, and why: the port 6379 becomes a free one and
``HEAD_IP`` 127.0.0.1 (other clusters may run on this machine); each node gets ``--block``
(so that it is one process group, killed by the test, never ``ray stop``), a temporary
directory, one CPU and a small object store (the nodes of testkit/ray_cluster.py); the
driver's ``--db`` is the test server's database, and ``auto`` finds the cluster through
``RAY_ADDRESS`` (on a real node, through the address file ``ray start`` writes in the default
temporary directory).
"""

from __future__ import annotations

import secrets
import shlex
import sys
from pathlib import Path

from docs_blocks import REPO, blocks, shell_commands

SCALE_OUT = REPO / "docs" / "scale-out.md"


def block(containing: str) -> list[str]:
    """The commands of the one shell block of docs/scale-out.md that contains ``containing``."""
    found = [b for b in blocks(SCALE_OUT) if b.lang == "bash" and containing in b.body]
    assert len(found) == 1, f"{len(found)} bash blocks of {SCALE_OUT} contain {containing!r}"
    return shell_commands(found[0].body)


def documented_environment() -> dict[str, str]:
    """The block's ``export NAME=VALUE`` lines, the token ``...`` replaced by a fresh one."""
    env = {}
    for line in block("ray start --head"):
        if line.startswith("export "):
            name, _, value = line.removeprefix("export ").partition("=")
            env[name] = secrets.token_hex(32) if value == "..." else value
    return env


def documented_nodes(address: str, temp_dir: Path) -> tuple[list[str], list[str]]:
    """The block's two ``ray start`` lines for 127.0.0.1 (see the module's docstring)."""
    port = address.rsplit(":", 1)[1]
    lines = [c for c in block("ray start --head") if c.startswith("ray start")]
    head, worker = (
        shlex.split(line.replace("6379", port).replace("HEAD_IP", "127.0.0.1"))[1:]
        for line in lines
    )
    common = ["--num-cpus=1", "--object-store-memory=200000000", "--node-ip-address=127.0.0.1",
              "--block", "--disable-usage-stats"]  # fmt: skip
    head = [*head, f"--temp-dir={temp_dir}", "--include-dashboard=false", *common]
    return head, [*worker, *common]


def documented_driver(plan: Path, url: str) -> list[str]:
    """The block's ``aisafety evaluate`` line as arguments, its ``--db`` the test's database."""
    (line,) = [c for c in block("aisafety evaluate plan.yaml") if c.startswith("aisafety")]
    args = shlex.split(line)[1:]
    assert args[1] == "plan.yaml"
    args[1] = str(plan)
    args[args.index("--db") + 1] = url
    return [sys.executable, "-m", "aisafety.cli", *args]


def start_documented_cluster():
    """A head and a worker node (one CPU each) on 127.0.0.1, started by the documented
    commands (testkit/ray_cluster.py runs them)."""
    from ray_cluster import start_ray_cluster

    return start_ray_cluster(
        timeout=300,
        nodes=documented_nodes,
        env={"OMP_NUM_THREADS": "1", **documented_environment()},
    )
