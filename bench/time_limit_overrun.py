"""Where a VNN-COMP instance's CPU seconds go past its time limit (#33, "Time limits").

    OMP_NUM_THREADS=1 python bench/time_limit_overrun.py [--suite eran] [--nets relu]
        [--only mnist_spec_idx_225_ ...] [--per-net 0] [--verifier complete] [--timeout 60]

Runs ``verify_instance`` as ``bench/verification.py`` does (one thread, CPU clock) and
splits each instance's CPU seconds (``time.process_time``) into: ``setup``, before the
batch's deadline is set (loading the network, building the verifier, reading the spec);
``limit``, the deadline's own seconds; ``late``, from the deadline to the first clock check
that sees it passed; ``after``, from that check to the answer. It also prints the longest
stretch between two clock checks inside the limit (the CPU one op or solver call can
overrun by) and the two call sites bounding it. Reading the clock is wrapped
(``Deadline.passed``), so the numbers include that wrapper's small cost.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from abcrown.run import instances as suite_instances  # noqa: E402  (the same sets)
from abcrown.run import select  # noqa: E402

from aisafety.verification import deadline as deadline_module  # noqa: E402
from aisafety.verification import vnncomp  # noqa: E402
from aisafety.verification.base import Verifier  # noqa: E402


class Recorder:
    """Every clock check (CPU seconds, call site) and the first batch deadline set."""

    def __init__(self) -> None:
        self.reads: list[tuple[float, str]] = []
        self.batch_at: float | None = None

    def install(self) -> None:
        passed, make = deadline_module.Deadline.passed, Verifier.deadline
        recorder = self

        def recorded_passed(deadline) -> bool:
            frame = sys._getframe(1)
            if frame.f_code.co_name == "check_time":
                frame = frame.f_back
            where = f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno} {frame.f_code.co_name}"
            recorder.reads.append((time.process_time(), where))
            return passed(deadline)

        def recorded_deadline(verifier, n: int):
            made = make(verifier, n)
            if recorder.batch_at is None:
                recorder.batch_at = made.at
            return made

        deadline_module.Deadline.passed = recorded_passed
        Verifier.deadline = recorded_deadline


def split(recorder: Recorder, start: float, end: float, timeout: float) -> dict:
    """The instance's CPU seconds by phase, and the longest stretch between two checks."""
    at = recorder.batch_at if recorder.batch_at is not None else end
    inside = [(t, w) for t, w in recorder.reads if t <= at]
    gap, sites = 0.0, ("", "")
    for (t0, w0), (t1, w1) in zip(inside, inside[1:], strict=False):
        if t1 - t0 > gap:
            gap, sites = t1 - t0, (w0, w1)
    seen = next((t for t, _ in recorder.reads if t > at), end)
    return {
        "setup": at - timeout - start,
        "late": max(0.0, min(seen, end) - at),
        "after": max(0.0, end - max(seen, at)),
        "gap": gap,
        "sites": sites,
        "checks": len(recorder.reads),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default="eran")
    parser.add_argument("--nets", nargs="+", default=["relu"])
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--per-net", type=int, default=0)
    parser.add_argument("--verifier", default="complete")
    parser.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    from aisafety.plugins import default_registry

    # before any instance's clock: its first build (0.29 s of CPU, importing the plugins)
    # ran after ``start`` when it was an argument, and read as setup outside the limit
    registry = default_registry()
    recorder = Recorder()
    recorder.install()
    print(f"{args.suite}, {args.verifier}, timeout {args.timeout:g} s of CPU, 1 thread")
    for net, onnx_path, spec in select(
        suite_instances(args.suite), args.nets, args.per_net, args.only
    ):
        vnncomp.load_network.cache_clear()  # each instance loads its network, as a sweep job
        recorder.reads, recorder.batch_at = [], None
        start = time.process_time()
        result = vnncomp.verify_instance(
            registry, onnx_path, spec, args.verifier, args.timeout, {"clock": "cpu"}
        )
        end = time.process_time()
        part = split(recorder, start, end, args.timeout)
        print(
            f"{net} {spec.name}: {result.status}, cpu {end - start:.2f} s = setup "
            f"{part['setup']:.2f} + limit {args.timeout:g} + late {part['late']:.2f} + after "
            f"{part['after']:.2f} (to {end - start - args.timeout:+.2f}); {part['checks']} "
            f"clock checks, longest stretch {part['gap']:.3f} s between {part['sites'][0]} "
            f"and {part['sites'][1]}",
            flush=True,
        )


if __name__ == "__main__":
    main()
