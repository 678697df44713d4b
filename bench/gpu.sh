#!/usr/bin/env bash
# One prepared run on a GPU machine (issue 32), at most 10 minutes: the CUDA tests (every
# capability family with device: cuda against the same plan on the CPU) and our `standard`
# against torchattacks' AutoAttack at equal budgets (with APGD's buckets on and off); with
# --speed also PGD-40 at the WRN-28-10 and ResNet-50 shapes against torchattacks and the card's
# floor per precision. Each step has a time limit of its own, so one slow step cannot eat the
# others' time. Logs go to $OUT (or /tmp/aisafety-gpu).
#
#     bash bench/gpu.sh            # on the GPU machine, from the repository root
#     bash bench/gpu.sh --speed    # the same, then PGD-40's speed (2.5 minutes more)
#     bash bench/gpu.sh --smoke    # tiny sizes, any machine: checks the script itself
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/aisafety-gpu}
mkdir -p "$out"
smoke=${1:-}
export PYTHONUNBUFFERED=1
step() {  # step SECONDS NAME COMMAND...: run with a limit, log to $out/NAME.log, say how it ended
    local limit=$1 name=$2; shift 2
    echo "== $name (limit ${limit}s): $*"
    local started=$SECONDS
    timeout --kill-after=10 "$limit" "$@" >"$out/$name.log" 2>&1
    local rc=$?
    tail -n "${TAIL:-40}" "$out/$name.log"
    echo "== $name: exit $rc after $((SECONDS - started)) s"
}
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv 2>/dev/null || true
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'device', torch.cuda.get_device_name() if torch.cuda.is_available() else 'none')"
if [ "$smoke" = --smoke ]; then
    step 600 cuda-tests env AISAFETY_TEST_DEVICE=cpu python3 -m pytest -q -x -p no:cacheprovider \
        -m cuda tests/test_cuda.py -k report
    step 900 gpu-speed python3 bench/gpu_speed.py --smoke --nets resnet-50
    step 600 autoattack python3 bench/autoattack.py --images 20 --rounds 1 --steps 2 --queries 20
    exit 0
fi
# `standard` against AutoAttack first, while the host is quiet (a small model is launch-bound,
# so host load moves its time), then the same with APGD's buckets off (the A/B on one card),
# then the CUDA tests, the verifiers' comparison last (the longest: 163 s alone on an H200's
# host, 2026-11-27). PGD-40 against the floor (`bench/gpu_speed.py`) only with --speed: its
# code is unchanged since the last card's rows (docs/gpu.md). Needs: torchattacks, and
# `aisafety.data` importable (an install, or `ln -s ../database aisafety/data` in a copy).
step 95 autoattack python3 bench/autoattack.py --device cuda --images 1000 --steps 100 \
    --rounds 1
step 95 autoattack-buckets-off python3 bench/autoattack.py --device cuda --images 1000 \
    --steps 100 --rounds 1 --apgd-buckets off
TAIL=25 step 90 cuda-tests python3 -m pytest -q -p no:cacheprovider -m cuda tests/test_cuda.py \
    -k "not verifiers" -s --durations=10
TAIL=25 step 300 cuda-verifiers python3 -m pytest -q -p no:cacheprovider -m cuda \
    tests/test_cuda.py -k verifiers -s --durations=5
if [ "$smoke" = --speed ]; then
    step 150 gpu-speed python3 bench/gpu_speed.py --rounds 2
fi
