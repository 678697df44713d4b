#!/usr/bin/env bash
# tests/test_robustbench.py on the real robustbench package (source: robustbench).
# RobustBench 1.1.1 imports torchvision and timm at package import. PyPI has no torchvision
# for torch 2.13.0+cpu (its build links the CUDA torch: "operator torchvision::nms does not
# exist"), so the platform's own environment cannot import robustbench and those tests skip
# there. Here they run in a throw-away venv on torch 2.14.1 + torchvision 0.29.1 (the pair
# pip finds on this machine's disk), which sees the project's other packages
# (--system-site-packages); AISAFETY_REQUIRE_ROBUSTBENCH makes a failed import an error.
set -euo pipefail
cd "$(dirname "$0")/.."
folder=$(mktemp -d)
trap 'rm -rf "$folder"' EXIT
python3 -m venv --system-site-packages "$folder/venv"
pip="$folder/venv/bin/python -m pip"
if ! $pip install -q torch==2.14.1 torchvision==0.29.1 >"$folder/torch.log" 2>&1; then
    echo "robustbench tests: NOT RUN, torch 2.14.1 + torchvision 0.29.1 cannot be installed here:"
    tail -5 "$folder/torch.log"
    exit 0
fi
# robustbench's dependencies without theirs (which would move torch on); setuptools<81 for
# the pkg_resources that robustbench.loaders imports
$pip install -q --no-deps robustbench==1.1.1 timm==1.0.9 huggingface_hub safetensors pandas \
    python-dateutil tzdata geotorch torchdiffeq gdown beautifulsoup4 soupsieve pyautoattack==0.2.0 \
    "setuptools<81"
# RobustBench 1.1.1 imports `autoattack`; its declared dependency pyautoattack 0.2.0 ships
# that package (AutoAttack, state.EvaluationState) under the name `pyautoattack`
site=$("$folder/venv/bin/python" -c \
    'import pathlib, pyautoattack; print(pathlib.Path(pyautoattack.__file__).parents[1])')
ln -s pyautoattack "$site/autoattack"
AISAFETY_REQUIRE_ROBUSTBENCH=1 PYTHONPATH="$PWD" "$folder/venv/bin/python" -m pytest -q \
    -p no:cacheprovider -W ignore::DeprecationWarning -W ignore::UserWarning \
    tests/test_robustbench.py
