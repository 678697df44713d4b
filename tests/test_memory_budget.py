"""The memory budget beyond the verifiers (``aisafety/memory_budget.py``): attacks,
randomized smoothing, neuron outputs, the boundary distance and corruptions estimate their
peak before they start, chunk under the budget with the same results, refuse with the
estimate when one image does not fit, and answer under an address-space limit set here
(RLIMIT_AS in a subprocess) where a raw allocator error came before."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from aisafety import memory_budget
from aisafety.attack import base
from aisafety.attack.fgsm import FGSM
from aisafety.attack.pgd import PGDLinf as PGD
from aisafety.corruption import corrupt
from aisafety.defense.randomized_smoothing import RandomizedSmoothing
from aisafety.errors import MemoryBudgetError
from aisafety.evaluation import corrupted
from aisafety.evaluation.corrupted import corrupted_predictions
from aisafety.evaluation.metrics.boundary_distance import CHUNK, search_chunk
from aisafety.evaluation.neurons import default_layers, neuron_outputs
from aisafety.prediction import footprint
from aisafety.prediction.torch_module import TorchPredictor
from aisafety.unit_cost import reset_peak_rss, status_bytes

TESTS = Path(__file__).parent
sys.path.insert(0, str(TESTS))
import children  # noqa: E402
from cifar_resnets import random_resnet  # noqa: E402


def small_model(side: int = 32) -> TorchPredictor:
    """A small 3-channel residual net (two blocks, width 8); any input side."""
    return TorchPredictor(random_resnet(blocks=(1, 1), width=8), (3, side, side), 10, name="res")


def images(n: int, side: int = 32) -> torch.Tensor:
    return torch.rand(n, 3, side, side, generator=torch.Generator().manual_seed(0))


def test_an_attack_chunked_under_the_budget_returns_the_same_examples():
    model, x = small_model(), images(8)
    y = model.predict(x)
    whole = PGD(steps=3)(model, x, y, 8 / 255, chunk_size=8)
    per_image = PGD().image_memory(model)
    with memory_budget.memory_limit(3 * per_image):  # three images per chunk
        assert PGD()._budget_chunk(model, 8) == 3
        chunked = PGD(steps=3)(model, x, y, 8 / 255, chunk_size=8)
    assert torch.equal(whole.x_adv, chunked.x_adv) and torch.equal(whole.steps, chunked.steps)


def test_an_attack_over_the_budget_is_refused_before_any_work_with_the_estimate():
    model, x = small_model(), images(2)
    estimate = memory_budget.size(PGD().image_memory(model))
    with memory_budget.memory_limit(1000), pytest.raises(MemoryBudgetError) as info:
        PGD()(model, x, torch.zeros(2, dtype=torch.long), 8 / 255)
    message = str(info.value)
    assert "attack 'pgd-linf' on model 'res'" in message and f"about {estimate}" in message
    assert "budget of 0.000954 MiB" in message and "memory_gib" in message
    # the least budget that fits is named (session 21), and it does fit
    least = float(message.split("the least that fits one chunk: memory_gib: ")[1].split(")")[0])
    with memory_budget.memory_limit(int(least * memory_budget.GIB)):
        PGD(steps=1)(model, x, torch.zeros(2, dtype=torch.long), 8 / 255)


class ChunkDependentFGSM(FGSM):
    """An attack whose results would change with its chunking (a plugin's may)."""

    name = "chunk-dependent-fgsm"
    chunk_independent = False


def test_an_attack_whose_results_depend_on_its_chunks_names_the_chunk_that_fits():
    model, x = small_model(), images(4)
    one = ChunkDependentFGSM().image_memory(model)
    held = base.RESULT_COPIES * x.numel() * 4  # the call's result, beside its chunks
    with memory_budget.memory_limit(2 * one + held), pytest.raises(MemoryBudgetError) as info:
        ChunkDependentFGSM()(model, x, torch.zeros(4, dtype=torch.long), 0.1)
    assert "chunk_size: 2 (fits)" in str(info.value)


def test_smoothing_votes_are_the_same_whatever_the_budget():
    model, x = small_model(), images(3)
    config = {"samples": 40, "batch_size": 60, "sigma": 0.25}
    free = RandomizedSmoothing(model, config).votes(x)
    one = footprint.image_bytes(model, grad=False) + 4 * 3 * 32 * 32
    with memory_budget.memory_limit(60 * 4 * 3 * 32 * 32 + 7 * one):
        smoothed = RandomizedSmoothing(model, config)
        assert smoothed.forward_chunk(60) == 7
        tight = smoothed.votes(x)
    assert torch.equal(free, tight)


def test_neuron_outputs_are_the_same_whatever_the_budget():
    model, x = small_model(), images(6)
    layers = default_layers(model)
    free, sizes = neuron_outputs(model, x, layers, batch_size=6)
    one = footprint.image_bytes(model, False) + footprint.activations_bytes(model)
    with memory_budget.memory_limit(2 * one):
        tight, tight_sizes = neuron_outputs(model, x, layers, batch_size=6)
    assert sizes == tight_sizes and torch.allclose(free, tight, atol=1e-6)


def test_the_boundary_search_takes_fewer_samples_per_chunk_under_a_small_budget():
    model = small_model(224)
    with memory_budget.memory_limit(64 << 30):
        assert search_chunk(model, 20) == CHUNK
    with memory_budget.memory_limit(1 << 30):
        assert 1 <= search_chunk(model, 20) < CHUNK
    with memory_budget.memory_limit(1 << 20), pytest.raises(MemoryBudgetError) as info:
        search_chunk(model, 20)
    assert "metric 'ebd'" in str(info.value) and "n_directions" in str(info.value)


def test_the_estimate_of_one_image_covers_the_measured_pass():
    """Peak resident growth of a forward-backward pass of 16 images at 224x224, in a fresh
    process, against 16 times the estimate of one image."""
    script = PRELUDE.format(tests=str(TESTS), n=16, extra=None) + (
        "from aisafety.prediction import footprint\n"
        "est = 16 * footprint.image_bytes(model, True)\n"
        # the peak so far (imports, the estimate's own pass) is reset: only this pass counts
        "def status(key):\n"
        "    line = next(l for l in open('/proc/self/status') if l.startswith(key + ':'))\n"
        "    return int(line.split()[1]) * 1024\n"
        "open('/proc/self/clear_refs', 'w').write('5')\n"
        "before = status('VmRSS')\n"
        "x.requires_grad_(True)\n"
        "torch.autograd.grad(model.logits(x).sum(), x)\n"
        "grown = status('VmHWM') - before\n"
        "print(grown, est)\n"
    )
    grown, estimate = map(int, _run(script).stdout.split())
    assert 100 << 20 < grown <= estimate, (grown, estimate)


PRELUDE = """
import resource, sys, torch
sys.path.insert(0, {tests!r})
from cifar_resnets import random_resnet
from aisafety import memory_budget
from aisafety.attack.fgsm import FGSM
from aisafety.prediction.torch_module import TorchPredictor
torch.set_num_threads(1)
model = TorchPredictor(random_resnet(blocks=(1, 1), width=8), (3, 224, 224), 10, name="res")
x = torch.rand({n}, 3, 224, 224, generator=torch.Generator().manual_seed(0))
y = torch.zeros({n}, dtype=torch.long)
extra = {extra}
if extra:
    limit = memory_budget._vm_size() + extra
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
"""

WORK = {
    "attack": "from aisafety.attack.pgd import PGDLinf as PGD\n"
    "out = PGD(steps=1)(model, x, y, 8 / 255, chunk_size=len(x)).adv_logits\n",
    "smoothing": "from aisafety.defense.randomized_smoothing import RandomizedSmoothing\n"
    "from aisafety.defense.smoothing.certify import certify\n"
    "s = RandomizedSmoothing(model, samples=8, batch_size=len(x))\n"
    "out = torch.tensor(certify(s, x[:1], n0=8, n=len(x), alpha=0.01).p_a_lower)\n",
    "neurons": "from aisafety.evaluation.neurons import default_layers, neuron_outputs\n"
    "out = neuron_outputs(model, x, default_layers(model), len(x))[0]\n",
}
FAMILIES = {"attack": 48, "smoothing": 128, "neurons": 64}
HEADROOM = 640 << 20  # address space left to the work: the default budget is half of it
CORRUPTION = "from aisafety.evaluation.corrupted import corrupted_predictions\n" + (
    "out = corrupted_predictions(model, x[:{chunk}], 'elastic_transform', 5, 0, 8).float()\n"
)
FINITE = "print('finite', bool(torch.isfinite(out).all()), tuple(out.shape))\n"


def _run(script: str) -> subprocess.CompletedProcess:
    """``script`` in a fresh process, its time bounded only by the hang guard (a fixed 600 s
    of wall clock can run out on a loaded machine), the memory ledger off: the default budget
    there is half of the address space left (or of MemAvailable), whatever other processes of
    the test run have claimed."""
    return _run_together([script])[0]


def _run_together(scripts: list[str]) -> list[subprocess.CompletedProcess]:
    """``_run`` of each script, all started at once (``children.run_together``)."""
    env = {**os.environ, "AISAFETY_MEMORY_LEDGER": "0"}
    commands = [[sys.executable, "-c", script] for script in scripts]
    return children.run_together(commands, what="the address-space script",
                                 capture_output=True, text=True, env=env)  # fmt: skip


@pytest.mark.parametrize(
    "family",
    [pytest.param(f, marks=() if f == "attack" else pytest.mark.slow) for f in sorted(FAMILIES)],
)
def test_each_family_answers_under_an_address_space_limit(family):
    """With 640 MiB of address space left, the default budget (half of it) chunks the work
    and it answers; with the budget set above what the limit allows the same work stops on
    the raw allocator error the budget prevents (the limit binds). Both processes at once,
    each under its own limit."""
    prelude = PRELUDE.format(tests=str(TESTS), n=FAMILIES[family], extra=HEADROOM)
    unbounded = "with memory_budget.memory_limit(1 << 40):\n" + "".join(
        "    " + line + "\n" for line in WORK[family].splitlines()
    )
    done, over = _run_together([prelude + WORK[family] + FINITE, prelude + unbounded])
    assert done.returncode == 0, done.stderr[-2000:]
    assert "finite True" in done.stdout
    assert over.returncode != 0
    assert "can't allocate memory" in over.stderr or "MemoryError" in over.stderr


@pytest.mark.slow
def test_a_corruption_at_224_is_chunked_under_an_address_space_limit():
    """96 images at 224x224 corrupted by ``elastic_transform`` answer with finite labels
    under the 640 MiB limit, where the estimate for all 96 at once is over the default
    budget (this call was refused before the corruptions drew per block)."""
    prelude = PRELUDE.format(tests=str(TESTS), n=96, extra=HEADROOM)
    over = (
        "from aisafety.evaluation import corrupted\n"
        "whole = corrupted.CORRUPTION_IMAGE_COPIES * 96 * 3 * 224 * 224 * 4\n"
        "print('over', whole > memory_budget.current_budget())\n"
    )
    done = _run(prelude + over + CORRUPTION.format(chunk=96) + FINITE)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "over True" in done.stdout and "finite True (96,)" in done.stdout


def _corrupted_labels(model, x, budget: int, name: str = "elastic_transform") -> torch.Tensor:
    with memory_budget.memory_limit(budget):
        return corrupted_predictions(model, x, name, 5, 3, batch_size=16)


def test_corrupted_labels_are_the_same_whatever_the_budget_and_the_peak_stays_under_it():
    """Ten images at 224x224 are three random blocks of 4, 4 and 2 (``block_images``), each
    drawn with its own seed: one block per chunk under a budget of one block gives the labels
    of one chunk of all three, and of corrupting each block alone with its block seed. The
    process's peak resident growth under the one-block budget stays below that budget."""
    model, x = small_model(224), images(10, 224)
    per_block = corrupted.CORRUPTION_IMAGE_COPIES * 4 * 3 * 224 * 224 * 4
    assert corrupted.block_images(3 * 224 * 224, corrupted.CORRUPTION_BLOCK_VALUES) == 4
    whole = _corrupted_labels(model, x, 1 << 40)
    reset_peak_rss()
    before = status_bytes("VmRSS")
    tight = _corrupted_labels(model, x, per_block)
    grown = status_bytes("VmHWM") - before
    assert torch.equal(whole, tight)
    assert grown <= per_block, (grown, per_block)
    blocks = [corrupt(x[i : i + 4], "elastic_transform", 5, corrupted.block_seed(3, i // 4))
              for i in range(0, 10, 4)]  # fmt: skip
    assert torch.equal(whole, model.predict(torch.cat(blocks)))


def test_a_corruption_whose_block_does_not_fit_is_refused_before_any_work():
    model, x = small_model(224), images(10, 224)
    with pytest.raises(MemoryBudgetError) as info:
        _corrupted_labels(model, x, 1 << 20, "gaussian_noise")
    message = str(info.value)
    assert "corruption 'gaussian_noise' on 10 images of shape (3, 224, 224)" in message
    assert "4 images per random block" in message and "budget of 1 MiB" in message


def test_block_seeds_keep_the_seed_for_block_0_and_differ_per_block():
    seeds = [corrupted.block_seed(7, i) for i in range(100)]
    assert seeds[0] == 7 and len(set(seeds)) == 100
    assert corrupted.block_images(3 * 32 * 32, corrupted.CORRUPTION_BLOCK_VALUES) == 256
    assert corrupted.block_images(10**7, corrupted.CORRUPTION_BLOCK_VALUES) == 1


def test_a_sequence_block_over_the_budget_is_refused_before_any_work():
    model, x = small_model(224), images(2, 224)
    with memory_budget.memory_limit(1 << 20), pytest.raises(MemoryBudgetError) as info:
        corrupted.sequence_predictions([model], x, "gaussian_noise", 31, 0, 8)
    assert "perturbation sequence 'gaussian_noise' of 31 frames" in str(info.value)
    assert "1 images per block" in str(info.value) and "n_frames" in str(info.value)


def test_the_plans_memory_gib_is_the_budget_of_every_unit(tmp_path):
    """``limits.memory_gib`` sets the budget inside the runner's units: a budget of 1 KiB
    refuses the attack before any work, naming it, instead of running. (The clean logits
    are computed before the units, under the default budget.)"""
    import aisafety

    plan = {"dataset": {"name": "mnist-embedded", "limit": 4}, "metrics": ["robust-accuracy"],
            "attacks": [{"name": "fgsm", "eps": [0.1]}],
            "limits": {"memory_gib": 1 / (1 << 20)}}  # fmt: skip
    with pytest.raises(MemoryBudgetError, match="attack 'fgsm' on model .* budget of 0.000977 MiB"):
        aisafety.evaluate(plan, db=f"sqlite:///{tmp_path / 'budget.db'}")


HELD = """
import ctypes
from aisafety.memory import reuse_freed_memory
from aisafety.unit_cost import reset_peak_rss, status_bytes
from aisafety.verification.graph import build_graph
from aisafety.verification.incomplete import IBPVerifier
from aisafety.verification.property import robustness_property
graph = build_graph(model.network, (3, 224, 224), "res", dtype=torch.float32)
prop = robustness_property(x, y, 2 / 255, 10)
budget = 1 << 29
for name, work in [("fgsm", lambda: FGSM()(model, x, y, 2 / 255)),
                   ("ibp", lambda: IBPVerifier().verify(graph, prop))]:
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    reset_peak_rss()
    before = status_bytes("VmRSS")
    with memory_budget.memory_limit(budget), reuse_freed_memory():
        work()
    print(name, status_bytes("VmHWM") - before, budget)
"""


@pytest.mark.slow
def test_a_whole_call_stays_under_the_budget_with_what_it_holds_for_every_image():
    """FGSM and IBP on 192 images at 224x224 under a 512 MiB budget: the process grows by
    less than the budget. Before, the chunks took the whole budget and the call's copies of
    every image (an attack's examples and their concatenation, a verifier's
    counterexamples) came on top: 1.12x the budget for FGSM on 256 images under 1 GiB."""
    done = _run(PRELUDE.format(tests=str(TESTS), n=192, extra=None) + HELD)
    assert done.returncode == 0, done.stderr[-2000:]
    for line in done.stdout.splitlines():
        name, grown, budget = line.split()
        assert int(grown) <= int(budget), line


def test_an_attack_leaves_room_for_its_result_in_the_budget():
    model, x = small_model(), images(8)
    one = PGD().image_memory(model)
    held = base.RESULT_COPIES * x.numel() * 4
    with memory_budget.memory_limit(3 * one + held):
        assert PGD()._budget_chunk(model, 8, held) == 3
        assert PGD()._budget_chunk(model, 8) == 3 + held // one


class _Widened(torch.nn.Module):
    """A conv layer and a head: a notebook net whose layers the user replaces."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(1, width, 3, padding=1)
        self.head = torch.nn.Linear(width, 10)

    def forward(self, x):
        return self.head(torch.relu(self.conv(x)).mean((2, 3)))


def test_a_predictor_whose_network_is_edited_between_runs_is_measured_again(tmp_path):
    """A Predictor handed to aisafety.evaluate lives on in the notebook: widened in place
    from 2 to 512 channels between two runs, its one-image footprint was still the first
    run's (76,838 bytes, the widened net's is 15.3 MB), so the second run ran FGSM far over
    a 5 MiB budget without a word; now it is measured again and refused."""
    import aisafety

    net = _Widened(2)
    predictor = TorchPredictor(net, (1, 28, 28), 10, name="edited")
    plan = {
        "device": "cpu", "dataset": {"limit": 2}, "limits": {"memory_gib": 0.005},
        "attacks": [{"name": "fgsm", "eps": [0.1]}], "metrics": ["robust-accuracy"],
    }  # fmt: skip
    first = aisafety.evaluate(plan, f"sqlite:///{tmp_path / 'a.db'}", model=predictor)
    assert first.failed_units == () and first.values
    small = footprint.image_bytes(predictor, grad=True)
    net.conv, net.head = torch.nn.Conv2d(1, 512, 3, padding=1), torch.nn.Linear(512, 10)
    assert footprint.image_bytes(predictor, grad=True) > 100 * small
    with pytest.raises(MemoryBudgetError, match="attack 'fgsm' on model 'edited'"):
        aisafety.evaluate(plan, f"sqlite:///{tmp_path / 'b.db'}", model=predictor)
    predictor.network.double()  # the weights' dtype is part of what was measured
    assert footprint.image_bytes(predictor, grad=True) > 1.5 * footprint.image_bytes(
        TorchPredictor(_Widened(512), (1, 28, 28), 10), grad=True
    )
