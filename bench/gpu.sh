#!/usr/bin/env bash
# One prepared run on a GPU machine (issue 32), at most 10 minutes: the CUDA tests (every
# capability family with device: cuda against the same plan on the CPU, and the memory budget
# on the card) and our `standard` against torchattacks' AutoAttack at equal budgets; with
# --speed also PGD-40 at the WRN-28-10 and ResNet-50 shapes against torchattacks and the card's
# floor per precision. Each step has a time limit of its own, so one slow step cannot eat the
# others' time. Logs go to $OUT (or /tmp/aisafety-gpu).
#
#     bash bench/gpu.sh            # on the GPU machine, from the repository root
#     bash bench/gpu.sh --tests    # the CUDA tests only (7 minutes at most)
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
# The CUDA tests first (what changed since the last card must still match the CPU, and the
# memory budget must hold on the card), the verifiers' comparison next (the longest: 163 s
# alone on an H200's host, 2026-11-27; it bounds on the host, so nothing else runs beside it),
# then `standard` against AutoAttack on the quiet host. With --tests, the tests only. PGD-40
# against the floor (`bench/gpu_speed.py`) only with --speed: its code is unchanged since the
# last card's rows (docs/gpu.md). Needs: torchattacks, and `aisafety.data` importable (an
# install, or `ln -s ../database aisafety/data` in a copy).
TAIL=40 step 120 cuda-tests python3 -m pytest -q -p no:cacheprovider -m cuda tests/test_cuda.py \
    -k "not verifiers" -s --durations=10
TAIL=25 step 300 cuda-verifiers python3 -m pytest -q -p no:cacheprovider -m cuda \
    tests/test_cuda.py -k verifiers -s --durations=5
[ "$smoke" = --tests ] && exit 0
step 95 autoattack python3 bench/autoattack.py --device cuda --images 1000 --steps 100 \
    --rounds 1
if [ "$smoke" = --speed ]; then
    step 150 gpu-speed python3 bench/gpu_speed.py --rounds 2
fi
