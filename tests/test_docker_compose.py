"""docker/docker-compose.yml (docs/scale-out.md), checked as far as a machine without a
Docker engine allows: a Compose v2 client validates the file (`config`, skipped without
one); its header's commands agree with its services; and the `ray start` command lines of
its Ray services, run here with this interpreter's Ray (on 127.0.0.1, ports and host names
replaced), make a cluster on which its header's `aisafety evaluate` command runs a plan into
PostgreSQL, through `--address auto` and through Ray Client (`ray://`). Building the image
and starting the containers are not tested: they need the engine."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import sys
from pathlib import Path

import children
import pytest
import yaml
from postgres_server import free_port

COMPOSE = Path(__file__).resolve().parents[1] / "docker" / "docker-compose.yml"
TINY_PLAN = {
    "dataset": {"name": "mnist-embedded", "limit": 30},
    "attacks": [{"name": "fgsm", "eps": [0.1, 0.3]}],
    "metrics": ["ca", "robust-accuracy"],
    "device": "cpu",
}


def _services() -> dict:
    return yaml.safe_load(COMPOSE.read_text())["services"]


def _header_command(program: str) -> list[str]:
    """The command line of the file's comments that starts with ``program`` (with its
    continuation lines), as arguments."""
    lines = [line.removeprefix("#").strip() for line in COMPOSE.read_text().splitlines()
             if line.startswith("#")]  # fmt: skip
    for i, line in enumerate(lines):
        if line.startswith(program):
            text = line
            while text.endswith("\\"):
                i += 1
                text = f"{text[:-1]} {lines[i]}"
            return shlex.split(text)
    raise AssertionError(f"no {program!r} command in the comments of {COMPOSE}")


def _option(args: list[str], name: str) -> str:
    """The value of ``--name VALUE`` or ``--name=VALUE``."""
    for i, arg in enumerate(args):
        if arg == name:
            return args[i + 1]
        if arg.startswith(f"{name}="):
            return arg.split("=", 1)[1]
    raise AssertionError(f"{name} not in {args}")


def _compose_client() -> list[str] | None:
    """A Compose v2 client (`docker compose` or `docker-compose`) that reports an invalid
    file as an error, or None. Compose v1 (Debian's docker-compose 1.29) cannot read the
    Compose Specification's top-level `name`."""
    candidates = [["docker", "compose"]] if shutil.which("docker") else []
    if shutil.which("docker-compose"):
        candidates.append(["docker-compose"])
    for client in candidates:
        version = children.run([*client, "version"], capture_output=True, text=True)
        if version.returncode == 0 and re.search(r"v?[2-9]\.\d+", version.stdout):
            return client
    return None


def test_the_header_commands_agree_with_the_services():
    services = _services()
    evaluate = _header_command("aisafety evaluate")
    assert _option(evaluate, "--executor") == "ray" and _option(evaluate, "--address") == "auto"
    url = _option(evaluate, "--db")
    database = services["postgres"]["environment"]
    expected = (
        f"postgresql+psycopg://{database['POSTGRES_USER']}:{database['POSTGRES_PASSWORD']}"
        f"@postgres:5432/{database['POSTGRES_DB']}"
    )
    assert url == expected
    head = shlex.split(services["ray-head"]["command"])
    worker = shlex.split(services["ray-worker"]["command"])
    assert head[:3] == ["ray", "start", "--head"] and worker[:2] == ["ray", "start"]
    assert _option(worker, "--address") == f"ray-head:{_option(head, '--port')}"
    client_port = _option(head, "--ray-client-server-port")
    assert f"127.0.0.1:{client_port}:{client_port}" in services["ray-head"]["ports"]
    for node in (services["ray-head"], services["ray-worker"]):
        assert node["environment"]["RAY_AUTH_MODE"] == "token"  # as testkit/ray_cluster.py


def test_docker_compose_config_accepts_the_file():
    client = _compose_client()
    if client is None:
        pytest.skip("no Docker Compose v2 client (docker compose / docker-compose) installed")
    command = [*client, "-f", str(COMPOSE), "config", "-q"]
    env = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_TOKEN"}
    ok = children.run(command, capture_output=True, text=True, env={**env, "RAY_AUTH_TOKEN": "x"})
    assert ok.returncode == 0, ok.stderr
    missing = children.run(command, capture_output=True, text=True, env=env)
    assert missing.returncode != 0 and "RAY_AUTH_TOKEN" in missing.stderr


def _compose_nodes(client_port: int):
    """The compose file's `ray start` lines for 127.0.0.1: its ports, the head's host name
    and `ray` replaced; a temporary directory, this address and one CPU for the worker
    (the container would have the machine's) added."""
    services = _services()

    def nodes(address: str, temp_dir: Path) -> tuple[list[str], list[str]]:
        port = address.rsplit(":", 1)[1]
        local = {
            "--port=6379": f"--port={port}",
            "--address=ray-head:6379": f"--address={address}",
            "--ray-client-server-port=10001": f"--ray-client-server-port={client_port}",
        }
        head, worker = (
            [local.get(a, a) for a in shlex.split(services[name]["command"])[1:]]
            for name in ("ray-head", "ray-worker")
        )
        extra = ["--node-ip-address=127.0.0.1", "--object-store-memory=200000000"]
        return [*head, f"--temp-dir={temp_dir}", *extra], [*worker, "--num-cpus=1", *extra]

    return nodes


@pytest.mark.slow  # ~1.5 min: two Ray nodes and two small plans
def test_the_compose_ray_commands_run_the_header_plan(postgres_server, tmp_path):
    pytest.importorskip("ray", reason="Ray is not installed: pip install 'aisafety[distributed]'")
    pytest.importorskip("grpc", reason="the head's Ray Client port needs ray[client] (grpcio)")
    from ray_cluster import start_ray_cluster

    environment = dict(_services()["ray-head"]["environment"])
    environment["RAY_AUTH_TOKEN"] = "compose-test-token"
    # Ray Client's proxy gives the process it starts per client 30 s to answer; on 2 busy
    # cores that process (a Python importing Ray) took longer once (load average 5.4)
    environment["RAY_CLIENT_SERVER_CHECK_CHANNEL_TIMEOUT_S"] = "180"
    client_port = free_port()
    cluster = start_ray_cluster(nodes=_compose_nodes(client_port), env=environment)
    try:
        evaluate = _header_command("aisafety evaluate")
        plan = tmp_path / "plan.json"
        plan.write_text(json.dumps(TINY_PLAN))
        for address in ("auto", f"ray://127.0.0.1:{client_port}"):
            url = postgres_server.create_database()
            args = [str(plan) if a == "plans/plan.yaml" else a for a in evaluate[1:]]
            args[args.index("--db") + 1] = url
            args[args.index("--address") + 1] = address
            driver = children.run(
                [sys.executable, "-m", "aisafety.cli", *args], capture_output=True, text=True,
                env={**os.environ, **cluster.env, "RAY_ADDRESS": cluster.address},
                cwd=tmp_path,
            )  # fmt: skip
            failure = f"--address {address}: {driver.stderr[-3000:]}"
            assert driver.returncode == 0 and "3/3 units done" in driver.stderr, failure
    finally:
        cluster.stop()
