"""What of a model outlives its evaluation: the checker of tests/test_evaluation_frees_models.py.

A notebook evaluates one model after another in one process; whatever a run keeps of a
model after it returns (a cache keyed by the network, a hook, an autograd graph in a cycle
through C++ that Python's collector cannot see) grows the process, and on a GPU the card's
memory, by about the model's weights per evaluation. ``evaluate_and_drop`` runs
``aisafety.evaluate`` on a fresh network, drops it, collects, and names what is still
alive: the network's weights (weak references), the reference model's (built by
``reference_net`` below, through a plan's ``python`` source) and any tensor with an
autograd node (``gc.get_objects()``; a tensor held only from C++ is caught by the
weights' weak references, which its graph holds).
"""

from __future__ import annotations

import gc
import weakref
from pathlib import Path
from typing import Any

import torch
from torch import nn

TESTKIT = Path(__file__).resolve().parent
BUILT: list[weakref.ref] = []  # the weights of every reference net built (reference_net)


def tiny_net(num_classes: int = 10) -> nn.Module:
    """A tiny 3x8x8 conv net (a BatchNorm's buffers too) whose evaluation takes milliseconds."""
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, 1, 1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
        nn.Linear(4 * 8 * 8, 16), nn.ReLU(), nn.Linear(16, num_classes),
    ).eval()  # fmt: skip


def reference_net() -> nn.Module:
    """``tiny_net`` for a plan's ``reference_model`` (source ``python``); its weights are
    recorded in ``BUILT`` so the checker can tell whether the run let them go."""
    net = tiny_net()
    BUILT.extend(weakref.ref(t) for t in (*net.parameters(), *net.buffers()))
    return net


REFERENCE = {"source": "python", "name": "tiny-reference", "factory": "model_leaks:reference_net",
             "python_path": [str(TESTKIT)], "input_shape": [3, 8, 8],
             "num_classes": 10}  # fmt: skip


def graph_tensors() -> list[torch.Tensor]:
    """Every tensor the collector tracks that holds an autograd node."""
    tensors = [obj for obj in gc.get_objects() if isinstance(obj, torch.Tensor)]
    return [t for t in tensors if getattr(t, "grad_fn", None) is not None]


def evaluate_and_drop(plan: dict[str, Any], db: str) -> list[str]:
    """Evaluate ``plan`` on a fresh ``tiny_net`` (and data 4 images of 3x8x8), drop the
    model, collect, and return what is still alive (empty when nothing is)."""
    import aisafety
    from aisafety.prediction.torch_module import TorchPredictor

    BUILT.clear()
    before = {id(t) for t in graph_tensors()}
    torch.manual_seed(0)
    module = tiny_net()
    weights = [weakref.ref(t) for t in (*module.parameters(), *module.buffers())]
    data = (torch.rand(4, 3, 8, 8), torch.tensor([0, 1, 2, 3]))
    record = aisafety.evaluate(plan, db=db, model=TorchPredictor(module, (3, 8, 8), 10), data=data)
    del module
    gc.collect()
    left = []
    if any(w() is not None for w in weights):
        left.append(f"{sum(w() is not None for w in weights)} of {len(weights)} weights")
    if any(w() is not None for w in BUILT):
        left.append(f"{sum(w() is not None for w in BUILT)} reference weights")
    graphs = [t for t in graph_tensors() if id(t) not in before]
    if graphs:
        left.append(f"{len(graphs)} tensors with a graph ({graphs[0].grad_fn})")
    if record.failed_units:
        left.append(f"failed units {record.failed_units}")
    return left
