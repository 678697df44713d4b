"""The memory budget of bound propagation (``verification/budget.py``): chunked bounds are
the unchunked ones, the estimate covers the measured peak, and a net too big for the budget
is refused before any work while one that fits answers under an address-space limit."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from aisafety import memory_budget
from aisafety.errors import MemoryBudgetError
from aisafety.verification import bounds as b
from aisafety.verification import budget, rounding
from aisafety.verification.graph import build_graph
from aisafety.verification.incomplete import AlphaCrownVerifier, CrownVerifier
from aisafety.verification.property import robustness_property

sys.path.insert(0, str(Path(__file__).parent))
import children  # noqa: E402
from cifar_resnets import random_resnet  # noqa: E402

TESTS = Path(__file__).parent


def small_residual(seed: int) -> nn.Module:
    return random_resnet(blocks=(1, 1), width=4, seed=seed)


def cases(seeds: tuple[int, ...] = (0, 1)):
    """(graph, property) on random residual CNNs (one per seed) and a random MLP, eps large
    enough that most neurons are unstable."""
    for seed in seeds:
        net = small_residual(seed)
        x = torch.rand(3, 3, 8, 8, generator=torch.Generator().manual_seed(seed))
        y = net(x).argmax(1)
        yield build_graph(net, (3, 8, 8), f"res{seed}"), robustness_property(x, y, 0.03, 10)
    torch.manual_seed(5)
    mlp = nn.Sequential(nn.Flatten(), nn.Linear(12, 20), nn.ReLU(), nn.Linear(20, 20), nn.ReLU(),
                        nn.Linear(20, 10)).eval()  # fmt: skip
    x = torch.rand(4, 12)
    yield build_graph(mlp, (12,), "mlp"), robustness_property(x, mlp(x).argmax(1), 0.1, 10)


@pytest.mark.parametrize("steps", [0, 3])
def test_chunked_bounds_equal_the_bounds_of_one_pass_and_stay_below_sampled_margins(steps):
    # with the slope search, one residual net: seed 1's runs the very lines of aisafety/ that
    # seed 0's does (694 of them, traced line by line in session 21) in one-neuron chunks of
    # 3 steps each, 60 % of this test's time (7 s of 12); CROWN's passes ([0]) keep both
    for graph, prop in cases((0, 1) if steps == 0 else (0,)):
        # float64 passes: whether a pass runs in float32 (rounding.SMALL) depends on its
        # size, so a chunk and the whole could otherwise differ by a rounding margin
        with torch.no_grad(), rounding.pass_precision("float64"):
            whole = b.linear_boxes(graph, prop.lower, prop.upper, alpha_steps=steps)
            with budget.memory_limit(1):  # one neuron per chunk
                chunked = b.linear_boxes(graph, prop.lower, prop.upper, alpha_steps=steps)
            spec_whole = b.spec_lower(graph, whole, prop.spec)[0]
            with budget.memory_limit(1):
                spec_chunked = b.spec_lower(graph, chunked, prop.spec)[0]
        tol = 1e-10 if steps == 0 else 1e-5  # alpha's float32 search: rounding of the batch
        for (lo, hi), (clo, chi) in zip(whole, chunked, strict=True):
            assert torch.allclose(lo, clo, atol=tol) and torch.allclose(hi, chi, atol=tol)
        assert torch.allclose(spec_whole, spec_chunked, atol=tol)
        samples = prop.lower + torch.rand(256, *prop.lower.shape, dtype=prop.lower.dtype) * (
            prop.upper - prop.lower
        )
        margins = torch.stack([prop.rows(graph.forward(s)) - prop.offset for s in samples])
        assert (spec_chunked <= margins.amin(0) + 1e-9).all()


def test_a_slope_search_takes_chunks_of_at_most_search_chunk_bytes_under_any_budget(monkeypatch):
    """Under a large budget one chunk of all of resnet_2b's cropped (image, position) pairs
    ran alpha-CROWN's intermediate search 5x slower per pair than chunks of ``SEARCH_CHUNK``
    (docs/cifar10.md). CROWN's passes (no search) still take what the budget
    allows. Counted in estimated bytes per chunk, not timed."""
    graph, prop = next(cases())  # residual: cropped and dense passes both
    seen = []
    bound_neurons = b._bound_neurons

    def spy(g, j, chunk, boxes, mode, alpha_steps, rows=None):
        size = budget.row_bytes(g, j, chunk.shape[0], alpha_steps > 0) * 2 * chunk.shape[1]
        seen.append((alpha_steps, size))
        return bound_neurons(g, j, chunk, boxes, mode, alpha_steps, rows)

    monkeypatch.setattr(b, "_bound_neurons", spy)
    with budget.memory_limit(64 << 30):
        b.linear_boxes(graph, prop.lower, prop.upper, alpha_steps=2)
        whole = max(rows for steps, rows in seen if steps)
        cap = whole // 4
        monkeypatch.setattr(budget, "SEARCH_CHUNK", cap, raising=False)
        seen.clear()
        b.linear_boxes(graph, prop.lower, prop.upper, alpha_steps=2)
        searched = [rows for steps, rows in seen if steps]
        seen.clear()
        b.linear_boxes(graph, prop.lower, prop.upper)
    assert searched and max(searched) <= cap
    assert max(rows for _, rows in seen) > cap  # CROWN's chunks: the budget's


def test_a_net_over_the_budget_is_refused_before_any_work_with_the_estimate():
    graph = build_graph(small_residual(0), (3, 8, 8), "res")
    prop = robustness_property(torch.rand(2, 3, 8, 8), torch.tensor([0, 1]), 0.01, 10)
    verifier = CrownVerifier(memory_gib=1e-6)
    with pytest.raises(MemoryBudgetError) as info:
        verifier.verify(graph, prop)
    estimate = budget.size(verifier.peak_bytes(graph, 1, 9))
    message = str(info.value)
    assert f"needs about {estimate}" in message and "budget of 0.00102 MiB" in message
    assert "crown-ibp" in message and "memory_gib" in message


def test_a_batch_over_the_budget_is_split_into_fewer_samples():
    graph = build_graph(small_residual(0), (3, 8, 8), "res")
    prop = robustness_property(torch.rand(6, 3, 8, 8), torch.arange(6), 0.01, 10)
    verifier = AlphaCrownVerifier(steps=2)
    one = verifier.peak_bytes(graph, 1, 9)
    assert verifier.fitting_batch(graph, prop, 2 * one + 1) == 2
    assert verifier.fitting_batch(graph, prop, 100 * one) == 6


# a fresh process's width-16 random CIFAR ResNet, its IBP boxes and the resident sizes
PRELUDE = """
import json, sys, torch
sys.path.insert(0, {tests!r})
from cifar_resnets import random_resnet
from aisafety.memory import reuse_freed_memory
from aisafety.verification import bounds as b, budget, receptive
from aisafety.verification.graph import build_graph
torch.set_num_threads(1)
graph = build_graph(random_resnet(blocks=(1, 1, 1, 1), width=16), (3, 32, 32), "r10")
x = torch.rand({batch}, 3, 32, 32, dtype=torch.float64)
boxes = b.interval_boxes(graph, x - {eps}, x + {eps})
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
"""

MEASURE = (
    PRELUDE
    + """
out = []
for start, rows, grad in {runs!r}:
    n = graph.ops[start].out_shape
    a = torch.eye(budget.numel(n), dtype=x.dtype)[:rows].reshape(1, rows, *n).repeat(2, 1, 1, 1, 1)
    open("/proc/self/clear_refs", "w").write("5")  # the peak starts again from here
    before = status("VmRSS")
    with reuse_freed_memory():
        if grad:
            b.optimised_backward(graph, start, a, boxes, 2, 0.1)
        else:
            with torch.no_grad():
                b.backward(graph, start, a, boxes)
    grown = status("VmHWM") - before
    out.append([grown, budget.row_bytes(graph, start, 2, grad) * rows])
print(json.dumps(out))
"""
)


def test_the_estimate_covers_the_measured_peak_of_a_backward_pass():
    """Each pass in a fresh process, its own peak resident size measured (``VmHWM`` reset
    through ``/proc/self/clear_refs`` just before it: the process's earlier peak, building
    the graph and boxes, may be higher than the pass's, and ru_maxrss would then not grow),
    rows enough that the pass dwarfs the allocator's noise. The two processes run at once
    (each measures its own peak; the suite's other core is idle while it waits)."""
    runs = ([(36, 400, False)], [(18, 60, True)])
    scripts = [MEASURE.format(tests=str(TESTS), batch=2, eps="1 / 255", runs=r) for r in runs]
    for run, done in zip(runs, _run_together(scripts), strict=True):
        assert done.returncode == 0, done.stderr[-2000:]
        ((grown, estimate),) = json.loads(done.stdout)
        assert grown > 50 << 20  # the pass is measurable
        assert grown <= estimate, (run, grown, estimate)


CROP = (
    PRELUDE
    + """
j = {node!r}
crops = receptive.crops_for(graph, j)
lo, hi = boxes[j]
pairs = int(((lo < 0) & (hi > 0)).any(1).sum())
open("/proc/self/clear_refs", "w").write("5")
before = status("VmRSS")
with reuse_freed_memory(), torch.no_grad():
    b._tighten_cropped(crops, j, boxes, "adaptive", {steps!r})
grown = status("VmHWM") - before
kinds = [op.kind for op in crops.graph.ops]
estimate = budget.crop_pair_bytes(crops.graph, crops.end, {steps!r} > 0) * pairs
print(json.dumps([grown, estimate, kinds.count("add"), kinds.count("window")]))
"""
)


@pytest.mark.parametrize(
    "node, steps",
    [
        (9, 0),
        pytest.param(18, 0, marks=pytest.mark.slow),
        pytest.param(9, 2, marks=pytest.mark.slow),
    ],
)
def test_the_crop_estimate_covers_the_measured_peak_through_residual_additions(node, steps):
    """A residual block's crop holds both branches, their union windows and a sub-window
    op (``receptive.py``): the pairs' estimate (one chunk: the budget is far above it)
    covers the growth of the resident size, measured as above. Node 9: the first block's
    addition; 18: the strided block's (a 1x1 stride-2 shortcut); with alpha-CROWN's slopes."""
    done = _run(CROP.format(tests=str(TESTS), batch=1, eps="2 / 255", node=node, steps=steps))
    assert done.returncode == 0, done.stderr[-2000:]
    grown, estimate, adds, windows = json.loads(done.stdout)
    assert adds >= 1 and windows >= 1  # the crop passes through an addition
    assert grown > 20 << 20  # the pass is measurable
    assert grown <= estimate, (grown, estimate)


RESNET18 = """
import resource, sys, torch
sys.path.insert(0, {tests!r})
from cifar_resnets import random_resnet
from aisafety import memory_budget
from aisafety.verification import budget, rounding
from aisafety.verification.graph import build_graph
from aisafety.verification.incomplete import CrownVerifier
from aisafety.verification.property import robustness_property
torch.set_num_threads(1)
graph = build_graph(random_resnet(), (3, 32, 32), "resnet18")
prop = robustness_property(torch.rand(2, 3, 32, 32), torch.tensor([3, 5]), 1 / 255, 10)
limit = memory_budget._vm_size() + {extra}
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
verifier = CrownVerifier(timeout={timeout}, clock="cpu", **{config!r})
print("budget", verifier.memory_budget(), "estimate", verifier.peak_bytes(graph, 2, 9))
result = verifier.verify(graph, prop)
print("verdicts", [v.value for v in result.verdicts])
"""


def _run(script: str) -> subprocess.CompletedProcess:
    """``script`` in a fresh process, its time bounded only by the hang guard (a fixed 600 s
    of wall clock can run out on a loaded machine), the memory ledger off: the default budget
    there is a fraction of the address space left (or of MemAvailable), whatever other
    processes of the test run have claimed."""
    return _run_together([script])[0]


def _run_together(scripts: list[str]) -> list[subprocess.CompletedProcess]:
    """``_run`` of each script, all started at once (``children.run_together``)."""
    env = {**os.environ, "AISAFETY_MEMORY_LEDGER": "0"}
    commands = [[sys.executable, "-c", script] for script in scripts]
    return children.run_together(commands, what="the bound-budget script",
                                 capture_output=True, text=True, env=env)  # fmt: skip


RESNET18_CONFIGS = [{}, {"memory_gib": 1000}]


@pytest.fixture(scope="module")
def resnet18_runs() -> list[subprocess.CompletedProcess]:
    """``RESNET18`` under each of ``RESNET18_CONFIGS``, both processes at once (each under
    its own address-space limit; 0.7 and 3.4 GB resident at their peaks): the suite's other
    core idles while pytest waits."""
    # the raw error comes after ~2-3 CPU s of bounding, as close as that to a 3 s limit on a
    # busy machine (a `timeout` verdict instead, seen once at load 3): so that case gets 300 s
    scripts = [
        RESNET18.format(tests=str(TESTS), extra=3 << 30, config=c, timeout=300 if c else 3)
        for c in RESNET18_CONFIGS
    ]
    return _run_together(scripts)


@pytest.mark.parametrize("config", RESNET18_CONFIGS)
def test_crown_on_a_cifar_resnet18_answers_or_refuses_under_an_address_space_limit(
    config, resnet18_runs
):
    """Before the budget: a raw allocator error asking for 58 GB. Under a 3 GiB address-
    space limit the default budget answers (the 3 CPU-s limit per sample makes that a
    timeout, sound and without an allocation error); a budget above what the limit allows
    passes the check and is then chunked to 1000 GiB, which the limit stops as a raw
    error: what the default prevents."""
    done = resnet18_runs[RESNET18_CONFIGS.index(config)]
    if config:
        assert done.returncode != 0 and "can't allocate memory" in done.stderr
    else:
        assert done.returncode == 0, done.stderr
        assert "verdicts ['timeout', 'timeout']" in done.stdout


def test_the_default_budget_is_a_fraction_of_available_memory_capped_by_the_rlimit(monkeypatch):
    # the functions live in aisafety/memory_budget.py, shared with attacks and metrics;
    # no other process's claim (tests/test_memory_ledger.py) changes the numbers here
    monkeypatch.setenv("AISAFETY_MEMORY_LEDGER", "0")
    monkeypatch.setattr(memory_budget, "_meminfo", lambda key: 8 * budget.GIB)
    monkeypatch.setattr(memory_budget, "_vm_size", lambda: 3 * budget.GIB)
    limits = {"now": (resource.RLIM_INFINITY, resource.RLIM_INFINITY)}
    monkeypatch.setattr(memory_budget.resource, "getrlimit", lambda kind: limits["now"])
    assert budget.default_budget() == 4 * budget.GIB
    limits["now"] = (5 * budget.GIB, 5 * budget.GIB)  # 2 GiB of address space left
    assert budget.default_budget() == budget.GIB
    assert budget.current_budget() == budget.GIB
    with budget.memory_limit(123):
        assert budget.current_budget() == 123


def test_a_bound_computation_outside_verify_claims_its_budget_once(monkeypatch):
    """CROWN called on its own (a benchmark, a VNN-COMP first pass) reads and claims the
    default budget once, for every layer's passes and the spec rows', as ``verify`` does: not
    a locked ledger read and write per chunk. Its chunks keep the budget read then."""
    from aisafety import memory_ledger

    graph, prop = list(cases())[-1]  # the MLP: one layer of CROWN bounds, then the spec
    budgets = iter([1, 1 << 40])  # the first read: one row per chunk; a later one: all
    claims, steps = [], []
    monkeypatch.setattr(memory_ledger, "claim", lambda of: claims.append(of) or next(budgets))
    chunk = budget.rows_per_chunk

    def spy(per_row, rows, fixed=0, most=None):
        steps.append(chunk(per_row, rows, fixed, most))
        return steps[-1]

    monkeypatch.setattr(budget, "rows_per_chunk", spy)
    with torch.no_grad():
        CrownVerifier().lower_bounds(graph, prop)
    assert len(claims) == 1
    assert len(steps) >= 2 and set(steps) == {1}
