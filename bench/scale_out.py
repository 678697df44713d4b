"""Scale-out measurements of docs/scale-out.md: one plan with 1 and 2 Ray workers, and the
overhead of the Ray executor against the local one on units of >= 10 s.

    python bench/scale_out.py             # 3 rounds (about 10 min on 2 busy cores)
    python bench/scale_out.py --rounds 5

Two throw-away Ray clusters are started on 127.0.0.1 (one CPU, two CPUs; each task gets one
CPU and one torch thread), and the same plan runs, in each round in a shuffled order, (a)
locally with one torch thread, (b) on the 1-CPU cluster, (c) on the 2-CPU cluster. Printed
as ratios of paired runs (same round), median over rounds: Ray overhead = (b) / (a) - 1
(target < 5 %), speed-up = (b) / (c). Wall times include everything a user waits for
(loading the model and data on a worker, clean logits, object store, database writes);
only connecting to the cluster is left out. The machine is shared, so single runs are
noisy: read the paired medians.
"""

from __future__ import annotations

import argparse
import os
import random
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ["RAY_AUTH_MODE"] = "token"
os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"

import ray  # noqa: E402
import torch  # noqa: E402

from aisafety.config import plan_from_dict  # noqa: E402
from aisafety.execution import run_plan  # noqa: E402
from aisafety.store.results import ResultStore  # noqa: E402

# 4 units of PGD-40 on 1,000 MNIST images (>= 10 s each on one idle core) and the clean one
PLAN = {
    "dataset": {"name": "mnist-embedded", "limit": 1000},
    "attacks": [{"name": "pgd-linf", "config": {"steps": 40}, "eps": [0.05, 0.1, 0.2, 0.3]}],
    "metrics": ["ca", "aaw", "robust-accuracy"],
    "batch_size": 250,
    "device": "cpu",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_cluster(cpus: int, folder: Path) -> tuple[str, subprocess.Popen]:
    """A 1-node Ray cluster of ``cpus`` CPUs, started by this interpreter's Ray (the module
    of its `ray` script: a `ray` on PATH may be another installation's)."""
    port = free_port()
    node = subprocess.Popen(
        [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", f"--port={port}",
         f"--num-cpus={cpus}", "--include-dashboard=false", "--disable-usage-stats",
         "--object-store-memory=300000000", f"--temp-dir={folder}/ray{cpus}", "--block"],
        stdout=(folder / f"ray{cpus}.log").open("w"), stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    address = f"127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            ray.init(address=address, logging_level="ERROR")
            ray.shutdown()
            return address, node
        except (ConnectionError, RuntimeError):
            time.sleep(2)
    raise RuntimeError(f"Ray cluster with {cpus} CPUs did not start; see {folder}")


def timed_run(folder: Path, name: str, address: str | None) -> float:
    """Seconds of one whole plan; local with one torch thread, or on the cluster."""
    plan = dict(PLAN)
    if address is not None:
        plan["executor"] = {"name": "ray", "address": address}
        ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    store = ResultStore(f"sqlite:///{folder / name}.db")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    started = time.perf_counter()
    try:
        record = run_plan(plan_from_dict(plan), store, quiet=True)
    finally:
        seconds = time.perf_counter() - started
        torch.set_num_threads(threads)
        if address is not None:
            ray.shutdown()
    assert not record.failed_units, record.failed_units
    return seconds


def unit_seconds(folder: Path, name: str) -> list[float]:
    """The attack time of each unit as the process that ran it measured it."""
    rows = ResultStore(f"sqlite:///{folder / name}.db").query("SELECT seconds FROM attack_runs")
    return [r[0] for r in rows[1]]


def paired(times: dict[str, list[float]], folder: Path, rounds: int) -> dict[str, list[float]]:
    """Per round: Ray/local whole plan, Ray/local attack compute (inside the units), the
    seconds outside the attacks (loading, clean logits, metrics, database, and on Ray:
    scheduling, worker start-up, object store), and the 2-vs-1-worker speed-up."""
    out: dict[str, list[float]] = {"plan": [], "compute": [], "outside_local": [],
                                   "outside_ray": [], "speedup": []}  # fmt: skip
    for r in range(rounds):
        local, ray1 = (
            sum(unit_seconds(folder, f"local-{r}")),
            sum(unit_seconds(folder, f"ray-1-{r}")),
        )
        out["plan"].append(times["ray-1"][r] / times["local"][r] - 1)
        out["compute"].append(ray1 / local - 1)
        out["outside_local"].append(times["local"][r] - local)
        out["outside_ray"].append(times["ray-1"][r] - ray1)
        out["speedup"].append(times["ray-1"][r] / times["ray-2"][r])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="aisafety-bench-scale-"))
    print(f"databases and logs in {folder}; load average {os.getloadavg()[0]:.1f}", flush=True)
    clusters = {}
    try:
        for cpus in (1, 2):
            clusters[cpus] = start_cluster(cpus, folder)
        times: dict[str, list[float]] = {"local": [], "ray-1": [], "ray-2": []}
        for round_ in range(args.rounds):
            order = list(times)
            random.Random(round_).shuffle(order)
            for kind in order:
                address = None if kind == "local" else clusters[int(kind[-1])][0]
                seconds = timed_run(folder, f"{kind}-{round_}", address)
                times[kind].append(seconds)
                print(f"round {round_ + 1}: {kind:6s} {seconds:6.1f} s", flush=True)
        units = unit_seconds(folder, "local-0")
        ratios = paired(times, folder, args.rounds)

        def show(values: list[float], fmt: str) -> str:
            rounds = ", ".join(format(v, fmt) for v in values)
            return f"median {format(statistics.median(values), fmt)} (rounds: {rounds})"

        print(f"\nunits: {len(units) + 1} (clean + {len(units)} attack units of median "
              f"{statistics.median(units):.1f} s each, local, one thread)")  # fmt: skip
        print(f"Ray overhead, 1 worker vs local, whole plan: {show(ratios['plan'], '+.1%')}")
        print(f"Ray overhead, 1 worker vs local, attack compute per unit: "
              f"{show(ratios['compute'], '+.1%')}; target < 5 %")  # fmt: skip
        print(f"seconds outside the attacks per plan: local {show(ratios['outside_local'], '.1f')}"
              f"; Ray {show(ratios['outside_ray'], '.1f')}")  # fmt: skip
        print(f"speed-up, 2 Ray workers vs 1: {show(ratios['speedup'], '.2f')} on "
              f"{os.cpu_count()} cores (load average {os.getloadavg()[0]:.1f})")  # fmt: skip
    finally:
        for _, node in clusters.values():
            os.killpg(node.pid, signal.SIGKILL)
            node.wait(30)


if __name__ == "__main__":
    main()
