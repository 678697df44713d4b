"""Root bounds of the Marabou CIFAR conjunctions: ours beside auto_LiRPA's, row by row.

    OMP_NUM_THREADS=1 PYTHONPATH=$PWD /work/venv-lirpa/bin/python bench/marabou_root_lirpa.py \
        networkcifar10_small_index1442_eps0.012_target4_orig3.vnnlib [...] [--samples 2000]
        [--lirpa-steps 20 100] [--no-lirpa]

Per instance (VNN-COMP 2021 marabou-cifar10: one disjunct ``Y_t >= Y_j`` for the nine j),
the same box and the same nine rows ``Y_j - Y_t`` (``vnncomp.rows_property``: the atom holds
where the row is <= 0) bounded from below, the way ``vnncomp._verify_conjunctions`` combines
them: each row on its own, the disjunct refuted when one row's bound is > 0 (so the
instance's root margin is the largest row bound). Columns:

- ours: ``crown`` (and ``crown f64``: every pass in float64, no rounding margin),
  ``alpha-crown`` as shipped (layer by layer, 20 steps, ``search_work`` 3e7),
  ``alpha-crown`` with ``joint: true`` (every layer's slopes for the rows' bound,
  auto_LiRPA's scheme: its default 75 steps at lr 0.1, and ``joint-20``/``joint-100``: 20
  and 100 steps at auto_LiRPA's lr 0.5) and ``bab``'s root (alpha-CROWN, then
  ``root_steps`` 100 on the output slopes), all in the network's own input space (NHWC
  [0, 1] pixels);
- auto_LiRPA (``/work/venv-lirpa``; commit printed): ``CROWN`` and ``CROWN-Optimized``
  (``--lirpa-steps`` iterations each, lr 0.5, its defaults otherwise) on
  ``bench/abcrown/onnx_net.py``'s module (the ONNX graph replayed node by node, checked
  against onnxruntime), the spec ``C`` the same rows, the offset added after;
- the least value of each row over the box's centre, ``--samples`` uniform points and as
  many random corners, and box-PGD's on that row alone (200 steps, 5 restarts), both
  through onnxruntime: every sound bound of the row lies below both; and the objective's
  (the largest row: sampled, and at box-PGD's point on it).

One thread. Say the load beside it.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from aisafety.verification import rounding
from aisafety.verification.bab import BabVerifier
from aisafety.verification.bounds import search_slopes, sound_backward
from aisafety.verification.falsify import into_box, pgd_on_rows
from aisafety.verification.float64_margin import added_down
from aisafety.verification.incomplete import AlphaCrownVerifier, CrownVerifier
from aisafety.verification.property import Property
from aisafety.verification.vnncomp import load_network, prop_row, rows_property
from aisafety.verification.vnnlib import read_disjuncts

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "testkit"))
from shared_location import shared_data  # noqa: E402


def marabou_folder() -> Path:
    return shared_data("cifar10-models") / "vnncomp2021_marabou_cifar10"


def instance(spec_name: str):
    """(onnx path, network, property of the one disjunct's rows) of a marabou-cifar10 spec."""
    folder = marabou_folder()
    spec = next(folder.rglob(spec_name))
    onnx_path = folder / f"{spec_name.split('_')[0].removeprefix('network')}_" \
        f"{spec_name.split('_')[1]}.onnx"  # fmt: skip
    net = load_network(str(onnx_path))
    box, disjuncts = read_disjuncts(spec, math.prod(net.shape), net.reference.num_classes)
    assert len(disjuncts) == 1, "marabou-cifar10 properties are one conjunction"
    lower, upper = (b.reshape(1, *net.shape).double() for b in box)
    return onnx_path, net, rows_property(lower, upper, disjuncts[0])


def ours(net, prop, name: str, precision: str = "auto") -> tuple[torch.Tensor, float]:
    """One of our root bounds of every row (offset added, rounded down) and its CPU s."""
    graph = net.graph
    verifier = {
        "crown": lambda: CrownVerifier(),
        "alpha": lambda: AlphaCrownVerifier(),
        "alpha-joint": lambda: AlphaCrownVerifier({"joint": True}),
        "bab-root": lambda: BabVerifier({"timeout": 1e6}),
        **{
            f"joint-{n}": (
                lambda n=n: AlphaCrownVerifier({"joint": True, "joint_steps": n, "lr": 0.5})
            )
            for n in (20, 100)
        },
    }[name]()
    verifier.prepare()
    start = time.process_time()
    typed = prop.to(graph.dtype)
    with torch.no_grad(), rounding.pass_precision(precision):
        if name == "bab-root":
            bound = bab_root(verifier, graph, typed)
        else:
            bound, _ = verifier.lower_bounds(graph, typed)
            bound = added_down(bound.double(), prop.offset)
    return bound[0], time.process_time() - start


def bab_root(verifier: BabVerifier, graph, prop) -> torch.Tensor:
    """``bab``'s root: alpha-CROWN, then ``root_steps`` on the open rows' output slopes
    (as ``bab.Search``'s root: one search and its sound pass for all open rows)."""
    config = verifier.config
    root = verifier.bounds_and_boxes(graph, prop)
    bound = added_down(root.bound.double(), prop.offset)[0]
    rows = torch.nonzero(bound <= 0).flatten()
    end = len(graph.ops) - 1
    a = prop.spec[:, rows].reshape(1, len(rows), *graph.ops[-1].out_shape).to(graph.dtype)
    with torch.enable_grad():
        chosen = search_slopes(graph, end, a, root.boxes, config.root_steps, config.root_lr,
                               config.root_decay)  # fmt: skip
    slopes = {i: t.to(graph.dtype) for i, t in chosen.items()}
    better = sound_backward(graph, end, a, root.boxes, slopes=slopes)[0][0]
    better = added_down(better.double(), prop.offset[0, rows])
    bound[rows] = torch.maximum(bound[rows], better)
    return bound[None]


def lirpa(onnx_path: Path, prop, method: str, steps: int) -> tuple[torch.Tensor, float]:
    """auto_LiRPA's ``method`` lower bound of every row (offset added) and its CPU s."""
    from auto_LiRPA import BoundedModule, BoundedTensor
    from auto_LiRPA.perturbations import PerturbationLpNorm

    onnx_net = load_module(HERE / "abcrown" / "onnx_net.py")
    model = onnx_net.OnnxNet(onnx_net.read_onnx(str(onnx_path))).eval()
    lo, hi = prop.lower.float(), prop.upper.float()
    error = onnx_net.check_against_onnxruntime(str(onnx_path), model, (lo + hi)[0] / 2)
    assert error < 1e-4, f"onnx_net differs from onnxruntime by {error}"
    options = {"optimize_bound_args": {"iteration": steps, "lr_alpha": 0.5}}
    bounded = BoundedModule(model, torch.zeros_like(lo), device="cpu", verbose=False,
                            bound_opts=options)  # fmt: skip
    x = BoundedTensor((lo + hi) / 2, PerturbationLpNorm(x_L=lo, x_U=hi))
    start = time.process_time()
    with torch.no_grad() if method == "CROWN" else torch.enable_grad():
        bound, _ = bounded.compute_bounds(
            x=(x,), C=prop.spec.float(), method=method, bound_upper=False
        )
    return bound.detach().double()[0] + prop.offset[0], time.process_time() - start


def load_module(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pgd_least(net, prop) -> tuple[torch.Tensor, float]:
    """Each row's least value found by box-PGD on that row alone (200 steps, 5 restarts,
    from the centre and two corners), and the objective (largest row) at the point PGD on
    the largest row finds, both replayed through onnxruntime: upper bounds of the minima."""
    graph = net.graph

    def rows_at(x: torch.Tensor) -> torch.Tensor:
        return prop.expand(len(x)).rows(net.run(x).double())

    least = []
    for k in range(prop.spec.shape[1]):
        one = prop_row(prop, k)
        point = into_box(pgd_on_rows(lambda x: graph.forward(x.to(graph.dtype)), one,
                                     steps=200, restarts=5, corners=True), one)  # fmt: skip
        least.append(float(rows_at(point)[0, k]))

    def largest_row(x: torch.Tensor) -> torch.Tensor:
        return prop.rows(graph.forward(x.to(graph.dtype))).amax(1, keepdim=True)

    single = Property(prop.lower, prop.upper, prop.spec.new_ones(1, 1, 1), prop.offset[:, :1] * 0)
    point = into_box(pgd_on_rows(largest_row, single, steps=200, restarts=5, corners=True), prop)
    return torch.tensor(least, dtype=torch.float64), float(rows_at(point).amax())


def sampled_least(net, prop, n: int) -> tuple[torch.Tensor, float]:
    """Each row's least value, and the objective's (largest row), at the centre, ``n``
    uniform points and ``n`` corners."""
    draws = torch.rand(2 * n, *prop.lower.shape[1:], dtype=torch.float64)
    draws[n:] = draws[n:].round()
    width = prop.upper - prop.lower
    points = torch.cat([(prop.lower + prop.upper) / 2, prop.lower + width * draws])
    least = torch.full((prop.spec.shape[1],), math.inf, dtype=torch.float64)
    objective = math.inf
    for chunk in points.split(200):
        rows = prop.expand(len(chunk)).rows(net.run(chunk).double())
        least = torch.minimum(least, rows.amin(0))
        objective = min(objective, float(rows.amax(1).min()))
    return least, objective


def lirpa_commit() -> str:
    import auto_LiRPA

    folder = Path(auto_LiRPA.__file__).resolve().parents[1]
    try:
        out = subprocess.run(["git", "-C", str(folder), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, check=True)  # fmt: skip
        return out.stdout.strip()
    except (subprocess.CalledProcessError, FileNotFoundError):
        return f"{folder.name} {auto_LiRPA.__version__}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("specs", nargs="+", help="marabou-cifar10 .vnnlib names")
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--lirpa-steps", type=int, nargs="+", default=[20, 100])
    parser.add_argument("--no-lirpa", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text()
                .splitlines() if line.startswith("model name")), "?")  # fmt: skip
    print(f"# CPU {cpu}; load {os.getloadavg()[0]:.1f}; torch {torch.__version__}; "
          f"auto_LiRPA {'-' if args.no_lirpa else lirpa_commit()}")  # fmt: skip
    for name in args.specs:
        onnx_path, net, prop = instance(name)
        columns: dict[str, tuple[torch.Tensor, float]] = {}
        for kind in ("crown", "alpha", "alpha-joint", "joint-20", "joint-100", "bab-root"):
            columns[f"ours {kind}"] = ours(net, prop, kind)
        columns["ours crown f64"] = ours(net, prop, "crown", "float64")
        if not args.no_lirpa:
            columns["lirpa CROWN"] = lirpa(onnx_path, prop, "CROWN", 0)
            for steps in args.lirpa_steps:
                columns[f"lirpa alpha {steps}"] = lirpa(onnx_path, prop, "CROWN-Optimized", steps)
        least, sampled = sampled_least(net, prop, args.samples)
        columns["sampled least"] = (least, 0.0)
        pgd, objective = pgd_least(net, prop)
        columns["PGD least"] = (pgd, 0.0)
        print(f"\n{name} (load {os.getloadavg()[0]:.1f})")
        targets = [int(c.argmin()) for c in prop.spec[0]]
        print("row       " + "".join(f"{k:>17}" for k in columns))
        for r, j in enumerate(int(c.argmax()) for c in prop.spec[0]):
            label = f"Y{j}-Y{targets[r]}"
            print(f"{label:<10}" + "".join(f"{float(v[r]):17.4f}" for v, _ in columns.values()))
        print("max       " + "".join(f"{float(v.max()):17.4f}" for v, _ in columns.values()))
        print("CPU s     " + "".join(f"{s:17.2f}" for _, s in columns.values()))
        print(
            f"objective (largest row): least sampled {sampled:.4f}, at box-PGD's point "
            f"on it {objective:.4f}"
        )


if __name__ == "__main__":
    main()
