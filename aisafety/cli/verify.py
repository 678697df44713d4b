"""``aisafety verify``: one VNN-COMP instance (an ONNX network and a VNN-LIB property)."""

from __future__ import annotations

import argparse
import math

from aisafety.cli import collector, common


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
    vf.add_argument("--timeout", type=seconds, default=60.0, help="seconds (default 60)")
    vf.add_argument("--verifier", default="complete", help="see `aisafety list verifiers`")
    space = "what the network is fed, (pixels * scale - mean) / std, pixels in [0, 1]: a box "
    space += "outside it is refused (docs/certification.md)"
    vf.add_argument("--scale", type=float, help=f"{space}; 255 for raw pixels")
    vf.add_argument("--mean", type=float, nargs="+", help="per channel, after scaling")
    vf.add_argument("--std", type=float, nargs="+", help="per channel, after scaling")
    vf.set_defaults(func=cmd_verify)


def cmd_verify(args: argparse.Namespace) -> int:
    from aisafety.verification.vnncomp import verify_report

    declared = {"scale": args.scale, "mean": args.mean, "std": args.std}
    # as evaluate: no full collection while torch and the plugins load, then all of it
    # frozen (aisafety/cli/collector.py)
    with collector.starting(args.whole_process):
        registry = common.default_registry()
        common.print_plugin_failures()  # a verifier it lacks may be a failed plugin's
    print(
        verify_report(
            registry,
            args.network,
            args.spec,
            args.verifier,
            args.timeout,
            declared=declared,
        )
    )
    return 0
