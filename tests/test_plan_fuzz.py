"""Fuzzing the plan schema: any generated plan validates or fails with a ConfigError.

Keys come mostly from the real field names (so the generator reaches nested validators),
values from every JSON/YAML type including huge integers, NaN, inf and wrong nestings.
Plan text is fuzzed as well, through the YAML and TOML readers.
"""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aisafety.config import load_plan, plan_from_dict
from aisafety.errors import ConfigError
from aisafety.interfaces import (
    AttackSpec,
    DatasetSpec,
    EvaluationPlan,
    ModelSpec,
    WorkLimits,
)

FIELDS = sorted(
    {
        name
        for model in (EvaluationPlan, ModelSpec, DatasetSpec, AttackSpec, WorkLimits)
        for name in model.model_fields
    }
)
WORDS = [
    "fgsm", "pgd-linf", "ca", "aaw", "zoo", "remote", "checkpoint", "onnx", "torchscript",
    "mnist-cnn", "mnist-embedded", "test", "train", "cpu", "auto", "linf", "http://x",
]  # fmt: skip

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8)
    | st.sampled_from(WORDS)
)
keys = st.sampled_from(FIELDS) | st.text(max_size=6)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=5),
    max_leaves=25,
)
plans = st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=6), values, max_size=7)


@settings(max_examples=200, deadline=None)
@given(plans)
def test_any_plan_validates_or_raises_config_error(raw):
    try:
        plan = plan_from_dict(raw)
    except ConfigError:
        return
    assert isinstance(plan, EvaluationPlan)
    EvaluationPlan.model_validate_json(plan.model_dump_json())  # what the store keeps reloads


yaml_text = st.text(
    alphabet=st.sampled_from(list("abcdefkmnprst:-[]{},&*!|>'\"#@%01289.eE+ \n\t~")), max_size=80
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=yaml_text | st.text(max_size=40), data=st.binary(max_size=40), suffix=st.sampled_from(
    [".yaml", ".toml", ".json"]))  # fmt: skip
def test_any_plan_file_loads_or_raises_config_error(text, data, suffix):
    with tempfile.TemporaryDirectory() as folder:
        for name, content in (("t", text.encode()), ("b", data)):
            path = Path(folder) / f"{name}{suffix}"
            path.write_bytes(content)
            with contextlib.suppress(ConfigError):  # anything else fails the test
                load_plan(path)
