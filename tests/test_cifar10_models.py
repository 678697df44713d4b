"""Every net of ../shared/data/cifar10-models loads from its plan in
examples/cifar10-models/ with the preprocessing its README documents (section 6) and scores
the accuracy measured there with onnxruntime on the 100 ERAN CIFAR-10 test images."""

from __future__ import annotations

from pathlib import Path

import pytest

from aisafety.config import load_plan
from aisafety.interfaces import DatasetSpec, MetricSpec
from aisafety.plugins import default_registry
from aisafety.runner import Runner
from aisafety.store.results import ResultStore
from tests.eran_cifar import write_npz
from tests.shared_data import relocated

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

PLANS = Path(__file__).resolve().parents[1] / "examples" / "cifar10-models"
# README section 6, "acc ERAN-100"
MEASURED = {
    "resnet_2b": 0.77, "resnet_4b": 0.81, "cifar10_small": 0.61, "cifar10_medium": 0.77,
    "cifar10_large": 0.78, "pgd_2_3_16": 0.71, "ibp_3_3_8": 0.69, "cifar10_keras_cnn": 0.88,
}  # fmt: skip
PUBLISHED_PGD_2B = 0.5482  # resnet_2b, PGD at 2/255, full test set (benchmark README)


def run_plan(name: str, tmp_path: Path, metrics: tuple[str, ...] | None = None) -> dict:
    plan = load_plan(PLANS / f"{name}.yaml")
    model = plan.model.model_copy(update={"path": relocated(plan.model.path)})
    plan = plan.model_copy(update={"model": model})
    if not model.path.is_file():
        pytest.skip(f"{model.path} is not here")
    if "cifar10-embedded" not in default_registry().names("dataset"):
        data = DatasetSpec(name="npz", path=write_npz(tmp_path / "cifar.npz"))
        plan = plan.model_copy(update={"dataset": data})
    if metrics is not None:  # the clean metric only: no attack
        plan = plan.model_copy(
            update={"attacks": (), "metrics": tuple(MetricSpec(name=m) for m in metrics)}
        )
    store = ResultStore(f"sqlite:///{tmp_path / 'r.db'}")
    Runner(plan, store, quiet=True).run()
    _, rows = store.query("SELECT metric, value FROM results")
    return dict(rows)


@pytest.mark.parametrize("name", sorted(MEASURED))
def test_net_reproduces_its_documented_accuracy(tmp_path, name):
    values = run_plan(name, tmp_path, metrics=("ca",))
    print(f"{name}: clean accuracy {values['ca']:.2f} (README: {MEASURED[name]:.2f})")
    assert values["ca"] == pytest.approx(MEASURED[name], abs=1e-9)


def test_resnet_2b_pgd_beside_its_published_accuracy(tmp_path):
    values = run_plan("resnet_2b", tmp_path)
    robust = values["robust-accuracy"]
    print(
        f"resnet_2b PGD-50 at 2/255: {robust:.2%} on the 100 ERAN images; published "
        f"{PUBLISHED_PGD_2B:.2%} on the full test set (clean: {values['ca']:.2%} vs 69.25%)"
    )
    assert robust < values["ca"]
    # 100 images: about +-5 points of sampling error against the full-set figure
    assert abs(robust - PUBLISHED_PGD_2B) < 0.15
