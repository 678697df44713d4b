"""``aisafety verify``: one VNN-COMP instance (an ONNX network and a VNN-LIB property)."""

from __future__ import annotations

import argparse

from aisafety.cli import common


def add_parser(sub) -> None:
    vf = sub.add_parser("verify", help="verify a VNN-COMP instance: NET.onnx SPEC.vnnlib")
    vf.add_argument("network", help="ONNX network")
    vf.add_argument("spec", help="VNN-LIB property")
    vf.add_argument("--timeout", type=float, default=60.0, help="seconds (default 60)")
    vf.add_argument("--verifier", default="complete", help="see `aisafety list verifiers`")
    vf.set_defaults(func=cmd_verify)


def cmd_verify(args: argparse.Namespace) -> int:
    from aisafety.verification.vnncomp import verify_report

    print(
        verify_report(
            common.default_registry(), args.network, args.spec, args.verifier, args.timeout
        )
    )
    return 0
