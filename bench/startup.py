"""Command-line start-up time: `aisafety --help` and `aisafety list` must answer in < 1 s.

    python bench/startup.py [--repeats 7] [--collector [--commands evaluate verify ...]]

Runs each command as a user does (a new process of the installed console script), the
commands interleaved in every round so a busy machine slows them alike, and prints each one's
median wall and CPU (user + system) time, and its paired-median ratio to a bare
`python -c pass` and to `python -c "import torch"` (what any command that loads a model
pays). `aisafety list` is timed twice: answered from its cache (aisafety/listing_cache.py:
the normal case after the first listing) and with the cache off (AISAFETY_LIST_CACHE=0:
every plugin imported), and a third time as the first listing after an install (an empty
cache: answered from the built-ins' shipped listing). CPU time is the steadier number on a
shared machine. ``--collector`` times the commands that load the plugins instead (evaluate,
compare, check, verify, list with its cache off, plugins), with and without the
collector's start-up handling (aisafety/cli/collector.py), paired.

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

The collector (session 20, CPU seconds, paired medians of interleaved runs). `aisafety --help`
and a cached `aisafety list attacks` import no torch: 13-16 young collections, ~3 ms; with the
collector off altogether they take 0.954 and 0.965 of their CPU (0.068 s and 0.085 s, 21
rounds, load 3.7), under the 5 % worth a change, so they are as they were. `aisafety
evaluate` of a tiny plan (--collector: embedded data, `ca` only, so its first result is its
whole run) ran 4 full collections in its imports (0.28 s) and one more of every object at
exit; aisafety/cli/collector.py holds them off until the plan and plugins are loaded, then
freezes: 1.749 s against 2.595 s (ratio 0.689, 9 rounds, load 2.5) and 1.817 s against
2.760 s (0.673, 11 rounds, load 4.1-4.7). Ending both arms with os._exit (no interpreter
exit) leaves 1.613 s against 1.885 s (0.858, 7 rounds): ~0.27 s saved in the run, ~0.6 s at
exit. Holding full collections off without the freeze saves 4 % (one full collection comes
after); gc.disable() for the start-up saves 34 % but freezes 8,008 garbage objects (~0.8 MB)
where holding freezes 567 (~60 kB). `python -X importtime` (wall, noisy) agrees: `import
aisafety.plugins` 1.14-1.23 s frozen against 1.68-1.85 s (2 of 3 pairs; the third inverted).
The results are unchanged: examples/quick.toml --limit 20 both ways, identical per
`python -m aisafety.store.compare` (5 metric values, 2 attack runs, 40 outcomes).

The other commands (session 21, --collector, 11 rounds each, CPU s held-and-frozen against
as before, paired median ratio and its range; AMD EPYC, 2 cores, shared, load 2.7-7.4 and
3.6-4.3): evaluate 2.009/2.826, 0.703 (0.639-0.745); compare of two models 2.452/3.524,
0.705 (0.633-0.781); verify 2.126/2.862, 0.751 (0.685-0.814); list attacks, no cache
1.718/2.564, 0.674 (0.597-0.713); plugins 1.662/2.590, 0.644 (0.611-0.736); check against
a zoo baseline, both runs reused 2.525/3.486, 0.693 (0.665-0.765). So each holds and
freezes as evaluate does. Unchanged results, both ways: compare of 3 models (FGSM, 3
metrics) the same output and per store.compare 15 metric values, 6 attack runs, 120
outcomes bit for bit; check the same 8 lines and 6 values, 4 attack runs, 80 outcomes;
verify prop_2 (unsat) and prop_7 (sat, its counterexample) the same but for the seconds;
list attacks and verifiers (JSON) and plugins byte for byte.
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "testkit"))
from shared_location import shared_data  # noqa: E402

PYTHON = sys.executable
AISAFETY = shutil.which("aisafety") or "aisafety"
TORCH = "python -c 'import torch'"
TINY_PLAN = "metrics: [ca]\nseed: 0\ndataset: {name: mnist-embedded, limit: 20}\n"
# main() reads sys.argv, as the console script does: the command is the whole process;
# main(argv) is a caller's, whose collector the command line leaves alone
WHOLE = "import sys; from aisafety.cli import main; sys.exit(main())"
CALLED = "import sys; from aisafety.cli import main; sys.exit(main(sys.argv[1:]))"
COLLECTED = ["evaluate", "compare", "check", "verify", "list", "plugins"]


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
    parser.add_argument("--collector", action="store_true", help="the collector, paired")
    parser.add_argument(
        "--commands", nargs="+", choices=COLLECTED, default=COLLECTED, help="with --collector"
    )
    args = parser.parse_args()
    if args.collector:
        collector(args.repeats, args.commands)
        return
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


def collector(repeats: int, only: list[str]) -> None:
    """Each command that loads the plugins as the whole process, the collector's start-up
    handling on and off (``main()`` against ``main(argv)``), the two in alternating order in
    every round and the commands interleaved: evaluate and compare of a tiny plan (embedded
    data, `ca` only: the first result is the whole run), check of it with FGSM against a zoo
    baseline, verify of a small VNN-COMP instance (mnistfc 256x2, crown: 0.4 s of
    verifying), list with its cache off, plugins."""
    mnistfc = shared_data("vnncomp2021_mnistfc")
    folder = tempfile.mkdtemp(prefix="aisafety-bench-gc-")
    plan = os.path.join(folder, "tiny.yaml")
    with open(plan, "w", encoding="utf-8") as f:
        f.write(TINY_PLAN)
    gate = os.path.join(folder, "gate.yaml")  # check needs per-sample outcomes
    with open(gate, "w", encoding="utf-8") as f:
        f.write(TINY_PLAN.replace("[ca]", "[ca, robust-accuracy]") + "attacks: [fgsm]\n")
    db = ["--db", f"sqlite:///{folder}/runs.db"]
    instance = [str(mnistfc / "mnist-net_256x2.onnx"), str(mnistfc / "prop_2_0.03.vnnlib")]
    commands = {
        "evaluate": ["evaluate", plan, *db, "--quiet"],
        "compare": ["compare", plan, "--models", "mnist-cnn", "mnist-cnn-pgd-at", *db, "--quiet"],
        "verify": ["verify", *instance, "--verifier", "crown"],
        "list (no cache)": ["list", "attacks"],
        "plugins": ["plugins"],
        # the candidate and the baseline reused from the database after the warm-up
        "check": ["check", gate, "--baseline", "mnist-cnn-pgd-at", *db, "--quiet"],
    }
    commands = {name: argv for name, argv in commands.items() if name.split()[0] in only}
    env = {**os.environ, "OMP_NUM_THREADS": "1", "AISAFETY_LIST_CACHE": "0"}
    arms = {"held, frozen": WHOLE, "as Python's": CALLED}
    for argv in commands.values():
        for code in arms.values():
            timed([PYTHON, "-c", code, *argv], env)
    cpus = {(c, a): [] for c in commands for a in arms}
    loads = []
    for round_ in range(repeats):
        loads.append(os.getloadavg()[0])
        for command, argv in commands.items():
            for arm in list(arms)[:: 1 if round_ % 2 == 0 else -1]:
                cpus[command, arm].append(timed([PYTHON, "-c", arms[arm], *argv], env)[1])
    shutil.rmtree(folder, ignore_errors=True)
    print(f"load (1 min) {min(loads):.1f}-{max(loads):.1f}, {repeats} rounds; CPU seconds")
    print(f"{'command':16} {'held, frozen':>12} {'as Python':>10} {'ratio':>6} {'range':>12}")
    for command in commands:
        held, plain = cpus[command, "held, frozen"], cpus[command, "as Python's"]
        ratios = sorted(a / b for a, b in zip(held, plain, strict=True))
        print(
            f"{command:16} {statistics.median(held):12.3f} {statistics.median(plain):10.3f}"
            f" {statistics.median(ratios):6.3f} {ratios[0]:6.3f}-{ratios[-1]:.3f}"
        )


if __name__ == "__main__":
    main()
