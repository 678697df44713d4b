"""alpha-CROWN's work limit on intermediate slope searches (search_plan.py): a suffix of the
layers per sample, sound, never below CROWN, bit-identical where every search fits."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from aisafety.database.zoo import load_zoo_model
from aisafety.verification import bounds as b
from aisafety.verification import search_plan
from aisafety.verification.graph import build_graph
from aisafety.verification.incomplete import AlphaCrownVerifier, CrownVerifier
from aisafety.verification.property import robustness_property

STEPS = 5


def small_cnn() -> nn.Module:
    torch.manual_seed(3)
    return nn.Sequential(
        nn.Conv2d(3, 6, 3, padding=1), nn.ReLU(),
        nn.Conv2d(6, 6, 3, stride=2, padding=1), nn.ReLU(),
        nn.Flatten(), nn.Linear(6 * 4 * 4, 24), nn.ReLU(), nn.Linear(24, 10),
    ).eval()  # fmt: skip


def case(n: int = 4, eps: float = 0.03):
    net = small_cnn()
    graph = build_graph(net, (3, 8, 8), "small-cnn")
    torch.manual_seed(4)
    x = torch.rand(n, 3, 8, 8, dtype=torch.float64)
    y = net(x.float()).argmax(1)
    return net, graph, robustness_property(x, y, eps, 10).to(graph.dtype)


def node_values(graph, x: torch.Tensor) -> list[torch.Tensor]:
    values = [x]
    for op in graph.ops[1:]:
        values.append(op.forward(*(values[i] for i in op.inputs)))
    return values


def alpha(graph, prop, work):
    verifier = AlphaCrownVerifier(steps=STEPS, search_work=work)
    with torch.no_grad():
        bound, _, boxes, _ = verifier.bounds_and_boxes(graph, prop)
    return bound, boxes


def works(graph, prop) -> list[float]:
    """Per sample, the summed work of its searches, deepest layer first (cumulative)."""
    crown = b.linear_boxes(graph, prop.lower, prop.upper)
    sums, total = [], torch.zeros(len(prop), dtype=torch.float64)
    for j in reversed(search_plan._searchable(graph)):
        lo, hi = crown[j]
        unstable = ((lo < 0) & (hi > 0)).reshape(len(prop), -1).sum(1)
        total = total + 2 * unstable * search_plan.pass_elements(graph, j)
        sums.append(total.clone())
    return sums


def test_the_plan_is_a_suffix_of_the_layers_per_sample_and_grows_with_the_limit():
    _, graph, prop = case()
    crown = b.linear_boxes(graph, prop.lower, prop.upper)
    nodes = search_plan._searchable(graph)
    assert len(nodes) == 2  # the second conv's and the dense layer's inputs (after a ReLU)
    assert search_plan.searched_samples(graph, crown, None) is None
    assert search_plan.searched_samples(graph, crown, float("inf")) is None
    none = search_plan.searched_samples(graph, crown, 0.0)
    assert not any(bool(m.any()) for m in none.values())
    last = works(graph, prop)[0]  # the deepest layer's work alone
    middle = float(last.max()) + 0.5
    plan = search_plan.searched_samples(graph, crown, middle)
    assert plan[nodes[-1]].all() and not plan[nodes[0]].all()
    previous = None
    for limit in (0.0, middle / 4, middle, 4 * middle, 1e12):
        plan = search_plan.searched_samples(graph, crown, limit) or {
            j: torch.ones(len(prop), dtype=torch.bool) for j in nodes
        }
        assert (plan[nodes[0]] <= plan[nodes[-1]]).all()  # shallower only if deeper
        if previous is not None:
            assert all((previous[j] <= plan[j]).all() for j in nodes)
        previous = plan


@pytest.mark.parametrize("fraction", [0.0, 0.5])
def test_a_partial_plan_is_sound_and_never_below_crown(fraction):
    _, graph, prop = case()
    limit = fraction * float(works(graph, prop)[-1].min())
    bound, boxes = alpha(graph, prop, limit)
    with torch.no_grad():
        crown, _ = CrownVerifier().lower_bounds(graph, prop)
    assert (bound >= crown).all()
    # below every sampled margin, and every sampled intermediate value inside its box
    torch.manual_seed(5)
    for k in range(20):
        # half the samples at corners of the box, where the bounds are closest
        corner = torch.where(torch.rand_like(prop.lower) < 0.5, prop.lower, prop.upper)
        inside = prop.lower + (prop.upper - prop.lower) * torch.rand_like(prop.lower)
        x = corner if k % 2 else inside
        values = node_values(graph, x)
        assert (bound <= prop.rows(values[-1]) + 1e-9).all()
        for (lo, hi), v in zip(boxes, values, strict=True):
            assert (lo <= v + 1e-9).all() and (v <= hi + 1e-9).all()


def test_with_no_search_the_intermediate_boxes_are_crowns():
    _, graph, prop = case()
    _, boxes = alpha(graph, prop, 0.0)
    crown = b.linear_boxes(graph, prop.lower, prop.upper)
    for j in search_plan._searchable(graph):
        assert torch.equal(boxes[j][0], crown[j][0]) and torch.equal(boxes[j][1], crown[j][1])


def test_a_samples_bound_does_not_depend_on_the_others_in_its_batch():
    _, graph, prop = case()
    last = works(graph, prop)[0]
    limit = float(last.median())  # some samples search the dense layer, some do not
    together, _ = alpha(graph, prop, limit)
    for i in range(len(prop)):
        alone, _ = alpha(graph, prop[i : i + 1], limit)
        torch.testing.assert_close(alone, together[i : i + 1], rtol=1e-6, atol=1e-6)


def test_the_default_is_bit_identical_where_every_search_fits():
    """The MNIST MLP of the zoo (and this small CNN): the default limit searches every layer
    of every sample, as before the limit existed (``search_work: null``)."""
    net = load_zoo_model("sok-fcnn-b-adv1", torch.device("cpu")).network
    torch.manual_seed(6)
    for graph, prop in (
        (build_graph(net, (1, 28, 28), "sok-fcnn-b-adv1"), None),
        case()[1:],
    ):
        if prop is None:
            x = torch.rand(3, 1, 28, 28, dtype=torch.float64)
            y = net(x.float()).argmax(1)
            prop = robustness_property(x, y, 0.05, 10).to(graph.dtype)
        crown = b.linear_boxes(graph, prop.lower, prop.upper)
        default = AlphaCrownVerifier.Config().search_work
        assert search_plan.searched_samples(graph, crown, default) is None
        new, _ = alpha(graph, prop, default)
        old, _ = alpha(graph, prop, None)
        assert torch.equal(new, old)
