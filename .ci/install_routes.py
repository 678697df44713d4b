"""Check the README's install routes by resolving them with pip, as a user's pip would.

    python3 .ci/install_routes.py

1. CPU route: `torch==2.13.0 torchvision==0.28.0` from PyPI's CPU wheel index
   (https://download.pytorch.org/whl/cpu) must resolve to `+cpu` builds with no CUDA
   package. Where that index cannot be reached (this project's CI machine has no route to
   it), the route is reported NOT CHECKED, not passed.
2. GPU route: the same pins from PyPI (pip's default index, this machine's pip
   configuration ignored: `pip --isolated`) must resolve to the CUDA build (nvidia-*
   packages), so the README's "GPU route" says what it installs.
3. The ONNX route in a fresh venv holding only torch 2.13.0+cpu (from pip's configured
   sources: a local wheel directory here, or the CPU index): `pip install '.[onnx]'` and
   `pip install --no-deps onnx2torch==1.5.15` must keep that torch and bring no CUDA
   package (the extra once resolved to torch 2.14.1 and ~20 nvidia-* packages through
   onnx2torch's torchvision); so must the RobustBench route's `pip install --no-deps
   robustbench==1.1.1 timm==1.0.9 ...` (with its dependencies it brings torch 2.14.1 too).
   Where no +cpu torch can be installed, NOT CHECKED.

Resolution only (`pip install --dry-run --report`): the CUDA wheels are gigabytes and this
machine has no GPU. Exit status 1 when a route resolves to the wrong thing.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PINS = ["torch==2.13.0", "torchvision==0.28.0"]
# README's RobustBench route (docs/own-model.md): its packages without their dependencies
ROBUSTBENCH = ["--no-deps", "robustbench==1.1.1", "timm==1.0.9", "huggingface_hub",
               "safetensors", "pandas", "python-dateutil", "tzdata", "geotorch", "torchdiffeq",
               "gdown", "beautifulsoup4", "soupsieve", "setuptools<81"]  # fmt: skip
UNREACHABLE = ("Name or service not known", "Failed to establish a new connection",
               "No matching distribution", "Could not find a version")  # fmt: skip


def resolve(
    args: list[str], isolated: bool = False, python: str = sys.executable
) -> tuple[list[dict] | None, str]:
    """The packages pip would install (None when it could not resolve), and its output."""
    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "report.json"
        command = [python, "-m", "pip", *(["--isolated"] if isolated else []),
                   "install", "--dry-run", "--quiet", "--report", str(report), *args]  # fmt: skip
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=600)
        except subprocess.TimeoutExpired:
            return None, "pip timed out after 600 s"
        if done.returncode != 0 or not report.is_file():
            return None, done.stdout + done.stderr
        return json.loads(report.read_text())["install"], done.stdout + done.stderr


def versions(install: list[dict]) -> dict[str, str]:
    return {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in install}


def main() -> int:
    failed = False

    cpu, output = resolve(["--ignore-installed", "--index-url", CPU_INDEX, *PINS], isolated=True)
    if cpu is None and any(reason in output for reason in UNREACHABLE):
        print(f"install route CPU: NOT CHECKED, {CPU_INDEX} cannot be reached from here")
    elif cpu is None:
        print(f"install route CPU: FAILED to resolve:\n{output[-2000:]}")
        failed = True
    else:
        found = versions(cpu)
        cuda = sorted(n for n in found if n.startswith(("nvidia-", "cuda-", "triton")))
        torch_url = next(i["download_info"]["url"] for i in cpu if i["metadata"]["name"] == "torch")
        ok = found.get("torch", "").endswith("+cpu") and not cuda and "pytorch.org" in torch_url
        print(
            f"install route CPU: {'ok' if ok else 'WRONG'} (torch {found.get('torch')} from "
            f"{torch_url.split('/torch')[0]}, torchvision {found.get('torchvision')}, "
            f"CUDA packages {cuda or 'none'})"
        )
        failed |= not ok

    gpu, output = resolve(["--ignore-installed", *PINS], isolated=True)
    if gpu is None and any(reason in output for reason in UNREACHABLE):
        print("install route GPU: NOT CHECKED, PyPI cannot be reached from here")
    elif gpu is None:
        print(f"install route GPU: FAILED to resolve:\n{output[-2000:]}")
        failed = True
    else:
        found = versions(gpu)
        nvidia = sorted(n for n in found if n.startswith("nvidia-"))
        ok = found.get("torch") == "2.13.0" and bool(nvidia)
        print(
            f"install route GPU: {'ok' if ok else 'WRONG'} (torch {found.get('torch')} from "
            f"PyPI with {len(nvidia)} nvidia-* CUDA packages)"
        )
        failed |= not ok

    failed |= onnx_route()
    return 1 if failed else 0


def onnx_route() -> bool:
    """Check 3; True when it failed."""
    with tempfile.TemporaryDirectory() as folder:
        python = Path(folder) / "venv" / "bin" / "python"
        subprocess.run([sys.executable, "-m", "venv", str(python.parents[1])], check=True)
        done = subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", "torch==2.13.0+cpu"],
            capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        if done.returncode != 0:
            print("onnx route: NOT CHECKED, torch 2.13.0+cpu cannot be installed from here")
            return False
        failed = False
        for args in ([f"{ROOT}[onnx]"], ["--no-deps", "onnx2torch==1.5.15"], ROBUSTBENCH):
            install, output = resolve(args, python=str(python))
            if install is None:
                print(f"route FAILED to resolve {' '.join(args)}:\n{output[-2000:]}")
                failed = True
                continue
            found = versions(install)
            cuda = sorted(n for n in found if n.startswith(("nvidia-", "cuda-", "triton")))
            ok = "torch" not in found and not cuda
            route = "robustbench route" if args is ROBUSTBENCH else "onnx route"
            print(
                f"{route} ({' '.join(args)}): {'ok' if ok else 'WRONG'} (keeps torch "
                f"2.13.0+cpu: would install {', '.join(sorted(found)) or 'nothing new'})"
            )
            failed |= not ok
        return failed


if __name__ == "__main__":
    sys.exit(main())
