"""Where the Ray executor's time goes, beyond the units' own compute: one plan on a 1-CPU
Ray cluster on 127.0.0.1, its tasks' phases read from Ray's task timeline (docs/scale-out.md).

    python bench/ray_fixed_cost.py              # the plan of bench/scale_out.py
    python bench/ray_fixed_cost.py --limit 200  # on fewer images

Prints, in seconds from the moment ``run_plan`` is called: when the first task starts
executing on a worker (worker process start-up, Ray's scheduling), each task's phases as Ray
timed them (deserializing its arguments, executing, storing its outputs), the time the
worker spent executing against the wall time of the plan, and the idle time between tasks.
Inside the first task, it also times what a worker does once per plan (imports, the model and
data) by running the same code here in a fresh process.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from scale_out import PLAN, start_cluster  # noqa: E402 - sets the Ray environment first

from aisafety.config import plan_from_dict  # noqa: E402
from aisafety.execution import run_plan  # noqa: E402
from aisafety.store.results import ResultStore  # noqa: E402

PER_WORKER = """
import time; t0 = time.perf_counter()
import aisafety.distributed.tasks as tasks; t1 = time.perf_counter()
from aisafety.config import plan_from_dict
plan = plan_from_dict({plan!r})
runner, prepared = tasks._prepared(plan, {url!r}, {cwd!r}); t2 = time.perf_counter()
logits = prepared.context.clean_logits; t3 = time.perf_counter()
print(t1 - t0, t2 - t1, t3 - t2)
"""


def once_per_worker(plan: dict, folder: Path) -> tuple[float, float, float]:
    """A fresh process's import of the task module, its model + data + context, and its
    clean logits: what a new worker does before its first unit."""
    code = PER_WORKER.format(plan=plan, url=f"sqlite:///{folder}/probe.db", cwd=os.getcwd())
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    ).stdout  # fmt: skip
    imports, prepare, logits = (float(x) for x in out.split())
    return imports, prepare, logits


def task_phases(events: list[dict], since_us: float) -> tuple[list[dict], float]:
    """The tasks this plan ran (name, start and seconds from ``since_us``, and their phases
    as Ray timed them on the worker), and when the driver submitted its first task."""
    spans = [e for e in events if e.get("ph") == "X" and e["ts"] >= since_us]
    tasks = [
        {"name": e["cat"].removeprefix("task::"), "worker": e["tid"], "ts": e["ts"],
         "end": e["ts"] + e["dur"], "start": (e["ts"] - since_us) / 1e6,
         "seconds": e["dur"] / 1e6, "phases": defaultdict(float)}
        for e in spans if e["cat"].startswith("task::")
    ]  # fmt: skip
    for e in spans:
        if e["cat"].startswith("task:") and not e["cat"].startswith("task::"):
            for task in tasks:  # the task this phase belongs to: same worker, inside it
                if task["worker"] == e["tid"] and task["ts"] <= e["ts"] <= task["end"]:
                    task["phases"][e["cat"].removeprefix("task:")] += e["dur"] / 1e6
    submits = [e["ts"] for e in spans if e["cat"] == "submit_task"]
    first_submit = (min(submits) - since_us) / 1e6 if submits else float("nan")
    return sorted(tasks, key=lambda t: t["start"]), first_submit


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=PLAN["dataset"]["limit"])
    args = parser.parse_args()
    plan = {**PLAN, "dataset": {**PLAN["dataset"], "limit": args.limit}}
    plan["batch_size"] = min(plan["batch_size"], args.limit)
    import ray  # after scale_out, which sets Ray's authentication environment

    folder = Path(tempfile.mkdtemp(prefix="aisafety-bench-ray-cost-"))
    print(f"logs in {folder}; load average {os.getloadavg()[0]:.1f}", flush=True)
    address, node = start_cluster(1, folder)
    try:
        ray.init(address=address, logging_level="ERROR", log_to_driver=False)
        store = ResultStore(f"sqlite:///{folder}/ray.db")
        ray_plan = plan_from_dict({**plan, "executor": {"name": "ray", "address": address}})
        started_us = time.time() * 1e6
        started = time.perf_counter()
        record = run_plan(ray_plan, store, quiet=True)
        wall = time.perf_counter() - started
        assert not record.failed_units, record.failed_units
        time.sleep(2)  # task events reach the GCS asynchronously
        events = ray.timeline()
        (folder / "timeline.json").write_text(json.dumps(events))  # chrome://tracing
        tasks, first_submit = task_phases(events, started_us)
        ray.shutdown()
    finally:
        os.killpg(node.pid, 9)
        node.wait(30)
    attack_seconds = [r[0] for r in store.query("SELECT seconds FROM attack_runs")[1]]
    print(f"\nplan wall time on Ray (1 CPU): {wall:.1f} s; units' attack compute "
          f"{sum(attack_seconds):.1f} s ({len(attack_seconds)} attack units)")  # fmt: skip
    print(f"{'task':10s} {'start':>7s} {'seconds':>8s}  phases")
    for row in tasks:
        phases = ", ".join(f"{name} {s:.3f}" for name, s in row["phases"].items())
        print(f"{row['name']:10s} {row['start']:7.2f} {row['seconds']:8.2f}  {phases}")
    executing = sum(r["seconds"] for r in tasks)
    first = tasks[0]["start"] if tasks else float("nan")
    print(f"\nthe driver submits its first task at {first_submit:.2f} s; it executes at "
          f"{first:.2f} s (worker process start, loading the task code)")  # fmt: skip
    idle = wall - first - executing
    print(f"tasks executing: {executing:.1f} s; idle between tasks and after the last: "
          f"{idle:.2f} s")  # fmt: skip
    # Per unit: everything after the prepare task (attack and unit tasks, metrics, database
    # writes, object store, scheduling gaps) beyond the attacks' own compute, shared out
    # over the units; the clean unit's work counts as overhead too (conservative).
    per_unit = [r for r in tasks if r["name"] != "prepare"]
    extra = sum(r["seconds"] for r in per_unit) + idle - sum(attack_seconds)
    units = len(attack_seconds) + 1
    mean_unit = sum(attack_seconds) / len(attack_seconds)
    print(
        f"per-unit overhead: {extra / units:.3f} s per unit beyond the attack compute, "
        f"{extra / units / mean_unit:+.2%} of a unit's {mean_unit:.1f} s (target < 5 %)"
    )
    fixed = first + sum(r["seconds"] for r in tasks if r["name"] == "prepare")
    print(f"fixed cost per plan before the first unit: {fixed:.2f} s "
          f"({fixed / wall:.1%} of this plan's wall time)")  # fmt: skip
    imports, prepare, logits = once_per_worker(plan, folder)
    print(f"once per worker (a fresh process here): import of the task code {imports:.2f} s, "
          f"model + data + context {prepare:.2f} s, clean logits {logits:.2f} s")  # fmt: skip
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
