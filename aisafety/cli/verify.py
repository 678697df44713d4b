"""``aisafety verify``: one VNN-COMP instance (an ONNX network and a VNN-LIB property), or a
benchmark's ``instances.csv`` row by row (``--instances``, ``cli/benchmark.py``)."""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
import warnings
from pathlib import Path

from aisafety.cli import collector, common
from aisafety.cli.gzipped import unpacked
from aisafety.errors import AISafetyError, ConfigError


def seconds(text: str) -> float:
    """``--timeout``: a positive, finite number of seconds (argparse names the option)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a number of seconds, not {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"a positive, finite number of seconds, not {text}")
    return value


def add_parser(sub) -> None:
    vf = sub.add_parser(
        "verify",
        help="verify a VNN-COMP instance (NET.onnx SPEC.vnnlib) or a benchmark (--instances)",
    )
    vf.add_argument("network", nargs="?", help="ONNX network")
    vf.add_argument("spec", nargs="?", help="VNN-LIB property")
    vf.add_argument(
        "--instances",
        metavar="CSV",
        help="a VNN-COMP benchmark's instances.csv (rows onnx,vnnlib,timeout, paths relative "
        "to its folder): every row in this process, one results line each, then a summary",
    )
    vf.add_argument(
        "--timeout",
        type=seconds,
        help="seconds for the instance, counted on --clock (default 60; with --instances, "
        "each row's own)",
    )
    vf.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="what --timeout counts: wall seconds, as VNN-COMP (default), or this process's "
        "CPU seconds (load-independent on a shared machine)",
    )
    vf.add_argument("--verifier", default="complete", help="see `aisafety list verifiers`")
    vf.add_argument(
        "--memory-gib",
        type=float,
        help="the verifier's memory budget (its memory_gib; default half of the memory "
        "available): a bound pass that needs more is refused, naming what it needs",
    )
    vf.add_argument(
        "--out",
        metavar="FILE",
        help="also write VNN-COMP's results file: the status line, then for sat the "
        "counterexample; the terminal then shows the status without it. With --instances: "
        "the results lines, and the sat rows' counterexamples in FILE.counterexamples/",
    )
    space = "what the network is fed, (pixels * scale - mean) / std, pixels in [0, 1]: a box "
    space += "outside it is refused (docs/certification.md)"
    vf.add_argument("--scale", type=float, help=f"{space}; 255 for raw pixels")
    vf.add_argument("--mean", type=float, nargs="+", help="per channel, after scaling")
    vf.add_argument("--std", type=float, nargs="+", help="per channel, after scaling")
    vf.set_defaults(func=cmd_verify)


def cmd_verify(args: argparse.Namespace) -> int:
    check_arguments(args)
    if args.instances:
        return run_instances(args)
    args.timeout = args.timeout or DEFAULT_TIMEOUT
    try:
        result, cpu = run_instance(args)
        print_answer(result, args, cpu)
        return 0
    except KeyboardInterrupt:  # main's line speaks of a database and --resume: not verify's
        print("interrupted: no answer (verify keeps nothing); run it again", file=sys.stderr)
        return 130


DEFAULT_TIMEOUT = 60.0


def check_arguments(args: argparse.Namespace) -> None:
    """One instance (NET.onnx SPEC.vnnlib) or one benchmark (--instances), never both."""
    given = [p for p in (args.network, args.spec) if p]
    if args.instances and given:
        raise ConfigError(
            f"--instances runs the rows of {args.instances!r}; {given[0]!r} is given too: give "
            "either NET.onnx SPEC.vnnlib or --instances CSV"
        )
    if args.instances and args.timeout:
        raise ConfigError(
            "--timeout with --instances: each row of instances.csv has its own timeout (its "
            "third column; VNN-COMP's scripts have no scale); drop --timeout or edit the rows"
        )
    if not args.instances and len(given) < 2:
        missing = "the VNN-LIB property" if given else "the ONNX network and the VNN-LIB property"
        raise ConfigError(
            f"verify needs {missing}: aisafety verify NET.onnx SPEC.vnnlib, or a benchmark's "
            "rows: aisafety verify --instances instances.csv"
        )


def loaded_registry(args: argparse.Namespace):
    """The plugins' registry; as evaluate: no full collection while torch and the plugins
    load, then all of it frozen (aisafety/cli/collector.py)."""
    with collector.starting(args.whole_process):
        registry = common.default_registry()
        common.print_plugin_failures()  # a verifier it lacks may be a failed plugin's
    return registry


def run_instance(args: argparse.Namespace):
    """The instance's result, and the CPU seconds it took."""
    registry = loaded_registry(args)
    with tempfile.TemporaryDirectory(prefix="aisafety-verify-") as folder:
        network, spec = (unpacked(path, folder) for path in (args.network, args.spec))
        return verified(registry, args, network, spec, args.timeout)


def verified(registry, args: argparse.Namespace, network: str, spec: str, timeout: float):
    """``verify_instance`` with the command's settings: the result, and its CPU seconds."""
    from aisafety.verification.vnncomp import verify_instance

    if args.mean or args.std:
        warn_if_normalised_twice(network)
    declared = {"scale": args.scale, "mean": args.mean, "std": args.std}
    cpu = time.process_time()
    result = verify_instance(
        registry,
        network,
        spec,
        args.verifier,
        timeout,
        config=verifier_config(args),
        declared=declared,
    )
    return result, time.process_time() - cpu


def run_instances(args: argparse.Namespace) -> int:
    """A benchmark's rows (aisafety/cli/benchmark.py), each verified as one instance is."""
    from aisafety.cli.benchmark import run_benchmark

    registry = loaded_registry(args)

    def verify(network: str, spec: str, timeout: float):
        return verified(registry, args, network, spec, timeout)

    return run_benchmark(args.instances, verify, args.out, args.clock)


def print_answer(result, args: argparse.Namespace, cpu: float) -> None:
    """The answer as VNN-COMP tools print it, then the comment lines; with --out, the
    results file, and the terminal keeps the status without the counterexample."""
    answer = "\n".join(filter(None, [result.status, result.counterexample]))
    if args.out:
        try:
            common.write_output(args.out, answer + "\n", "--out")
        except AISafetyError:  # the answer is not lost: printed whole, then the error
            print(f"{answer}\n{summary(result, args, cpu)}")
            raise
        answer = result.status
    print(answer)
    print(summary(result, args, cpu))
    if args.out:
        print(
            f"# written to {args.out}" + " (with the counterexample)" * bool(result.counterexample)
        )


def verifier_config(args: argparse.Namespace) -> dict:
    """The verifier's settings the command sets: its clock, and its memory budget if given
    (the verifier's config checks the value and names it)."""
    config: dict = {"clock": args.clock}
    if args.memory_gib is not None:
        config["memory_gib"] = args.memory_gib
    return config


CLOCK_NAMES = {"wall": "wall", "cpu": "CPU"}


def summary(result, args: argparse.Namespace, cpu: float) -> str:
    """The comment lines after the answer: who answered, both clocks beside the limit and
    the one it counted (a timeout after 60 s of wall time may be 25 s of CPU on a loaded
    machine), the margin bound, and the result's note if it has one."""
    engine = f" ({result.how})" if result.how != args.verifier else ""
    line = (
        f"# {args.verifier}{engine}: {result.seconds:.2f} s wall, {cpu:.2f} s CPU "
        f"(limit {args.timeout:g} s of {CLOCK_NAMES[args.clock]} time, --clock {args.clock}), "
        f"margin bound {result.margin:.4g}"
    )
    return line + (f"\n# note: {result.note}" if result.note not in ("", result.status) else "")


def warn_if_normalised_twice(network: str) -> None:
    """``--mean``/``--std`` on a network whose graph normalises its own input: the box is
    then checked against a range the network is not fed, and the warning on a [0, 1] box
    would advise writing it normalised, which the graph normalises again."""
    from aisafety.errors import AISafetyWarning
    from aisafety.verification.input_space import graph_range

    try:
        own = graph_range(network, 1)
    except Exception:  # not an ONNX file it reads: verify_instance names the problem
        return
    if own is not None:
        warnings.warn(
            f"network {Path(network).name!r}: {own.source} pixels, so --mean/--std "
            "declare a second normalisation before its own (they only set the range the box is "
            "checked against; the network is verified as it is). Drop --mean and --std "
            "for this network, and keep the box in its pixels",
            AISafetyWarning,
            stacklevel=1,
        )
