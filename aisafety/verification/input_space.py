"""Does a VNN-LIB box lie in the input space of the network it is verified on?

A box written for another input space is verified without complaint and answers another
question: [0, 1] pixels against a network fed normalised inputs ((x - mean) / std, about
[-2, 2.1] for CIFAR-10) is a grey, low-contrast image; a normalised box against a network
that normalises itself holds inputs no image gives; an eps written in 0..255 units (8 for
8/255) covers every input the network can see. The box itself cannot say which space it was
written in, so the network's range comes from one of two places:

- the user's declaration (``aisafety verify --scale/--mean/--std``, as a plan's ``onnx``
  model: the network is fed ``(pixels * scale - mean) / std``, pixels in [0, 1]);
- the graph's own normalisation: its input goes first through ``Sub`` by a nonzero constant
  and then ``Div`` (or ``Mul``) by a constant, so it is fed pixels, in [0, 1] where that mean
  is at most 1 and in [0, 255] where it is larger (the ERAN sigmoid net: Sub 0.1307, Div 0.3081).

With a range, a box that misses it on some input by more than a tenth of its width, or is
wider than the whole range there and reaches that far beyond both its ends, is refused
(``VerificationError``: one line naming the file, the input, its values, the range and the
fix). Weaker evidence is a warning: a box centred in [0, 1] where the range reaches well
beyond it (below -0.5: a normalised image is negative wherever a pixel is darker than the
mean; above 2: 0..255 pixels); with no range known, a box wider than the spread of the values
it is centred on; and a box whose centre reads as an image in the other channel order of a
3-channel input; and a robustness property whose class the network does not give at the
box's centre (``check_centre_class``). Every VNN-COMP property of ``../shared/data`` passes
without any of them (docs/certification.md, bench/input_space.py).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from aisafety.errors import AISafetyWarning
from aisafety.interfaces import mean_problem
from aisafety.verification.graph import VerificationError

FAR = 0.1  # of the range's width: how far beyond it a box must lie to be refused
DECLARE = "--scale, --mean and --std"


@dataclass(frozen=True)
class InputRange:
    """What the network is fed, per flat input in its own layout, and who says so."""

    lower: torch.Tensor
    upper: torch.Tensor
    source: str


def declared_range(
    graph_shape: list, n_inputs: int, scale: float | None = None, mean=None, std=None
) -> InputRange | None:
    """The range ``--scale/--mean/--std`` declare, or None when none is given.

    ``graph_shape`` (the ONNX input's dimensions) places per-channel values: channels
    second (NCHW) or last (NHWC)."""
    if scale is None and mean is None and std is None:
        return None
    scale = 1.0 if scale is None else scale
    if not (math.isfinite(scale) and scale > 0):
        raise VerificationError(f"--scale must be a positive, finite number, got {scale:g}")
    if mean is not None and not all(math.isfinite(m) for m in mean):
        raise VerificationError(f"--mean must be finite numbers, got {list(mean)}")
    if std is not None and any(not (math.isfinite(s) and s > 0) for s in std):
        raise VerificationError(f"--std must be positive, finite numbers, got {list(std)}")
    if problem := mean_problem(mean, std, scale):
        raise VerificationError(f"--mean: {problem}".replace("scale: 255", "--scale 255"))
    m = _per_input(mean or [0.0], graph_shape, n_inputs, "--mean")
    s = _per_input(std or [1.0], graph_shape, n_inputs, "--std")
    said = [f"--scale {scale:g}"] if scale != 1 or not (mean or std) else []
    said += [f"{flag} {' '.join(f'{v:g}' for v in values)}"
             for flag, values in (("--mean", mean), ("--std", std)) if values]  # fmt: skip
    return InputRange((0 - m) / s, (scale - m) / s, " ".join(said))


def _per_input(values, graph_shape: list, n_inputs: int, flag: str) -> torch.Tensor:
    """Per-channel ``values`` spread over the flat inputs of a (N, C, H, W) or (N, H, W, C)
    graph input; one value applies to every input."""
    v = torch.tensor(list(values), dtype=torch.float64)
    if len(v) == 1:
        return v.expand(n_inputs)
    dims = [d if isinstance(d, int) and d > 0 else 1 for d in graph_shape]
    if len(dims) == 4 and dims[1] == len(v):
        return v.repeat_interleave(n_inputs // len(v))
    if len(dims) == 4 and dims[-1] == len(v):
        return v.repeat(n_inputs // len(v))
    raise VerificationError(
        f"{flag} has {len(v)} values, but the network's input {graph_shape} has no channel "
        f"dimension of {len(v)} (second or last); give one value, or one per channel"
    )


def graph_range(path: str | Path, n_inputs: int) -> InputRange | None:
    """[0, 1] or [0, 255] where the graph normalises its own input (``Sub`` by a nonzero
    constant, then ``Div``/``Mul`` by a constant); None otherwise (nothing to go by)."""
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(path), load_external_data=False).graph
    constants = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            constants[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    source = next(i.name for i in graph.input if i.name not in constants)  # old opsets list
    first = [n for n in graph.node if source in n.input]
    if len(first) != 1 or first[0].op_type != "Sub" or first[0].input[0] != source:
        return None
    mean = constants.get(first[0].input[1])
    after = [n for n in graph.node if first[0].output[0] in n.input]
    divides = len(after) == 1 and after[0].op_type in ("Div", "Mul")
    if mean is None or not divides or after[0].input[1] not in constants:
        return None
    top = float(abs(mean).max())
    if top == 0 or top > 255:
        return None
    scale = 1.0 if top <= 1 else 255.0
    lower = torch.zeros(n_inputs, dtype=torch.float64)
    why = f"its own normalisation (Sub {top:g}, then {after[0].op_type}) takes [0, {scale:g}]"
    return InputRange(lower, lower + scale, why)


def check_box(
    lower: torch.Tensor,
    upper: torch.Tensor,
    known: InputRange | None,
    name: str,
    graph_shape: list | None = None,
) -> None:
    """Refuse a box outside ``known`` (or far wider than it); warn on weaker evidence,
    among it a box whose centre reads as an image in the other channel order of a 3-channel
    ``graph_shape`` (``_warn_if_other_layout``)."""
    if graph_shape is not None:
        _warn_if_other_layout((lower + upper) / 2, graph_shape, name)
    if known is None:
        _warn_if_wider_than_its_values(lower, upper, name)
        return
    width = known.upper - known.lower
    far = FAR * width
    outside = (lower > known.upper + far) | (upper < known.lower - far)
    if outside.any():
        i = int(outside.nonzero()[0])
        raise VerificationError(
            f"VNN-LIB file {name!r}: X_{i} lies in [{float(lower[i]):.4g}, "
            f"{float(upper[i]):.4g}], outside the network's input range "
            f"[{float(known.lower[i]):.4g}, {float(known.upper[i]):.4g}] ({known.source}), "
            f"as do {int(outside.sum())} of {len(lower)} inputs: a box written for another "
            f"input space. Write the box in the network's own input space, or declare what "
            f"the network takes with {DECLARE}"
        )
    wide = (upper - lower > width + 2 * far) & (lower < known.lower - far)
    wide &= upper > known.upper + far
    if wide.any():
        i = int(wide.nonzero()[0])
        half = float(upper[i] - lower[i]) / 2
        raise VerificationError(
            f"VNN-LIB file {name!r}: X_{i} spans [{float(lower[i]):.4g}, "
            f"{float(upper[i]):.4g}], wider than the network's whole input range "
            f"[{float(known.lower[i]):.4g}, {float(known.upper[i]):.4g}] ({known.source}): an "
            f"eps in another unit ({half:g} in 0..255 units is {half / 255:.4g} in [0, 1])? "
            f"Write eps in the network's own input units"
        )
    lowest, highest = float(known.lower.min()), float(known.upper.max())
    centre = (lower + upper) / 2
    in_pixels = float(centre.min()) >= 0 and float(centre.max()) <= 1
    if in_pixels and (lowest < -0.5 or highest > 2):
        warnings.warn(
            f"VNN-LIB file {name!r}: the box is centred in [0, 1], a small part of "
            f"the network's input range [{lowest:.4g}, {highest:.4g}] ({known.source}): a box "
            "written in [0, 1] pixels? Write it in the network's own units, "
            "(x * scale - mean) / std",
            AISafetyWarning,
            stacklevel=2,
        )


def _warn_if_wider_than_its_values(lower: torch.Tensor, upper: torch.Tensor, name: str) -> None:
    """With no range known: a box whose typical width exceeds the spread of its centres
    (an eps in 0..255 units over [0, 1] pixels) covers every input the image's values do."""
    centre = (lower + upper) / 2
    spread = float(centre.max() - centre.min())
    half = float(((upper - lower) / 2).median())
    if spread > 0 and half > spread:
        warnings.warn(
            f"VNN-LIB file {name!r}: the box's typical half-width {half:.4g} exceeds the "
            f"spread of the values it is centred on ({spread:.4g}): an eps in another unit "
            f"({half:g} in 0..255 units is {half / 255:.4g} in [0, 1])? Declare what the "
            f"network takes with {DECLARE} to have such a box refused",
            AISafetyWarning,
            stacklevel=2,
        )


LAYOUT_GAP = 0.1  # how much better the other channel order's rows must correlate


def _warn_if_other_layout(centre: torch.Tensor, graph_shape: list, name: str) -> None:
    """Neighbouring rows of an image correlate (0.72-0.97 on the 144 CIFAR-10 VNN-COMP
    boxes, read in their network's order); read in the other channel order they are other
    pixels (-0.17-0.77, and 0.19 or more below the right order's on every one of those
    boxes). A box that reads better the other way was written for a network of the other
    layout with the same input count (the Marabou nets' NHWC against the ResNets' NCHW)."""
    dims = [d if isinstance(d, int) and d > 0 else 0 for d in graph_shape[1:]]
    if len(dims) != 3 or (dims[0] == 3) == (dims[2] == 3) or min(dims) < 3:
        return
    channels_first = dims[0] == 3
    h, w = dims[1:] if channels_first else dims[:2]
    if 3 * h * w != centre.numel():
        return
    nchw = _row_correlation(centre.reshape(3, h, w))
    nhwc = _row_correlation(centre.reshape(h, w, 3).permute(2, 0, 1))
    own, other = (nchw, nhwc) if channels_first else (nhwc, nchw)
    if other > own + LAYOUT_GAP:
        orders = ("channels-first (NCHW)", "channels-last (NHWC)")
        mine, theirs = orders if channels_first else orders[::-1]
        warnings.warn(
            f"VNN-LIB file {name!r}: the box's centre reads as an image in {theirs} order "
            f"(neighbouring rows correlate {other:.2f}), not in the network's {mine} order "
            f"({own:.2f}): a property written for another network with the same input "
            "count? Verify it with the network it was written for (a VNN-COMP benchmark's "
            "instances.csv pairs them)",
            AISafetyWarning,
            stacklevel=3,
        )


def _row_correlation(image: torch.Tensor) -> float:
    """Pearson correlation of each pixel with the one below it, over all channels."""
    a, b = image[:, 1:, :].flatten(), image[:, :-1, :].flatten()
    a, b = a - a.mean(), b - b.mean()
    norm = float((a.square().sum() * b.square().sum()).sqrt())
    return float((a * b).sum()) / norm if norm > 0 else 0.0


def protected_class(disjuncts: list) -> int | None:
    """The class a robustness property keeps on top (every disjunct one atom ``Y_j >= Y_L``,
    spec row ``Y_L - Y_j``, all of the same L), or None for any other property."""
    found = set()
    for rows in disjuncts:
        if len(rows) != 1 or rows[0][1] != 0:
            return None
        above = (rows[0][0] > 0).nonzero().flatten().tolist()
        if len(above) != 1 or float(rows[0][0].sum()) != 0:
            return None
        found.add(above[0])
    return found.pop() if len(found) == 1 else None


def check_centre_class(
    lower: torch.Tensor,
    upper: torch.Tensor,
    disjuncts: list,
    logits: Callable[[torch.Tensor], torch.Tensor],
    name: str,
) -> None:
    """Warn where a robustness property's class is not the network's at the box's centre.

    The VNN-COMP properties are built around correctly classified images (the network gives
    the class at the centre on all 234 robustness instances of ``../shared/data``); a box in
    another input space often is not (the ResNets' boxes taken to [0, 1] pixels: 89 of 144;
    normalised or 0..255 MNIST boxes on the four MNIST nets without a range: 108 and 132 of
    408; bench/input_space.py). A misclassified image is a valid property, answered ``sat``
    at once, hence a warning naming both readings."""
    label = protected_class(disjuncts)
    if label is None:
        return
    given = int(logits(((lower + upper) / 2).unsqueeze(0))[0].argmax())
    if given != label:
        warnings.warn(
            f"VNN-LIB file {name!r}: the network gives class {given} at the box's centre, not "
            f"class {label}, the one the property keeps on top: a misclassified image (then "
            f"the answer is sat at once), or a box written for another input space (declare "
            f"what the network is fed with {DECLARE} to have that checked)",
            AISafetyWarning,
            stacklevel=2,
        )
