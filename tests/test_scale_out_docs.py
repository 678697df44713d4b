"""docs/scale-out.md's commands run as written: the suite's Ray cluster (``ray_cluster``,
tests/conftest.py) is the one the block "Starting the cluster" starts (its ``export`` lines
and both ``ray start`` lines, tests/documented_cluster.py), and the block "Running a plan on a
cluster" (``aisafety evaluate plan.yaml --executor ray --address auto --db ...``) runs a plan
on it into PostgreSQL (in the default suite as tests/test_scale_out.py's driver, which checks
every stored number; its run here is slow). A driver without the token, or with another
one, is refused with exit 2 and a message naming the variables and the fix. What the tests
change in the documented lines, and why: tests/documented_cluster.py.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import children
import pytest
import yaml
from documented_cluster import block, documented_driver, documented_environment

TINY_PLAN = {
    "dataset": {"name": "mnist-embedded", "limit": 20},
    "attacks": [{"name": "fgsm", "eps": [0.1]}],
    "metrics": ["ca", "robust-accuracy"],
    "device": "cpu",
}


def test_the_documented_commands_have_the_shape_this_test_runs():
    """Token authentication on for every node, the worker joining the head's port, the
    driver going to the cluster this machine joined: what the slow test below relies on."""
    env = documented_environment()
    assert env.keys() == {"RAY_AUTH_MODE", "RAY_AUTH_TOKEN"} and env["RAY_AUTH_MODE"] == "token"
    lines = [c for c in block("ray start --head") if c.startswith("ray ")]
    assert lines == ["ray start --head --port=6379", "ray start --address=HEAD_IP:6379"]
    driver = documented_driver(Path("plan.yaml"), "sqlite://")
    assert driver[driver.index("--address") + 1] == "auto"
    assert driver[driver.index("--executor") + 1] == "ray"


def _drive(
    cluster, url: str, tmp_path: Path, **env: str | None
) -> children.subprocess.CompletedProcess:
    """The documented driver command against ``cluster``, its environment the cluster's with
    ``env`` applied (None: the variable removed)."""
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump(TINY_PLAN))
    environment = {**os.environ, **cluster.env, "RAY_ADDRESS": cluster.address}
    for name, value in env.items():
        environment.pop(name, None)
        if value is not None:
            environment[name] = value
    return children.run(
        documented_driver(plan, url), capture_output=True, text=True, env=environment,
        cwd=tmp_path, what="the documented 'aisafety evaluate' on the documented cluster",
    )  # fmt: skip


def test_ray_s_refusals_are_told_apart_from_an_unreachable_cluster(monkeypatch):
    """The chains Ray 2.60 raises (seen against a real cluster): a wrong token is a
    ConnectionError from a RuntimeError whose text holds the AuthenticationError; a missing
    token is AuthenticationError itself; a head that is not there is neither."""
    pytest.importorskip("ray", reason="Ray is not installed: pip install 'aisafety[distributed]'")
    from ray.exceptions import AuthenticationError

    from aisafety.distributed.executor import _authentication_advice, _refused_for_authentication

    try:
        try:
            raise RuntimeError(
                "Failed to connect to GCS. Last connection error: ... "
                "ray.exceptions.AuthenticationError: RPC error: InvalidAuthToken"
            )
        except RuntimeError as inner:
            raise ConnectionError("Failed to connect to Ray cluster at 127.0.0.1:1") from inner
    except ConnectionError as wrong:
        assert _refused_for_authentication(wrong)
    assert _refused_for_authentication(AuthenticationError("no authentication token was found"))
    assert not _refused_for_authentication(ConnectionError("Failed to connect to Ray cluster"))
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    assert "RAY_AUTH_MODE is 'disabled', not 'token'" in _authentication_advice("auto")
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.setenv("RAY_AUTH_TOKEN", "a-secret-token")
    advice = _authentication_advice("auto")
    assert "is not the cluster's" in advice and "a-secret-token" not in advice


@pytest.mark.slow  # ~8 s idle: the same documented command runs in the default suite
def test_the_documented_cluster_runs_the_documented_driver_command(
    ray_cluster, postgres_url, tmp_path
):
    """Covered in the default suite by tests/test_scale_out.py::
    test_a_plan_on_ray_and_postgresql_stores_what_a_local_run_stores_in_sqlite, whose driver
    (and --resume) is this documented command on this cluster (session 17)."""
    driver = _drive(ray_cluster, postgres_url, tmp_path)
    assert driver.returncode == 0, driver.stderr[-3000:]
    assert "2/2 units done" in driver.stderr


# A wrong token or no RAY_AUTH_MODE: Ray retries for ~20 s before it gives up (~35 s each
# at load 4); a missing token is refused at once (~14 s, the driver's imports)
SLOW_REFUSAL = pytest.mark.slow


@pytest.mark.parametrize(
    "change, why",
    [
        pytest.param(
            {"RAY_AUTH_TOKEN": "not-the-clusters-token"}, "is not the cluster's", marks=SLOW_REFUSAL
        ),
        ({"RAY_AUTH_TOKEN": None}, "RAY_AUTH_TOKEN is not set"),
        pytest.param({"RAY_AUTH_MODE": None}, "RAY_AUTH_MODE is not set", marks=SLOW_REFUSAL),
    ],
    ids=["wrong-token", "no-token", "no-mode"],
)
def test_a_driver_refused_for_authentication_says_so(
    ray_cluster, change, why, postgres_url, tmp_path
):
    driver = _drive(ray_cluster, postgres_url, tmp_path, **change)
    assert driver.returncode == 2, driver.stderr[-3000:]
    message = driver.stderr.strip().splitlines()[-1]
    assert "refused this driver's authentication" in message and why in message
    assert "export RAY_AUTH_MODE=token and RAY_AUTH_TOKEN=" in message
    assert "Traceback" not in driver.stderr
    assert not re.search(ray_cluster.env["RAY_AUTH_TOKEN"], driver.stderr)
