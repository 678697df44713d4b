"""alpha-beta-CROWN's CPU branch and bound on the VNN-COMP 2021 sets, one instance per process.

    <venv>/bin/python bench/abcrown/run.py --suite mnistfc --nets 256x4 [--per-net 0]
        [--timeout 60] [--clock cpu|wall] [--out abcrown.jsonl] [--abcrown DIR]
        [--only PROPERTY ...] [--suite sok --csv OUT_DIR/instances.csv]

Measurement only, beside our verifiers (``bench/verification.py``): alpha-beta-CROWN
(github.com/Verified-Intelligence/alpha-beta-CROWN, commit 8250d5f, its auto_LiRPA
submodule 9d100ec; ``--abcrown`` or ``$ABCROWN_DIR`` names the checkout, its
``complete_verifier`` folder holding ``auto_LiRPA``) runs each instance in a fresh process
(one torch thread) with the suite's config of this folder (``mnistfc.yaml``,
``eran.yaml`` (``eran_sigmoid.yaml`` for its sigmoid net), ``cifar.yaml`` (the ResNets;
``marabou.yaml`` for the three Marabou nets): each lists
what had to change from its competition config;
``sok.yaml`` for ``--csv`` instances of ``sok_export.py``)
in its ``single_vnnlib`` mode, and its verdict file is read: ``sat``, ``unsat`` or
``timeout``; a crash is ``error``. Settings this harness changes, besides the configs:

- ``torchvision`` is replaced in ``sys.modules`` by a module whose every name raises when
  called:
  alpha-beta-CROWN imports it at the top of ``data_utils.py`` and (through onnx2pytorch)
  ``load_model.py``, for datasets and detection operators none of these nets use; only
  CUDA builds of torchvision are reachable here. Any use would raise, not pass silently.
- ``--clock cpu`` (default): ``time.time`` inside that process reads process CPU time, so
  its ``bab.timeout`` (and every other limit it derives from ``time.time``) is CPU time, as
  our ``--clock cpu``; a ``RLIMIT_CPU`` of 2x the limit + 30 s backstops it.

Each result is a JSON line: suite, net, property, tool ``abcrown``, status, CPU seconds of
the child process after its imports (``startup_cpu_s``: Python, torch and alpha-beta-CROWN's
modules, about 3.5 s here; the network's loading is counted, as ours counts it), its wall
seconds, and for ``sat`` whether its counterexample replays under onnxruntime
(``cex_replays``; ``cex_moved_inputs``: how many of its float32 inputs lay one float32 step
outside the box and were moved in for that, see ``cex_replays``).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "testkit"))
from shared_location import shared_data  # noqa: E402


def _folder(data: Path | None, name: str) -> Path:
    """``name`` in ``data``, or where testkit/shared_location.py finds it (exits if absent)."""
    return data / name if data is not None else shared_data(name)


CONFIG = {"mnistfc": "mnistfc.yaml", "eran": "eran.yaml", "cifar": "cifar.yaml", "sok": "sok.yaml"}
# nets whose config differs from their suite's
NET_CONFIG = {
    "ffnnSIGMOID__Point_6x200": "eran_sigmoid.yaml",
    **{f"cifar10_{size}": "marabou.yaml" for size in ("small", "medium", "large")},
}


def instances(
    suite: str, data: Path | None = None, table: str = ""
) -> list[tuple[str, Path, Path]]:
    """(net name, network, property) of every row of the suite's CSV(s), in CSV order;
    ``data``: the shared data folder (default: where testkit/shared_location.py finds it);
    ``table``: a CSV of (network, property) relative to its folder, named by that folder."""
    if table:
        folder = Path(table).resolve().parent
        with open(table) as f:
            rows = [r for r in csv.reader(f) if r]
        return [(folder.name, folder / r[0].strip(), folder / r[1].strip()) for r in rows]
    if suite == "cifar":
        sys.path.insert(0, str(HERE.parent))
        from verify_cifar10 import instances as cifar_instances

        return [(n.stem, n, s) for n, s, _ in cifar_instances(_folder(data, "cifar10-models"))]
    folder = _folder(data, f"vnncomp2021_{suite}")
    with (folder / f"{suite}_instances.csv").open() as f:
        rows = [r for r in csv.reader(f) if r]
    return [(Path(r[0]).stem, folder / r[0].strip(), folder / r[1].strip()) for r in rows]


def select(rows: list, nets: list[str], per_net: int, only: list[str]) -> list:
    """The rows whose net contains one of ``nets`` (and property one of ``only``), the
    first ``per_net`` of each net (0: all)."""
    seen: dict[str, int] = {}
    chosen = []
    for net, onnx_path, spec in rows:
        if nets and not any(n in net for n in nets):
            continue
        if only and not any(o in spec.name for o in only):
            continue
        seen[net] = seen.get(net, 0) + 1
        if not per_net or seen[net] <= per_net:
            chosen.append((net, onnx_path, spec))
    return chosen


class _Unavailable(types.ModuleType):
    """A stand-in module: importable, every name of it raises when called."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)

        def unavailable(*args, **kwargs):
            raise RuntimeError(f"{self.__name__}.{name} called: not available here")

        return unavailable


STAND_INS = ("torchvision", "torchvision.ops", "torchvision.io", "torchvision.datasets",
             "torchvision.transforms", "onnx2pytorch")  # fmt: skip


def _install_stand_ins() -> None:
    names = list(STAND_INS)
    try:  # imported at the top of its MIP modules even when no MIP runs (bab: none does)
        import gurobipy  # noqa: F401
    except ImportError:
        names.append("gurobipy")
    for name in names:
        module = _Unavailable(name)
        module.__path__ = []  # a package, so ``from torchvision.ops import x`` reaches it
        sys.modules[name] = module


def run_one(abcrown: Path, config: Path, onnx_path: Path, spec: Path, timeout: float,
            result: Path, clock: str) -> None:  # fmt: skip
    """In this process: alpha-beta-CROWN on one instance, its verdict written to ``result``."""
    import torch

    torch.set_num_threads(1)
    _install_stand_ins()
    if clock == "cpu":
        origin = time.time() - time.process_time()
        time.time = lambda: origin + time.process_time()
    folder = abcrown / "complete_verifier"
    sys.path.insert(0, str(folder))
    os.chdir(folder)
    from abcrown import ABCROWN

    Path(f"{result}.startup").write_text(str(time.process_time()))  # imports, not verifying
    args = ["--config", str(config), "--onnx_path", str(onnx_path), "--vnnlib_path", str(spec),
            "--timeout", str(timeout), "--results_file", str(result),
            "--cex_path", str(result) + ".cex"]  # fmt: skip
    ABCROWN(args=args).main()


def cex_replays(onnx_path: Path, spec: Path, cex_file: Path) -> tuple[bool | None, int]:
    """Whether the counterexample alpha-beta-CROWN wrote lies in the box and breaks the
    property under onnxruntime (our reader of the property; None: no counterexample), and
    how many of its inputs had to move one float32 step into the box for that (0: none).

    It writes float32 inputs: where a box end (float64) has no float32 equal, a point on
    that end can lie one float32 step outside (cifar10_medium index2317: 1,763 inputs, by
    at most 2.4e-8). Such inputs are moved that one step in, as ``falsify.into_box`` moves
    ours, and the point is replayed again; an input further out is left, and fails."""
    if not cex_file.is_file():
        return None, 0
    from vnncomp_cifar10 import moved_into_box, replays  # testkit/, on the path above

    text = cex_file.read_text()
    if replays(onnx_path, spec, text):
        return True, 0
    moved, count = moved_into_box(spec, text)
    return bool(count and replays(onnx_path, spec, moved)), count


def printed_bounds(stdout: str) -> dict:
    """The bounds its log prints: the root's per spec row (``initial CROWN bounds``,
    ``initial alpha-crown bounds``, first 10 rows) and the last ``Current (lb-rhs)``, its
    worst open domain's bound when the search stopped (absent where it did not branch)."""
    found: dict = {}
    for line in stdout.splitlines():
        for method in ("CROWN", "alpha-crown"):
            head = f"initial {method} bounds (first 10 items):"
            if line.startswith(head):
                found[f"root_{method.lower()}"] = json.loads(line[len(head) :])
        if line.startswith("Current (lb-rhs):"):
            found["last_lb"] = float(line.split(":", 1)[1])
    return found


def run_instance(args, net: str, onnx_path: Path, spec: Path) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "result.txt"
        # its reader caches a ``.compiled`` copy beside the property: here, not in shared data
        copy = Path(tmp) / spec.name
        shutil.copyfile(spec, copy)
        cmd = [sys.executable, str(Path(__file__).resolve()), "--one", str(onnx_path),
               str(copy), str(result), "--suite", args.suite, "--timeout", str(args.timeout),
               "--clock", args.clock, "--abcrown", str(args.abcrown)]  # fmt: skip
        limit = int(2 * args.timeout + 30)
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        start = time.perf_counter()
        before = resource.getrusage(resource.RUSAGE_CHILDREN)

        def backstop() -> None:
            resource.setrlimit(resource.RLIMIT_CPU, (limit, limit + 5))

        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, preexec_fn=backstop)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        wall = time.perf_counter() - start
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        startup = Path(f"{result}.startup")
        startup = float(startup.read_text()) if startup.is_file() else 0.0
        cpu -= startup
        text = result.read_text().split("\n", 1) if result.is_file() else []
        status = text[0].strip() if text else ("timeout" if proc.returncode < 0 else "error")
        row = {"suite": args.suite, "net": net, "property": spec.name, "tool": "abcrown",
               "status": status, "cpu_s": round(cpu, 2), "startup_cpu_s": round(startup, 2),
               "wall_s": round(wall, 2),
               "timeout": args.timeout, "clock": args.clock}  # fmt: skip
        if status == "sat":
            Path(str(result) + ".cex").write_text(text[1] if len(text) > 1 else "")
            replayed, moved = cex_replays(onnx_path, spec, Path(str(result) + ".cex"))
            row["cex_replays"] = replayed
            if moved:  # inputs moved one float32 step into the box for the replay
                row["cex_moved_inputs"] = moved
        row.update(printed_bounds(proc.stdout))
        if status == "error":
            row["error"] = proc.stdout[-2000:] + proc.stderr[-2000:]
        return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--suite", choices=sorted(CONFIG), default="mnistfc")
    parser.add_argument("--nets", nargs="*", default=[])
    parser.add_argument("--per-net", type=int, default=0)
    parser.add_argument("--only", nargs="*", default=[], help="property names containing these")
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--clock", choices=["cpu", "wall"], default="cpu")
    parser.add_argument("--out", default="", help="append JSON lines here too")
    parser.add_argument("--data", type=Path, help="the shared data folder (default: found)")
    parser.add_argument("--csv", default="", help="instances of this CSV (sok_export.py)")
    parser.add_argument(
        "--abcrown", type=Path, default=Path(os.environ.get("ABCROWN_DIR", "/work/abcrown-8250d5f"))
    )
    parser.add_argument("--one", nargs=3, metavar=("ONNX", "VNNLIB", "RESULT"))
    parser.add_argument("--list", action="store_true", help="print 'net property' and stop")
    args = parser.parse_args()
    if args.one:
        onnx_path, spec, result = (Path(p) for p in args.one)
        config = NET_CONFIG.get(onnx_path.stem, CONFIG[args.suite])
        run_one(args.abcrown.resolve(), HERE / config, onnx_path, spec,
                args.timeout, result, args.clock)  # fmt: skip
        return
    found = instances(args.suite, args.data, args.csv)
    rows = select(found, args.nets, args.per_net, args.only)
    if args.list:
        print("\n".join(f"{net} {spec.name}" for net, _, spec in rows))
        return
    print(f"alpha-beta-CROWN ({args.abcrown}) on {len(rows)} {args.suite} instances, "
          f"{args.timeout:g} s ({args.clock}); load average {os.getloadavg()[0]:.1f}",
          file=sys.stderr)  # fmt: skip
    for net, onnx_path, spec in rows:
        row = run_instance(args, net, onnx_path, spec)
        line = json.dumps(row)
        print(line, flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(line + "\n")


if __name__ == "__main__":
    main()
