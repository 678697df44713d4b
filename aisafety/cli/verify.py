"""``aisafety verify``: one VNN-COMP instance (an ONNX network and a VNN-LIB property)."""

from __future__ import annotations

import argparse
import gzip
import math
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

from aisafety.cli import collector, common
from aisafety.errors import AISafetyError


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
    vf = sub.add_parser("verify", help="verify a VNN-COMP instance: NET.onnx SPEC.vnnlib")
    vf.add_argument("network", help="ONNX network")
    vf.add_argument("spec", help="VNN-LIB property")
    vf.add_argument(
        "--timeout",
        type=seconds,
        default=60.0,
        help="seconds for the instance, counted on --clock (default 60)",
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
        "counterexample; the terminal then shows the status without it",
    )
    space = "what the network is fed, (pixels * scale - mean) / std, pixels in [0, 1]: a box "
    space += "outside it is refused (docs/certification.md)"
    vf.add_argument("--scale", type=float, help=f"{space}; 255 for raw pixels")
    vf.add_argument("--mean", type=float, nargs="+", help="per channel, after scaling")
    vf.add_argument("--std", type=float, nargs="+", help="per channel, after scaling")
    vf.set_defaults(func=cmd_verify)


def cmd_verify(args: argparse.Namespace) -> int:
    try:
        result, cpu = run_instance(args)
        print_answer(result, args, cpu)
        return 0
    except KeyboardInterrupt:  # main's line speaks of a database and --resume: not verify's
        print("interrupted: no answer (verify keeps nothing); run it again", file=sys.stderr)
        return 130


def run_instance(args: argparse.Namespace):
    """The instance's result, and the CPU seconds it took."""
    from aisafety.verification.vnncomp import verify_instance

    declared = {"scale": args.scale, "mean": args.mean, "std": args.std}
    # as evaluate: no full collection while torch and the plugins load, then all of it
    # frozen (aisafety/cli/collector.py)
    with collector.starting(args.whole_process):
        registry = common.default_registry()
        common.print_plugin_failures()  # a verifier it lacks may be a failed plugin's
    if args.mean or args.std:
        warn_if_normalised_twice(args.network)
    with tempfile.TemporaryDirectory(prefix="aisafety-verify-") as folder:
        network, spec = (unpacked(path, folder) for path in (args.network, args.spec))
        cpu = time.process_time()
        result = verify_instance(
            registry,
            network,
            spec,
            args.verifier,
            args.timeout,
            config=verifier_config(args),
            declared=declared,
        )
    return result, time.process_time() - cpu


def unpacked(path: str, folder: str) -> str:
    """``path``, or where a gzip-compressed file is unpacked (named without ``.gz``):
    VNN-COMP's benchmark repositories since 2022 ship ``net.onnx.gz`` and ``prop.vnnlib.gz``
    (alpha-beta-CROWN reads such a network directly, onnx.load(gzip.GzipFile(path))); read
    as they were, they were refused as 'not an ONNX model' and 'not text (a network given as
    the property?)'."""
    source = Path(path)
    try:
        with source.open("rb") as file:
            if file.read(2) != b"\x1f\x8b":
                return path
    except OSError:  # missing, a folder, unreadable: verify_instance names it
        return path
    target = Path(folder) / source.name.removesuffix(".gz")
    with gzip.open(source) as packed, target.open("wb") as out:
        shutil.copyfileobj(packed, out)
    return str(target)


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
