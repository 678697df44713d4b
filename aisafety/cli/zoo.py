"""``aisafety zoo list|train``: the zoo's entries, and training one from a recipe."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from aisafety.cli import common
from aisafety.cli.list import cmd_list
from aisafety.errors import ConfigError

if TYPE_CHECKING:
    from aisafety.database.zoo import TrainingRecipe


# Recipe fields for the optimiser, schedule and kept epoch (``TrainingRecipe``): option, type,
# help. They reproduce trainings like the SoK's (SGD, step lr, best epoch on the test set).
SCHEDULE_OPTIONS: dict[str, tuple[type, str]] = {
    "optimizer": (str, "adam (default) or sgd"),
    "momentum": (float, "SGD momentum (default 0)"),
    "weight_decay": (float, "default 0"),
    "lr_schedule": (str, "one-cycle (default) or step: lr x --lr-decay every --lr-decay-every"),
    "lr_decay": (float, "the step schedule's factor (default 0.1)"),
    "lr_decay_every": (int, "the step schedule's period in epochs (default 10)"),
    "lr_decay_from": (int, "the step schedule counts periods from this epoch (0-based; default 0)"),
    "keep": (str, "last (default) or best-test: the epoch scoring best on the TEST set"),
}


def add_parser(sub) -> None:
    zoo = sub.add_parser("zoo", help="train or list zoo models")
    zsub = zoo.add_subparsers(dest="zoo_command", required=True)
    zl = zsub.add_parser("list")
    zl.add_argument("--format", choices=["table", "json"], default="table")
    zt = zsub.add_parser("train", help="train a zoo model from a dataset folder")
    zt.add_argument("--data-dir", required=True, help="folder of the dataset's files")
    zt.add_argument(
        "--recipe-of", metavar="ZOO_MODEL",
        help="start from this zoo entry's recipe (reproduce it); other options override it",
    )  # fmt: skip
    zt.add_argument("--dataset", help="default mnist")
    zt.add_argument("--name", help="entry name (default: --recipe-of's, else mnist-cnn)")
    zt.add_argument("--architecture", help="default mnist-cnn")
    zt.add_argument("--out", default="zoo", help="folder for checkpoint + manifest.json")
    zt.add_argument(
        "--defense", help="a training defense: aisafety list defenses (default standard)"
    )
    zt.add_argument("--defense-config", help='JSON settings, e.g. \'{"eps": 0.3, "steps": 10}\'')
    zt.add_argument("--epochs", type=int, help="default 3")
    zt.add_argument("--batch-size", type=int, help="default 128")
    zt.add_argument("--lr", type=float, help="default 1e-3 (Adam, one-cycle schedule)")
    zt.add_argument("--seed", type=int, help="default 0")
    for field, (kind, text) in SCHEDULE_OPTIONS.items():
        zt.add_argument(f"--{field.replace('_', '-')}", type=kind, help=text)
    zt.add_argument("--mean", type=float, nargs="+", help="per-channel input mean (MNIST's)")
    zt.add_argument("--std", type=float, nargs="+", help="per-channel input std (MNIST's)")
    zt.add_argument("--init-from", help="zoo model to fine-tune from (pinned by sha256)")
    zt.add_argument(
        "--robust-eps", type=float, nargs="*",
        help="l-inf budgets for PGD-40 robust accuracy on 1,000 test images (default: the "
        "training eps)",
    )  # fmt: skip
    zt.add_argument(
        "--certified-eps", type=float, nargs="*",
        help="l-inf budgets for IBP-certified accuracy on the same images (default: the "
        "training eps for ibp / crown-ibp, none otherwise)",
    )  # fmt: skip
    zt.add_argument(
        "--robust-every", type=int, metavar="K",
        help="measure robustness on every K-th of the 1,000 images only (costly defenses; "
        "default: --recipe-of's recorded value, else 1)",
    )  # fmt: skip
    zt.add_argument("--quiet", action="store_true")
    zoo.set_defaults(func=cmd_zoo)


def cmd_zoo(args: argparse.Namespace) -> int:
    if args.zoo_command == "list":
        listing = {"kind": "models", "format": args.format, "whole_process": args.whole_process}
        return cmd_list(argparse.Namespace(**listing))
    from aisafety.interfaces import DatasetSpec
    from aisafety.loading import load_data
    from aisafety.zoo_build import train_zoo_entry

    recipe, robust_eps, certified_eps = zoo_recipe(args)
    registry = common.default_registry()
    train_set = load_data(
        DatasetSpec(name=recipe.dataset, path=args.data_dir, split="train"), registry
    )
    test_set = load_data(
        DatasetSpec(name=recipe.dataset, path=args.data_dir, split="test"), registry
    )
    name = args.name or args.recipe_of or "mnist-cnn"
    entry = train_zoo_entry(
        name, recipe, train_set, test_set, Path(args.out), args.quiet, robust_eps, certified_eps,
        zoo_robust_every(args),
    )  # fmt: skip
    measured = ", ".join(
        f"{key} {value:.4f}" for key, value in entry.metrics.items() if "accuracy" in key
    )
    print(
        f"trained {entry.name}: {measured} ({len(test_set)} test images; robustness on "
        f"{entry.metrics.get('robust_samples', 0):.0f}); wrote {Path(args.out) / entry.file} "
        f"(sha256 {entry.sha256[:12]}…)"
    )
    print(f"use it with: AISAFETY_ZOO_PATH={args.out} aisafety evaluate ...")
    return 0


def zoo_recipe(
    args: argparse.Namespace,
) -> tuple[TrainingRecipe, list[float] | None, list[float] | None]:
    """The recipe ``zoo train`` runs: ``--recipe-of``'s (a shipped entry's, to reproduce it)
    or the defaults, with every option given on the command line overriding it; and the
    robust and certified budgets (``--robust-eps`` / ``--certified-eps``, else the entry's
    recorded ones, else None: the training defaults)."""
    from aisafety.database.zoo import TrainingRecipe
    from aisafety.zoo_build import CERTIFIED, ROBUST, recorded_budgets, zoo_entry

    base, recorded = TrainingRecipe(), {}
    if args.recipe_of is not None:
        entry = zoo_entry(args.recipe_of)
        base = entry.recipe
        recorded = {kind: recorded_budgets(entry, kind) for kind in (ROBUST, CERTIFIED)}
    given = {
        field: getattr(args, field)
        for field in (
            "architecture",
            "dataset",
            "defense",
            "epochs",
            "batch_size",
            "lr",
            "seed",
            *SCHEDULE_OPTIONS,
        )  # fmt: skip
        if getattr(args, field) is not None
    }
    if args.defense_config is not None:
        given["defense_config"] = parse_json_option("--defense-config", args.defense_config)
    if args.init_from is not None:
        given |= {"init_from": args.init_from, "init_sha256": None}
    for field in ("mean", "std"):
        if getattr(args, field) is not None:
            given[field] = tuple(getattr(args, field))
    recipe = TrainingRecipe(**{**base.model_dump(), **given})
    robust = args.robust_eps if args.robust_eps is not None else recorded.get(ROBUST)
    certified = args.certified_eps if args.certified_eps is not None else recorded.get(CERTIFIED)
    return recipe, robust, certified


def zoo_robust_every(args: argparse.Namespace) -> int:
    """``--robust-every``, else the value ``--recipe-of``'s entry was measured with, else 1."""
    if args.robust_every is not None:
        return args.robust_every
    if args.recipe_of is None:
        return 1
    from aisafety.zoo_build import recorded_robust_every, zoo_entry

    return recorded_robust_every(zoo_entry(args.recipe_of))


def parse_json_option(option: str, text: str) -> dict:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        example = '{"eps": 0.3}'
        raise ConfigError(f"{option} is not JSON ({exc}); e.g. '{example}'") from None
