#!/usr/bin/env bash
# One prepared run on a GPU machine (issue 32), at most 8 minutes: the CUDA tests (every
# capability family with device: cuda against the same plan on the CPU), PGD-40 at the WRN-28-10
# and ResNet-50 shapes against torchattacks and the card's floor per precision, and our
# `standard` against torchattacks' AutoAttack at equal budgets. Each step has a time limit of its
# own, so one slow step cannot eat the others' time. Logs go to $OUT (or /tmp/aisafety-gpu).
#
#     bash bench/gpu.sh            # on the GPU machine, from the repository root
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
TAIL=25 step 200 cuda-tests python3 -m pytest -q -p no:cacheprovider -m cuda tests/test_cuda.py \
    -s --durations=10
step 150 gpu-speed python3 bench/gpu_speed.py --rounds 2
step 90 autoattack python3 bench/autoattack.py --device cuda --images 1000 --steps 100 \
    --rounds 1
