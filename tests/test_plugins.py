"""Plugins: the example plugin installed for real, its algorithms, and the registry's rules.

The example plugin's source (plugins/aisafety-example/src) is imported directly for the unit
tests; the CLI tests install it with pip into a temporary folder and find it only through its
entry point, as a user's installation would.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import children
import numpy as np
import pytest
import torch
from scipy.ndimage import gaussian_filter
from torch import nn

from aisafety import cli
from aisafety.attack.fgsm import FGSM
from aisafety.attack.streams import SampleStreams
from aisafety.database.datasets.base import LoadedDataset
from aisafety.defense.obfuscation import obfuscation_warnings
from aisafety.errors import CapabilityError, ConfigError
from aisafety.evaluation.context import EvaluationContext
from aisafety.hookspecs import hookimpl
from aisafety.interfaces import AttackFamily, Capability, Direction
from aisafety.plugin import InputDefense, PluginConfig
from aisafety.plugins import BUILTIN, build_registry
from aisafety.prediction.base import Predictor
from aisafety.prediction.torch_module import TorchPredictor

REPO = Path(__file__).resolve().parents[1]
PLUGIN_DIR = REPO / "plugins" / "aisafety-example"
sys.path.insert(0, str(PLUGIN_DIR / "src"))  # the source under test, not an installed copy
example_plugin = importlib.import_module("aisafety_example.plugin")
noise_module = importlib.import_module("aisafety_example.uniform_noise")
blur_module = importlib.import_module("aisafety_example.gaussian_blur")
margin_module = importlib.import_module("aisafety_example.mean_margin")
UniformNoiseLinf = noise_module.UniformNoiseLinf
GaussianBlur = blur_module.GaussianBlur
MeanMargin = margin_module.MeanMargin

EXAMPLE_NAMES = {
    "attack": "uniform-noise-linf",
    "defense": "gaussian-blur",
    "metric": "mean-margin",
}


# --- helpers ---------------------------------------------------------------------------------


def _linear_predictor(shape=(1, 4, 4), classes=3, seed=0) -> TorchPredictor:
    """A small random linear classifier: fast, and random noise can flip its labels."""
    gen = torch.Generator().manual_seed(seed)
    linear = nn.Linear(math.prod(shape), classes)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(linear.weight.shape, generator=gen))
        linear.bias.zero_()
    return TorchPredictor(nn.Sequential(nn.Flatten(), linear), shape, classes, name="linear")


class LabelsOnly(Predictor):
    """A black box that answers with labels only (one-hot scores, no gradients)."""

    def __init__(self, inner: Predictor):
        self.inner = inner
        self.name = "labels-only"
        self.input_shape = inner.input_shape
        self.num_classes = inner.num_classes
        self.capabilities = frozenset({Capability.LABELS})

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            labels = self.inner._logits(x).argmax(1)
        return nn.functional.one_hot(labels, self.num_classes).float()


def _correctly_labelled(predictor: Predictor, n=64, seed=1):
    """Random inputs labelled with the model's own predictions: all clean-correct.

    ``predict`` returns an inference-mode tensor, which autograd refuses to save (FGSM's
    cross-entropy would fail on it); the clone is an ordinary tensor.
    """
    x = torch.rand((n, *predictor.input_shape), generator=torch.Generator().manual_seed(seed))
    return x, predictor.predict(x).clone()


def _plugin(name: str, **hooks) -> types.ModuleType:
    """An in-test plugin module whose attributes are ``@hookimpl`` functions."""
    module = types.ModuleType(name)
    for hook_name, function in hooks.items():
        setattr(module, hook_name, hookimpl(function))
    return module


# --- the uniform-noise attack ----------------------------------------------------------------


@pytest.mark.parametrize("eps", [0.05, 0.3, 1.0])
def test_noise_attack_stays_within_budget(eps):
    predictor = _linear_predictor()
    x, y = _correctly_labelled(predictor)
    result = UniformNoiseLinf({"samples": 8})(predictor, x, y, eps)
    assert float(result.norms["linf"].max()) <= eps + 1e-6
    assert float(result.x_adv.min()) >= 0.0 and float(result.x_adv.max()) <= 1.0
    # steps = draws used: the flipping draw's index on success, all of them on failure
    assert result.steps[~result.success].eq(8).all()
    assert result.steps[result.success].ge(1).all() and result.steps.le(8).all()
    # failures hand back the clean input unchanged
    assert torch.equal(result.x_adv[~result.success], x[~result.success])


def test_noise_attack_with_zero_budget_never_succeeds():
    predictor = _linear_predictor()
    x, y = _correctly_labelled(predictor)
    result = UniformNoiseLinf({"samples": 5})(predictor, x, y, 0.0)
    assert not result.success.any()
    assert torch.equal(result.x_adv, x)
    assert result.steps.eq(5).all()


def test_noise_attack_keeps_the_first_flipping_draw():
    """Re-draw the noise with the same seed by hand (one stream per sample, seeded from the
    seed and the sample's index): the kept draw is the first that flips."""
    predictor, eps, k, seed = _linear_predictor(), 1.0, 6, 3
    x, y = _correctly_labelled(predictor)
    result = UniformNoiseLinf({"samples": k, "seed": seed})(predictor, x, y, eps)
    assert result.success.any(), "with eps=1 random noise must flip some labels of this model"

    streams = SampleStreams(seed, range(len(x)))
    draws = [(x + eps * (2 * streams.rand(x.shape) - 1)).clamp(0, 1) for _ in range(k)]
    flips = torch.stack([predictor.predict(d) != y for d in draws])  # (k, n)
    expected_success = flips.any(0)
    first = flips.float().argmax(0)  # index of the first True
    assert torch.equal(result.success, expected_success)
    assert torch.equal(result.steps[expected_success], first[expected_success] + 1)
    for i in torch.nonzero(expected_success).flatten().tolist():
        torch.testing.assert_close(result.x_adv[i], draws[int(first[i])][i], atol=1e-6, rtol=0)


def test_noise_attack_is_seeded_and_validates_config():
    predictor = _linear_predictor()
    x, y = _correctly_labelled(predictor)
    a = UniformNoiseLinf({"seed": 7})(predictor, x, y, 0.5)
    b = UniformNoiseLinf({"seed": 7})(predictor, x, y, 0.5)
    assert torch.equal(a.x_adv, b.x_adv) and torch.equal(a.steps, b.steps)
    assert UniformNoiseLinf().config.samples == 10
    with pytest.raises(ConfigError, match="samples"):
        UniformNoiseLinf({"samples": 0})
    with pytest.raises(ConfigError, match="samples"):
        UniformNoiseLinf({"sample": 3})


def test_noise_attack_needs_labels_only():
    assert UniformNoiseLinf.family is AttackFamily.DECISION
    assert UniformNoiseLinf.requires is Capability.LABELS
    black_box = LabelsOnly(_linear_predictor())
    x, y = _correctly_labelled(black_box)
    result = UniformNoiseLinf({"samples": 4})(black_box, x, y, 1.0)
    assert result.success.any()
    with pytest.raises(CapabilityError):  # a gradient attack cannot run on it
        FGSM()(black_box, x, y, 0.1)


# --- the Gaussian-blur defense ---------------------------------------------------------------


@pytest.mark.parametrize("value", [0.0, 0.37, 1.0])
@pytest.mark.parametrize("sigma", [0.5, 1.0, 2.0])
def test_blur_of_a_constant_image_is_the_constant(value, sigma):
    defense = GaussianBlur(_linear_predictor(shape=(3, 13, 16)), {"sigma": sigma})
    x = torch.full((2, 3, 13, 16), value)
    torch.testing.assert_close(defense.transform(x), x, atol=1e-6, rtol=0)


def test_blur_with_tiny_sigma_is_the_identity():
    defense = GaussianBlur(_linear_predictor(shape=(3, 8, 8)), {"sigma": 1e-3})
    x = torch.rand(4, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    assert defense.kernel.shape == (3, 3)  # 2 * ceil(0.003) + 1
    torch.testing.assert_close(defense.transform(x), x, atol=1e-7, rtol=0)


@pytest.mark.parametrize(("sigma", "size"), [(0.5, 5), (1.0, 7), (1.2, 9), (2.0, 13)])
def test_blur_kernel_size_and_impulse_response(sigma, size):
    defense = GaussianBlur(_linear_predictor(shape=(1, 21, 21)), {"sigma": sigma})
    assert defense.kernel.shape == (size, size)
    impulse = torch.zeros(1, 1, 21, 21)
    impulse[0, 0, 10, 10] = 1.0
    response = defense.transform(impulse)[0, 0]
    r = size // 2
    # away from the border the response to a unit impulse is the kernel itself
    torch.testing.assert_close(response[10 - r : 11 + r, 10 - r : 11 + r], defense.kernel)
    offsets = torch.arange(-r, r + 1, dtype=torch.float64)
    g = torch.exp(-(offsets**2) / (2 * sigma**2))
    torch.testing.assert_close(defense.kernel.double(), torch.outer(g, g) / g.sum() ** 2)
    assert float(response.sum()) == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("sigma", [1.0, 2.0])
def test_blur_matches_scipy_with_reflect_padding(sigma):
    """scipy's 'mirror' mode is torch's 'reflect'; truncate=3 gives the same radius here."""
    defense = GaussianBlur(_linear_predictor(shape=(2, 15, 18)), {"sigma": sigma})
    x = torch.rand(3, 2, 15, 18, generator=torch.Generator().manual_seed(1))
    expected = np.stack(
        [
            [gaussian_filter(c, sigma, mode="mirror", truncate=3.0) for c in image]
            for image in x.double().numpy()
        ]
    )
    np.testing.assert_allclose(defense.transform(x).numpy(), expected, atol=1e-6, rtol=0)


def test_blur_is_differentiable_and_wraps_the_model():
    inner = _linear_predictor(shape=(1, 8, 8))
    defense = GaussianBlur(inner, {"sigma": 1.0})
    assert defense.name == "linear+gaussian-blur"
    assert defense.capabilities == inner.capabilities
    x = torch.rand(2, 1, 8, 8, generator=torch.Generator().manual_seed(2), requires_grad=True)
    defense.logits(x).sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    # a white-box attack runs through it
    xs, ys = _correctly_labelled(defense, n=16)
    assert FGSM()(defense, xs, ys, 0.1).norms["linf"].max() <= 0.1 + 1e-6


def test_blur_rejects_bad_sigma():
    with pytest.raises(ConfigError, match="sigma"):
        GaussianBlur(_linear_predictor(), {"sigma": 0})
    with pytest.raises(ConfigError, match="smaller sigma"):  # radius 6 on 4x4 images
        GaussianBlur(_linear_predictor(shape=(1, 4, 4)), {"sigma": 2.0})


class PluginConfigRounding(InputDefense):
    """A plugin defense written as plugins/aisafety-example's README step 4 says: its Config
    derives from PluginConfig, not InputDefenseConfig."""

    name = "test-plugin-rounding"

    class Config(PluginConfig):
        levels: int = 4

    def transform(self, x: torch.Tensor) -> torch.Tensor:
        return torch.round(x * (self.config.levels - 1)) / (self.config.levels - 1)


def test_plugin_defense_on_a_plugin_config_takes_bpda_and_eot():
    """The obfuscation warning tells every non-differentiable defense to set bpda: true; a
    plugin's defense once refused it ("bpda: Extra inputs are not permitted")."""
    inner = _linear_predictor()
    assert obfuscation_warnings(PluginConfigRounding(inner), [FGSM()])  # asks for bpda
    defense = PluginConfigRounding(inner, {"levels": 3, "bpda": True, "eot_samples": 2})
    assert (defense.config.levels, defense.config.bpda, defense.config.eot_samples) == (3, True, 2)
    assert not obfuscation_warnings(defense, [FGSM()])
    x = torch.rand(2, 1, 4, 4, generator=torch.Generator().manual_seed(0), requires_grad=True)
    defense.logits(x).sum().backward()  # straight through the rounding: the linear weights
    weights = inner.module[1].weight.sum(0).view(1, 1, 4, 4)
    torch.testing.assert_close(x.grad, weights.expand(2, -1, -1, -1))
    with pytest.raises(ConfigError, match="bpda"):
        PluginConfigRounding(inner, {"bpda": "maybe"})


def test_example_blur_is_differentiable_so_no_obfuscation_warning():
    assert not obfuscation_warnings(GaussianBlur(_linear_predictor()), [FGSM()])


# --- the mean-margin metric ------------------------------------------------------------------


def _context(predictor: Predictor, x: torch.Tensor, y: torch.Tensor) -> EvaluationContext:
    data = LoadedDataset("hand-made", x, y, tuple(str(c) for c in range(predictor.num_classes)))
    return EvaluationContext(predictor, data, make_attack=lambda spec: None)


def test_mean_margin_by_hand_through_a_linear_model():
    linear = nn.Linear(3, 3)
    with torch.no_grad():
        linear.weight.copy_(10 * torch.eye(3))
        linear.bias.zero_()
    predictor = TorchPredictor(nn.Sequential(nn.Flatten(), linear), (1, 1, 3), 3)
    x = torch.tensor([[0.9, 0.1, 0.3], [0.2, 0.7, 0.4], [0.5, 0.5, 0.0]]).view(3, 1, 1, 3)
    y = torch.tensor([0, 2, 1])
    # logits = 10 x; margins: 9 - 3 = 6, 4 - 7 = -3, 5 - 5 = 0; mean 1
    value = MeanMargin().compute(_context(predictor, x, y))[0]
    assert value.metric == "mean-margin"
    assert value.value == pytest.approx(1.0, abs=1e-5)
    assert value.n_samples == 3
    assert value.direction is Direction.HIGHER
    assert value.attack is None and value.eps is None
    assert value.details["fraction_positive"] == pytest.approx(1 / 3)


def test_mean_margin_by_hand_on_given_logits(monkeypatch):
    predictor = _linear_predictor(shape=(1, 1, 3))
    ctx = _context(predictor, torch.zeros(3, 1, 1, 3), torch.tensor([0, 1, 1]))
    logits = torch.tensor([[2.0, -1.0, 0.5], [-3.0, 4.0, 4.5], [0.0, 0.0, -7.0]])
    monkeypatch.setattr(ctx, "clean_logits", logits)
    # margins: 2 - 0.5 = 1.5, 4 - 4.5 = -0.5, 0 - 0 = 0 (a tie is no margin); mean 1/3
    assert MeanMargin().compute(ctx)[0].value == pytest.approx(1 / 3, abs=1e-12)


def test_mean_margin_declares_what_it_is_and_needs_scores():
    assert MeanMargin.per_attack is False
    assert MeanMargin.requires is Capability.SCORES
    assert MeanMargin.describe()["direction"] == "higher"
    black_box = LabelsOnly(_linear_predictor(shape=(1, 1, 3)))
    ctx = _context(black_box, torch.zeros(2, 1, 1, 3), torch.tensor([0, 1]))
    with pytest.raises(CapabilityError, match="mean-margin"):
        MeanMargin().compute(ctx)[0]


# --- registry rules --------------------------------------------------------------------------


def test_example_plugin_registers_in_code():
    registry = build_registry(extra_plugins=[("example", example_plugin)])
    for kind, name in EXAMPLE_NAMES.items():
        assert registry.sources[kind][name] == "example"
    info = next(p for p in registry.plugins if p.name == "example")
    assert info.provides == {kind: [name] for kind, name in EXAMPLE_NAMES.items()}
    defense = registry.create("defense", "gaussian-blur", {"sigma": 0.5}, _linear_predictor())
    assert isinstance(defense, GaussianBlur) and defense.config.sigma == 0.5


def test_duplicate_name_with_a_builtin_keeps_the_builtin_and_names_both_plugins():
    """A plugin re-registering a built-in name must not make every command fail (it did:
    exit 2 everywhere, 'aisafety plugins' included): the built-in stays, the clash is
    reported, the plugin's other classes still load."""
    other = type("OtherFGSM", (FGSM,), {})
    clash = _plugin("clash", aisafety_attacks=lambda: [other, UniformNoiseLinf])
    registry = build_registry(extra_plugins=[("my-fgsm-plugin", clash)])
    assert registry.get("attack", "fgsm") is FGSM
    assert registry.sources["attack"]["uniform-noise-linf"] == "my-fgsm-plugin"
    [failure] = registry.failures
    assert failure.name == "my-fgsm-plugin"
    assert "'fgsm'" in failure.error and BUILTIN in failure.error and "skipped" in failure.error


def test_duplicate_name_between_two_plugins_names_both():
    twin = type("Twin", (UniformNoiseLinf,), {"name": "twin-noise"})
    first = _plugin("first", aisafety_attacks=lambda: [twin])
    second = _plugin("second", aisafety_attacks=lambda: [twin])
    registry = build_registry(extra_plugins=[("first-plugin", first), ("second-plugin", second)])
    assert registry.sources["attack"]["twin-noise"] == "first-plugin"
    [failure] = registry.failures
    assert "twin-noise" in failure.error
    assert "first-plugin" in failure.error and "second-plugin" in failure.error


def test_a_raising_hook_is_a_failure_and_the_rest_still_loads():
    def explode():
        raise RuntimeError("boom from the exploding plugin")

    exploding = _plugin(
        "exploding",
        aisafety_defenses=lambda: [type("Blur2", (GaussianBlur,), {"name": "blur-2"})],
        aisafety_metrics=explode,
    )
    registry = build_registry(extra_plugins=[("exploding", exploding), ("example", example_plugin)])
    [failure] = registry.failures
    assert failure.name == "exploding"
    assert "boom from the exploding plugin" in failure.error
    assert "blur-2" not in registry.names("defense")  # a failing plugin adds nothing
    assert {"fgsm", "pgd-linf"} <= set(registry.names("attack"))
    assert "ca" in registry.names("metric")
    assert "mean-margin" in registry.names("metric")  # plugins after the failure load too
    assert [p.name for p in registry.plugins] == [BUILTIN, "example"]


def test_a_misspelt_hook_is_reported_as_a_failure():
    misspelt = _plugin("misspelt", aisafety_atacks=lambda: [UniformNoiseLinf])
    registry = build_registry(extra_plugins=[("misspelt", misspelt), ("example", example_plugin)])
    [failure] = registry.failures
    assert failure.name == "misspelt"
    assert "aisafety_atacks" in failure.error
    assert registry.sources["attack"]["uniform-noise-linf"] == "example"
    assert "fgsm" in registry.names("attack")


# --- the installed plugin, through the command line ------------------------------------------


def _cli(*args: str, pythonpath: list[Path], cwd: Path) -> subprocess.CompletedProcess:
    """``python -m aisafety.cli ARGS`` in a fresh interpreter with ``pythonpath`` in front."""
    paths = [str(p) for p in pythonpath] + [str(REPO)]
    if os.environ.get("PYTHONPATH"):
        paths.append(os.environ["PYTHONPATH"])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    return children.run(
        [sys.executable, "-m", "aisafety.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
    )


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The example plugin pip-installed into a folder of its own; returns that folder."""
    root = tmp_path_factory.mktemp("example-plugin")
    # Build from a copy so that setuptools' build/ and *.egg-info do not land in the tree.
    source = root / "source"
    shutil.copytree(
        PLUGIN_DIR, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__")
    )
    target = root / "site"
    pip = children.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation",
         "--no-index", "--disable-pip-version-check", "--quiet", "--target", str(target),
         str(source)],
        capture_output=True,
        text=True,
    )  # fmt: skip
    assert pip.returncode == 0, pip.stdout + pip.stderr
    assert (target / "aisafety_example" / "plugin.py").is_file()
    assert list(target.glob("aisafety_example-0.1.0.dist-info"))
    return target


def test_installed_plugin_is_listed_with_its_origin(installed, tmp_path):
    done = _cli("plugins", pythonpath=[installed], cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {line.split()[0]: line for line in done.stdout.splitlines() if line.strip()}
    assert BUILTIN in rows
    row = rows["example"]
    assert "aisafety-example 0.1.0" in row
    for kind, name in EXAMPLE_NAMES.items():
        assert f"{kind}: {name}" in row


def test_installed_plugin_in_list_attacks_json(installed, tmp_path):
    done = _cli("list", "attacks", "--format", "json", pythonpath=[installed], cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    entries = {e["name"]: e for e in json.loads(done.stdout)}
    entry = entries["uniform-noise-linf"]
    expected = {"family": "decision", "norm": "linf", "requires": "labels", "plugin": "example"}
    assert expected.items() <= entry.items()
    assert entry["description"]
    assert entries["fgsm"]["plugin"] == BUILTIN


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("attacks", {"family": "decision", "norm": "linf", "requires": "labels"}),
        ("defenses", {"kind": "input"}),
        ("metrics", {"direction": "higher", "per_attack": False, "requires": "scores"}),
    ],
)
def test_list_json_describes_the_example_plugin(monkeypatch, capsys, kind, expected):
    """The same listing in-process, for every kind (a subprocess each would be slow)."""
    registry = build_registry(extra_plugins=[("example", example_plugin)])
    monkeypatch.setattr(cli.common, "default_registry", lambda: registry)
    assert cli.main(["list", kind, "--format", "json"]) == 0
    entries = {e["name"]: e for e in json.loads(capsys.readouterr().out)}
    entry = entries[EXAMPLE_NAMES[kind.rstrip("s")]]
    assert {**expected, "plugin": "example"}.items() <= entry.items()
    assert entry["description"]


def test_installed_plugin_runs_in_an_evaluation(installed, tmp_path, capsys):
    """The evaluation in a fresh interpreter that finds the plugin only through its entry
    point; the stored rows are then read in this process (the query needs no plugin; a
    second interpreter cost ~0.6 s of CPU)."""
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        textwrap.dedent(
            """\
            model: {name: mnist-cnn}
            dataset: {name: mnist-embedded, limit: 50}
            defenses: [gaussian-blur]
            attacks:
              - {name: uniform-noise-linf, eps: 0.3}
            metrics: [ca, mean-margin, acac]
            device: cpu
            """
        )
    )
    db = f"sqlite:///{tmp_path / 'r.db'}"
    done = _cli("evaluate", str(plan), "--db", db, "--quiet", pythonpath=[installed], cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr

    sql = "select metric, attack, eps, value, n_samples from results"
    capsys.readouterr()
    code, out = cli.main(["query", sql, "--db", db, "--format", "json"]), capsys.readouterr()
    assert code == 0, out.out + out.err
    rows = {r["metric"]: r for r in json.loads(out.out)}
    assert set(rows) == {"ca", "mean-margin", "acac"}
    ca, margin, acac = rows["ca"], rows["mean-margin"], rows["acac"]
    assert ca["n_samples"] == margin["n_samples"] == 50
    assert 0.5 <= ca["value"] <= 1.0  # the zoo CNN still reads lightly blurred digits
    assert math.isfinite(margin["value"]) and margin["value"] > 0  # mostly right => positive
    assert acac["attack"] == "uniform-noise-linf" and acac["eps"] == 0.3
    # no successful example leaves acac undefined (stored as NULL); otherwise a probability
    assert (acac["value"] is None) if acac["n_samples"] == 0 else (0 < acac["value"] <= 1)

    # the per-sample rows, read directly: every example within budget, steps = draws used
    with sqlite3.connect(tmp_path / "r.db") as connection:
        [run] = connection.execute(
            "select family, norm, n_samples, success_rate from attack_runs"
        ).fetchall()
        max_linf, min_steps, max_steps, successes = connection.execute(
            "select max(linf), min(steps), max(steps), sum(success) from sample_outcomes"
        ).fetchone()
    assert run[:3] == ("decision", "linf", 50)
    assert run[3] == pytest.approx(successes / 50)
    assert max_linf <= 0.3 + 1e-6
    assert 1 <= min_steps <= max_steps <= 10


def test_broken_entry_point_is_reported_and_builtins_still_load(tmp_path):
    site = tmp_path / "site"
    dist_info = site / "broken_plugin-0.3.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: broken-plugin\nVersion: 0.3\n"
    )
    (dist_info / "entry_points.txt").write_text("[aisafety]\nbroken = broken_plugin_module\n")
    (site / "broken_plugin_module.py").write_text(
        'raise ImportError("broken_plugin_module needs a library that is not installed")\n'
    )
    done = _cli("plugins", pythonpath=[site], cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "plugin 'broken' (broken-plugin 0.3) failed to load" in done.stdout
    assert "broken_plugin_module needs a library that is not installed" in done.stdout
    assert BUILTIN in done.stdout and "fgsm" in done.stdout
