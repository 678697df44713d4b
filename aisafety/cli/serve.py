"""``aisafety serve``: a model over the Open Inference Protocol v2 (REST)."""

from __future__ import annotations

import argparse


def add_parser(sub) -> None:
    sv = sub.add_parser("serve", help="serve a model over the Open Inference Protocol v2 (REST)")
    sv.add_argument("model", help="zoo model name, .onnx file or TorchScript archive (.pt)")
    sv.add_argument("--host", default="127.0.0.1", help="0.0.0.0 serves the network")
    sv.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    sv.add_argument("--name", help="model name in the URL (default: the model's own name)")
    sv.add_argument("--input-shape", help="C,H,W; needed for TorchScript and flat ONNX inputs")
    sv.add_argument("--num-classes", type=int, help="default: read from the model")
    sv.add_argument("--mean", help="per-channel mean, comma-separated (normalisation)")
    sv.add_argument("--std", help="per-channel std, comma-separated")
    sv.add_argument(
        "--scale", type=float, default=1.0,
        help="the network takes pixels in [0, SCALE] (255 for raw 0..255); clients send [0, 1]",
    )  # fmt: skip
    sv.add_argument(
        "--layout", choices=["nchw", "nhwc"], default="nchw",
        help="nhwc for an ONNX graph taking channels-last [N, H, W, C] images (Keras/TF)",
    )  # fmt: skip
    sv.add_argument("--device", choices=["auto", "cpu", "cuda"], default="cpu")
    sv.add_argument("--max-batch-size", type=int, default=1024)
    sv.add_argument("--quiet", action="store_true", help="do not log requests")
    sv.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    from aisafety.loading import resolve_device, scaled_normalisation
    from aisafety.prediction.server import open_model, parse_numbers, serve

    mean, std = scaled_normalisation(
        parse_numbers(args.mean, "--mean"), parse_numbers(args.std, "--std"), args.scale
    )
    predictor = open_model(
        args.model,
        input_shape=parse_numbers(args.input_shape, "--input-shape", int),
        num_classes=args.num_classes,
        mean=mean,
        std=std,
        device=resolve_device(args.device),
        layout=args.layout,
    )
    serve(
        predictor,
        args.host,
        args.port,
        args.name,
        max_batch_size=args.max_batch_size,
        verbose=not args.quiet,
    )
    return 0
