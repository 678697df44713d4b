"""Per-sample random streams (issue #17): a sample's draws depend on the seed and its index
only, so every built-in attack gives each sample the same result whatever the chunking."""

from __future__ import annotations

import pytest
import torch

from aisafety.attack.base import Attack
from aisafety.attack.streams import BUFFER, SampleStreams, sample_seed
from aisafety.interfaces import (
    AttackFamily,
    AttackSpec,
    Capability,
    DatasetSpec,
    DefenseSpec,
    EvaluationPlan,
    MetricSpec,
    Norm,
)
from aisafety.plugins import build_registry, default_registry
from aisafety.runner import Runner
from aisafety.store.results import ResultStore

# small work settings: the point is the chunking, not the attack's strength
SMALL = {
    "apgd-ce": {"steps": 5, "n_restarts": 2}, "apgd-ce-l2": {"steps": 5, "n_restarts": 2},
    "apgd-dlr": {"steps": 5, "n_restarts": 2}, "apgd-dlr-l2": {"steps": 5, "n_restarts": 2},
    "apgd-mar": {"steps": 5, "n_restarts": 2}, "apgd-mar-l2": {"steps": 5, "n_restarts": 2},
    "bim": {"steps": 5}, "mi-fgsm": {"steps": 5}, "fgsm": {}, "r-fgsm": {},
    "boundary": {"steps": 30, "init_draws": 5, "init_search_steps": 5},
    "cw-l2": {"steps": 10, "binary_search_steps": 2},
    "deepfool-l2": {"steps": 5}, "deepfool-linf": {"steps": 5},
    "nattack": {"iterations": 5, "population": 20},
    "pgd-l1": {"steps": 5}, "pgd-l2": {"steps": 5}, "pgd-linf": {"steps": 5},
    "random-noise": {"draws": 4},
    "spsa": {"steps": 3, "samples": 16, "nb_samples_per_step": 8},
    "square-l2": {"queries": 60}, "square-linf": {"queries": 60},
    "transfer": {"attack_config": {"steps": 3}},
    "apgd-t": {"steps": 3, "n_restarts": 1, "n_target_classes": 2},
    "apgd-t-l2": {"steps": 3, "n_restarts": 1, "n_target_classes": 2},
    "fab-t": {"steps": 3, "n_restarts": 2, "n_target_classes": 2},
    "fab-t-l2": {"steps": 3, "n_restarts": 2, "n_target_classes": 2},
    "standard": {"steps": 3, "n_restarts": 1, "queries": 20},
    "standard-l2": {"steps": 3, "n_restarts": 1, "queries": 20},
    "rand": {"steps": 3, "n_restarts": 1, "queries": 20, "eot_iter": 2},
    "rand-l2": {"steps": 3, "n_restarts": 1, "queries": 20, "eot_iter": 2},
}  # fmt: skip
EPS = {"l2": 1.5, "l1": 10.0, "linf": 0.15}
REGISTRY = default_registry()
ATTACKS = REGISTRY.names("attack")


def test_every_built_in_attack_is_covered():
    assert set(ATTACKS) == set(SMALL)


@pytest.fixture(scope="module")
def batch(mnist_subset):
    data = mnist_subset(8, seed=11)
    return data.x, data.y


@pytest.mark.parametrize(
    "name, slow",
    [(n, False) for n in ATTACKS]
    + [pytest.param(n, True, marks=pytest.mark.slow) for n in ATTACKS],
)
def test_results_do_not_depend_on_the_chunking(zoo_predictor, batch, name, slow):
    """Whole batch and chunks of 3 (and of 1 with ``-m slow``): the same adversarial input
    and steps per sample (up to float rounding: a batch of another size can round a matmul
    differently; a chunk-dependent draw moves pixels by up to eps)."""
    x, y = batch
    attack = REGISTRY.create("attack", name, {**SMALL[name], "seed": 3})
    eps = EPS[attack.norm.value]
    whole = attack(zoo_predictor, x, y, eps, chunk_size=len(x))
    for size in (3, 1) if slow else (3,):
        chunked = attack(zoo_predictor, x, y, eps, chunk_size=size)
        assert torch.equal(chunked.steps, whole.steps), (name, size)
        assert torch.equal(chunked.success, whole.success), (name, size)
        torch.testing.assert_close(chunked.x_adv, whole.x_adv, rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", ["pgd-linf", "square-linf", "random-noise", "nattack"])
def test_a_samples_result_does_not_depend_on_its_neighbours(zoo_predictor, batch, name):
    """Attacking only some samples (``todo``) leaves their results as in the full batch."""
    x, y = batch
    attack = REGISTRY.create("attack", name, {**SMALL[name], "seed": 3})
    full = attack(zoo_predictor, x, y, 0.15)
    todo = torch.arange(len(x)) % 3 == 1
    part = attack(zoo_predictor, x, y, 0.15, todo=todo)
    torch.testing.assert_close(part.x_adv[todo], full.x_adv[todo], rtol=0, atol=1e-5)
    assert torch.equal(part.steps[todo], full.steps[todo])


def test_the_seed_changes_the_draws(zoo_predictor, batch):
    x, y = batch
    first = REGISTRY.create("attack", "pgd-linf", {"steps": 1, "seed": 1})
    second = REGISTRY.create("attack", "pgd-linf", {"steps": 1, "seed": 2})
    assert not torch.equal(
        first(zoo_predictor, x, y, 0.1).x_adv, second(zoo_predictor, x, y, 0.1).x_adv
    )


# --- the streams themselves ----------------------------------------------------------------


def test_a_samples_draws_do_not_depend_on_who_else_draws():
    """Sample 7's numbers are the same drawn alone, in a batch, buffered or directly."""
    alone = SampleStreams(5, [7])
    together = SampleStreams(5, [3, 7, 9])
    for shape in ((4,), (2, 3), (BUFFER,), (10,)):  # buffered, buffered, direct, buffered
        a = alone.rand((1, *shape))[0]
        b = together[torch.tensor([1])].rand((1, *shape))[0]
        assert torch.equal(a, b)
        together.rand((3, *shape))  # advances all three: 7 is now one draw ahead
        alone.rand((1, *shape))
    assert torch.equal(alone.randn((1, 6)), together[1:2].randn((1, 6)))


def test_views_share_their_state():
    streams = SampleStreams(0, range(4))
    first = streams[torch.tensor([True, False, True, False])].rand((2, 3))
    again = SampleStreams(0, range(4))
    assert torch.equal(first, again.rand((4, 3))[[0, 2]])
    # samples 0 and 2 moved on; 1 and 3 did not
    assert torch.equal(
        streams.rand((4, 3))[[1, 3]], SampleStreams(0, range(4)).rand((4, 3))[[1, 3]]
    )


def test_distributions():
    streams = SampleStreams(1, range(64))
    u = streams.rand((64, 500))
    assert float(u.min()) >= 0 and float(u.max()) < 1 and abs(float(u.mean()) - 0.5) < 0.01
    z = streams.randn((64, 500))
    assert abs(float(z.mean())) < 0.02 and abs(float(z.std()) - 1) < 0.02
    k = streams.randint(2, 9, (64, 500))
    assert k.dtype == torch.long and set(k.unique().tolist()) == set(range(2, 9))
    s = streams.signs((64, 500))
    assert set(s.unique().tolist()) == {-1.0, 1.0} and abs(float(s.mean())) < 0.02
    # neighbouring samples and seeds are unrelated
    assert abs(float(torch.corrcoef(u[:2])[0, 1])) < 0.15
    assert len({sample_seed(s, i) for s in range(20) for i in range(200)}) == 4000


def test_a_draw_of_the_wrong_shape_is_refused():
    with pytest.raises(ValueError, match=r"needs shape \(3, \.\.\.\)"):
        SampleStreams(0, range(3)).rand((4, 2))


# --- the fallback: attacks whose results depend on the chunking ------------------------------


class SharedGeneratorNoise(Attack):
    """A plugin drawing from the call's one shared generator: chunk-dependent."""

    name = "shared-noise"
    family = AttackFamily.DECISION
    norm = Norm.LINF
    requires = Capability.LABELS

    def perturb(self, predictor, x, y, eps, call):
        noise = torch.rand(x.shape, generator=call.generator, device=x.device) * 2 - 1
        return x + eps * noise, torch.ones(len(x), dtype=torch.long, device=x.device)


def test_units_of_a_chunk_dependent_attack_are_keyed_by_the_batch_size(tmp_path):
    """Another batch size: the built-in attack's unit is resumed, the chunk-dependent
    plugin's is computed again (never mixed), and a plugin that declares
    ``chunk_independent`` is resumed too."""
    registry = build_registry()
    registry.add("attack", SharedGeneratorNoise, "test")
    store = ResultStore(f"sqlite:///{tmp_path / 'r.db'}")
    attacks = (AttackSpec(name="square-linf", config={"queries": 20}, eps=(0.1,)),
               AttackSpec(name="shared-noise", eps=(0.1,)))  # fmt: skip
    metrics = (MetricSpec(name="robust-accuracy"),)  # every attack (aaw: white-box only)
    plan = EvaluationPlan(dataset=DatasetSpec(limit=12), attacks=attacks, metrics=metrics,
                          device="cpu", batch_size=4)  # fmt: skip
    first = Runner(plan, store, registry, quiet=True).run()
    again = Runner(plan.model_copy(update={"batch_size": 5}), store, registry, resume=True,
                   quiet=True).run()  # fmt: skip
    assert again.resumed_units == 1  # square-linf's
    assert len(store.finished_units()) == 3
    same = Runner(plan, store, registry, resume=True, quiet=True).run()
    assert same.resumed_units == 2
    assert [v.value for v in same.values] == [v.value for v in first.values]
    SharedGeneratorNoise.chunk_independent = True  # what a plugin using call.streams says
    try:
        declared = Runner(plan.model_copy(update={"batch_size": 5}), store, registry,
                          resume=True, quiet=True).run()  # fmt: skip
    finally:
        SharedGeneratorNoise.chunk_independent = False
    assert declared.resumed_units == 1  # its key no longer names a batch size: a new unit


@pytest.mark.parametrize("defense, resumed", [("resize-pad", 0), ("bit-depth", 2)])
def test_a_random_input_defense_keys_every_unit_by_the_batch_size(tmp_path, defense, resumed):
    """A random input defense draws from one stream across the batches (EOT included), so
    with one in the plan every unit's key names the batch size; a deterministic one does not."""
    store = ResultStore(f"sqlite:///{tmp_path / 'r.db'}")
    plan = EvaluationPlan(
        dataset=DatasetSpec(limit=8), defenses=(DefenseSpec(name=defense),),
        attacks=(AttackSpec(name="fgsm", eps=(0.1,)),),
        metrics=(MetricSpec(name="ca"), MetricSpec(name="aaw")), device="cpu", batch_size=4,
    )  # fmt: skip
    Runner(plan, store, quiet=True).run()
    other = plan.model_copy(update={"batch_size": 3})
    assert Runner(other, store, resume=True, quiet=True).run().resumed_units == resumed
    assert Runner(plan, store, resume=True, quiet=True).run().resumed_units == 2


def test_a_large_draw_spread_over_threads_gives_the_sequential_numbers(monkeypatch):
    """A random start at 224x224 is drawn sample by sample on torch's threads: each sample's
    generator is its own, so the numbers are those of the one-thread draw."""
    import aisafety.attack.streams as streams

    shape = (6, 3, 64, 64)

    def draw() -> tuple[torch.Tensor, torch.Tensor]:
        s = SampleStreams(11, torch.arange(6))
        return s.rand(shape), s.randn(shape)

    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    sequential = draw()
    monkeypatch.setattr(torch, "get_num_threads", lambda: 4)
    monkeypatch.setattr(streams, "PARALLEL_DRAW", 1)
    threaded = draw()
    assert all(torch.equal(a, b) for a, b in zip(sequential, threaded, strict=True))
    # and each sample's numbers are its own generator's, as before
    generator = torch.Generator().manual_seed(sample_seed(11, 3))
    assert torch.equal(sequential[0][3].flatten(), torch.rand(3 * 64 * 64, generator=generator))
