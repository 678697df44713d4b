"""Command-line start-up time: `aisafety --help` and `aisafety list` must answer in < 1 s.

    python bench/startup.py [--repeats 7]

Runs each command as a user does (a new process of the installed console script), the
commands interleaved in every round so a busy machine slows them alike, and prints each one's
median wall and CPU (user + system) time, and its paired-median ratio to a bare
`python -c pass` and to `python -c "import torch"` (what any command that loads a model
pays). `aisafety list` is timed twice: answered from its cache (aisafety/listing_cache.py:
the normal case after the first listing) and with the cache off (AISAFETY_LIST_CACHE=0:
every plugin imported), and a third time as the first listing after an install (an empty
cache: answered from the built-ins' shipped listing). CPU time is the steadier number on a
shared machine.

Reading `python -X importtime` (session 20): a module's cumulative time includes the first
import of whatever it is the first to need, and a cyclic garbage collection that falls in it
after torch's ~170,000 objects are loaded. `import aisafety.attack.square` alone showed
~140-400 ms, which read as Square's own cost; it is not: about half was one full collection
(379-443 ms with the collector on, 162-208 ms off, 3 runs each, load ~3), the rest pydantic's
lazily loaded `fields`/`types`/`json_schema`, `aisafety.interfaces` and `attack.base`, which
whichever attack comes first pays. Square's own module (its dependencies imported first, the
collector off) takes 2-12 ms, as `nattack` does (compiling its 352 lines from source where
PYTHONDONTWRITEBYTECODE is set, its pydantic config class); in `import aisafety.builtin` it
is 6-9 ms. It builds no table at import and imports nothing heavy, so nothing was made lazy.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

PYTHON = sys.executable
AISAFETY = shutil.which("aisafety") or "aisafety"
TORCH = "python -c 'import torch'"


def timed(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the child) of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    cache = tempfile.mkdtemp(prefix="aisafety-bench-cache-")
    empty = tempfile.mkdtemp(prefix="aisafety-bench-empty-")  # the shipped listing writes none
    env = {**os.environ, "AISAFETY_CACHE_DIR": cache, "AISAFETY_LIST_CACHE": "1"}
    commands = {
        "python -c pass": ([PYTHON, "-c", "pass"], env),
        TORCH: ([PYTHON, "-c", "import torch"], env),
        "aisafety --help": ([AISAFETY, "--help"], env),
        "aisafety list attacks (cached)": ([AISAFETY, "list", "attacks"], env),
        "aisafety list metrics (cached)": ([AISAFETY, "list", "metrics"], env),
        "aisafety list attacks (first call)": (
            [AISAFETY, "list", "attacks"],
            {**env, "AISAFETY_CACHE_DIR": empty},
        ),
        "aisafety list attacks (no cache)": (
            [AISAFETY, "list", "attacks"],
            {**env, "AISAFETY_LIST_CACHE": "0"},
        ),
    }
    for command, run_env in commands.values():  # warm-up: disk cache, and the listing cache
        timed(command, run_env)
    walls = {name: [] for name in commands}
    cpus = {name: [] for name in commands}
    for _ in range(args.repeats):
        for name, (command, run_env) in commands.items():
            wall, cpu = timed(command, run_env)
            walls[name].append(wall)
            cpus[name].append(cpu)
    shutil.rmtree(cache, ignore_errors=True)
    shutil.rmtree(empty, ignore_errors=True)

    def paired(name: str, base: str) -> float:
        return statistics.median(a / b for a, b in zip(walls[name], walls[base], strict=True))

    print(f"{'command':34} {'wall s':>7} {'cpu s':>6} {'/ python':>9} {'/ import torch':>15}")
    for name in commands:
        print(
            f"{name:34} {statistics.median(walls[name]):7.3f} {statistics.median(cpus[name]):6.3f}"
            f" {paired(name, 'python -c pass'):9.1f}"
            f" {paired(name, TORCH):15.2f}"
        )
    for name in ("aisafety --help", "aisafety list attacks (cached)",
                 "aisafety list attacks (first call)"):  # fmt: skip
        verdict = "meets" if statistics.median(walls[name]) < 1.0 else "MISSES"
        print(f"{name}: {verdict} the 1 s target (median wall)")


if __name__ == "__main__":
    main()
