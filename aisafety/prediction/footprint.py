"""How much memory one image takes in a model pass, measured once per predictor and network.

Attacks, noisy batches and activation statistics hold one model pass per image at a time;
their chunk size under the memory budget (``aisafety/memory_budget.py``) comes from the
bytes one image costs. A forward pass of one image with autograd on records every tensor
the backward pass would keep (``saved_tensors_hooks``, whatever the model is made of):
their sum is what a backward pass holds at its start, and the largest of them bounds each
single activation. A forward-and-backward pass then peaks at the saved tensors (and a margin)
plus ``GRAD_LIVE`` activation-sized gradients in flight; a forward pass without autograd at
``FORWARD_LIVE`` activations alive at once (a residual block's input, branch and output,
and a convolution's workspace). Both were checked against the peak resident size of real
chunks (``tests/test_memory_budget.py``).

The probe goes to the innermost model, through input-defense wrappers: a random defense's
draws stay untouched, and its own copies are counted by the defense (randomized smoothing's
noisy batch, ``defense/randomized_smoothing.py``). A model that is not a PyTorch
network here (a remote model, onnxruntime) is not probed, which would spend a query: it
costs its input's copies.
"""

from __future__ import annotations

import math

import torch

from aisafety.interfaces import Capability
from aisafety.prediction.base import Predictor

GRAD_LIVE = 8  # activation-sized gradients and temporaries alive in one backward rule
FORWARD_LIVE = 10  # activations alive at once without autograd (convolution workspace too)
# a WRN's backward held the saved tensors and 0.25 of them again; identical runs of one pass
# (16 images, 224x224, tests/test_memory_budget.py) peaked between 429 and 527 MB (allocator
# reuse varies from run to run), up to 1.045x an estimate with 1.25: 1.5 covers them
SAVED_MARGIN = 1.5
INPUT_COPIES = 4  # an attack's own per-image tensors: the input, its copy, gradient, step


def innermost(predictor: Predictor) -> Predictor:
    """The model behind input-defense wrappers (their ``inner``)."""
    while hasattr(predictor, "inner"):
        predictor = predictor.inner  # type: ignore[attr-defined]
    return predictor


def image_bytes(predictor: Predictor, grad: bool) -> int:
    """Estimated peak bytes one image adds to a forward pass of ``predictor``, with its
    backward pass where ``grad``; measured once per network (one forward pass, ``_probe``). Input
    defenses in front of the model add their transform's copies of the input, and an
    attacker's pass through a defense with EOT runs the model on ``eot_samples`` copies."""
    saved, largest = _probe(innermost(predictor))
    input_bytes = 4 * math.prod(predictor.input_shape)
    passes, copies = defense_costs(predictor, grad)
    model = SAVED_MARGIN * saved + GRAD_LIVE * largest if grad else FORWARD_LIVE * largest
    return int(passes * model + (copies + INPUT_COPIES) * input_bytes)


def defense_costs(predictor: Predictor, grad: bool) -> tuple[int, float]:
    """(model passes per input, input-sized copies held) of the input defenses wrapped
    around the model: each declares ``passes(grad)`` and ``transform_copies()``
    (``defense/base.py``); an outer defense's passes repeat the inner ones' work."""
    passes, copies = 1, 0.0
    while hasattr(predictor, "inner"):
        own = getattr(predictor, "passes", lambda grad: 1)(grad)
        copies += passes * own * getattr(predictor, "transform_copies", lambda: 0.0)()
        passes *= own
        predictor = predictor.inner  # type: ignore[attr-defined]
    return passes, copies


def activations_bytes(predictor: Predictor) -> int:
    """Bytes of one image's activations kept at once: what autograd saves of a forward pass,
    an upper estimate of every hidden layer's output (a ReLU saves its output)."""
    return _probe(innermost(predictor))[0] + 4 * math.prod(predictor.input_shape)


def _probe(model: Predictor) -> tuple[int, int]:
    """(bytes of the tensors autograd saves, bytes of the largest one) for one image.

    Kept on the predictor while what it depends on is unchanged: the network's modules
    (which objects, so a layer replaced in place counts), its weights' dtypes, the input
    shape, the device and whether it takes gradients. A predictor handed to
    ``aisafety.evaluate(model=...)`` lives on in the notebook, where its network may be
    edited or its input shape set between runs; a probe kept from before would size chunks
    for the old network. Weight values do not count: they change no tensor's size."""
    key, modules = _probe_key(model)
    entry = model.__dict__.get("_footprint")
    if entry is None or entry[0] != key:  # the entry holds the modules: their ids stay theirs
        entry = model.__dict__["_footprint"] = (key, modules, _measure(model))
    return entry[2]


def _probe_key(model: Predictor) -> tuple[tuple, list[torch.nn.Module]]:
    network = getattr(model, "network", None)
    modules = list(network.modules()) if isinstance(network, torch.nn.Module) else []
    dtypes = frozenset(t.dtype for m in modules for t in m.parameters(recurse=False))
    grad = Capability.GRADIENTS in model.capabilities
    shape = tuple(model.input_shape)
    return (tuple(map(id, modules)), dtypes, shape, str(model.device), grad), modules


def _measure(model: Predictor) -> tuple[int, int]:
    if not isinstance(getattr(model, "network", None), torch.nn.Module):
        return 0, 0  # evaluated elsewhere (a server, onnxruntime): no query spent on it
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        if not isinstance(tensor, torch.nn.Parameter) and tensor.layout == torch.strided:
            storage = tensor.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
        # not the tensor itself: it would hold its own autograd node, which holds it (a
        # cycle through C++ the collector cannot see), keeping the probe's graph and the
        # model's weights alive after the model (tests/test_probe_frees_the_model.py)
        return tensor.detach()

    grad = Capability.GRADIENTS in model.capabilities  # others may refuse a graph input
    x = torch.full((1, *model.input_shape), 0.5, device=model.device, requires_grad=grad)
    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model.logits(x)
    weights = {p.untyped_storage().data_ptr() for p in _parameters(model)}
    sizes = [n for ptr, n in storages.items() if ptr not in weights]
    return sum(sizes), max(sizes, default=0)


def _parameters(model: Predictor) -> list[torch.Tensor]:
    """The model's weights and buffers, which autograd saves but which do not grow with the
    batch."""
    module = getattr(model, "module", None)
    if isinstance(module, torch.nn.Module):
        return [*module.parameters(), *module.buffers()]
    return []
