#!/usr/bin/env bash
# The whole complete-verification sweep (#33), in parallel: ours (`complete`) and
# alpha-beta-CROWN's CPU branch and bound on every VNN-COMP 2021 set of ../shared/data
# (mnistfc 256x4 and 256x6 first, then 256x2, eran, the CIFAR ResNets and Marabou nets),
# one instance per process, one thread each, per-instance CPU-time limits (60 s; CIFAR
# 300 s), results as JSON lines in $out/results.jsonl, then bench/sweep_report.py (settled
# per net and tool, and the contradiction check).
#
#     bash bench/verification_sweep.sh [--smoke] [--jobs 16] [--budget 480] [--wheels .whl]
#                                      [--out /tmp/verification-sweep] [--attack]
#                                      [--plan 'SUITE LIMIT PER_NET NETS...' ...]
#                                      [--only-missing ROWS.jsonl] [--tools 'complete abcrown']
#
# From the repository root, with the project importable and a wheel folder holding
# abcrown-8250d5f-src.tar.gz (bench/abcrown/pack.sh) and the wheels of
# bench/abcrown/requirements.txt (installed into a venv beside the system's packages when
# they are not importable already). No job starts once fewer than its limit x 1.2 seconds
# of --budget are left, so the sweep ends near --budget; what did not start is listed.
# --smoke: 2 mnistfc, 1 eran and 1 resnet instance at 10 s (< 1 minute on 2 cores).
# --plan (repeatable): only these listings, in this order, in place of the whole sweep
# (e.g. --plan 'cifar 300 3 resnet_2b'); --only-missing: drop the jobs whose tool, net and
# property already have a row in that file (a sweep that picks up where another stopped).
# --tools: the tools run on every listed instance, in this order (default 'complete abcrown';
# any `bench/verification.py --verifiers` name, e.g. complete/milp for the forced MILP engine);
# it applies to the --plan options after it (--tools 'complete complete/milp' --plan 'cifar
# ...' --tools 'complete abcrown' --plan 'eran ...': one pool of jobs, two sets of tools).
# $ABCROWN_PY: a Python that already imports alpha-beta-CROWN's needs (no venv is built).
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --job ]; then  # one job: --job TOOL SUITE NET PROPERTY LIMIT
    tool=$2 suite=$3 net=$4 prop=$5 limit=$6
    left=$(( $(cat "$SWEEP_OUT/deadline") - $(date +%s) ))
    if [ "$left" -lt $(( limit * 12 / 10 )) ]; then
        echo "$tool $suite $net $prop $limit" >> "$SWEEP_OUT/not-started.txt"; exit 0
    fi
    file=${tool//\//_}-$net-$prop  # complete/milp: no folder in a file name
    row="$SWEEP_OUT/rows/$file.jsonl" log="$SWEEP_OUT/logs/$file.log"
    if [ "$tool" = abcrown ]; then
        "$SWEEP_PY" bench/abcrown/run.py --suite "$suite" --nets "$net" --only "$prop" \
            --timeout "$limit" --abcrown "$SWEEP_ABCROWN" --out "$row" > "$log" 2>&1
    else
        ( ulimit -t $(( limit * 2 + 60 ))  # a CPU-time backstop; the limit is the verifier's
          exec python3 bench/verification.py --part complete --suite "$suite" --nets "$net" \
            --only "$prop" --threads 1 --clock cpu --timeout "$limit" --verifiers "$tool" \
            --out "$row" ) > "$log" 2>&1
    fi
    rc=$?
    [ -s "$row" ] || printf '{"suite": "%s", "net": "%s", "property": "%s", "tool": "%s", "status": "error", "cpu_s": 0, "exit": %d}\n' \
        "$suite" "$net" "$prop" "$tool" "$rc" > "$row"
    echo "$(date +%T) $tool $net $prop: $(grep -o '"status": "[a-z]*"' "$row" 2>/dev/null | tail -n 1)"
    exit 0
fi
jobs=16 budget=480 wheels=.whl out=${OUT:-/tmp/verification-sweep} smoke=0 attack=""
plans=() done_rows="" tools="complete abcrown"
while [ $# -gt 0 ]; do
    case $1 in
        --smoke) smoke=1 ;;
        --attack) attack=--attack ;;
        --jobs) jobs=$2; shift ;;
        --budget) budget=$2; shift ;;
        --wheels) wheels=$2; shift ;;
        --out) out=$2; shift ;;
        --plan) plans+=("$tools|$2"); shift ;;
        --only-missing) done_rows=$(realpath "$2"); shift ;;
        --tools) tools=$2; shift ;;
        *) echo "verification_sweep.sh: unknown option $1 (see the header)"; exit 2 ;;
    esac
    shift
done
rm -rf "$out"; mkdir -p "$out/rows" "$out/logs"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONUNBUFFERED=1
export SWEEP_OUT=$out SWEEP_ABCROWN=${ABCROWN_DIR:-$out/abcrown} SWEEP_PY=${ABCROWN_PY:-python3}
echo "$(lscpu | grep 'Model name' | sed 's/  */ /g'); $(OMP_NUM_THREADS= nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "commit $(git rev-parse --short HEAD 2>/dev/null); $jobs jobs; budget $budget s"
if [ -z "${ABCROWN_DIR:-}" ]; then
    tar -xzf "$wheels/abcrown-8250d5f-src.tar.gz" -C "$out" || { echo "no $wheels/abcrown-8250d5f-src.tar.gz (bench/abcrown/pack.sh)"; exit 2; }
fi
needs=$(grep -v '^#' bench/abcrown/requirements.txt | tr '\n' ' ')
if [ -z "${ABCROWN_PY:-}" ] && ! python3 -c "import onnxoptimizer, skl2onnx, sklearn, appdirs, psutil, pandas, dateutil, graphviz, sortedcontainers" 2>/dev/null; then
    python3 -m venv --system-site-packages "$out/venv"
    "$out/venv/bin/pip" install -q --no-index --find-links "$wheels" --no-deps $needs || exit 2
    SWEEP_PY=$out/venv/bin/python
fi
list() {  # list SUITE LIMIT PER_NET NETS...: one line per instance and tool
    local suite=$1 limit=$2 per=$3; shift 3
    python3 bench/abcrown/run.py --suite "$suite" --nets "$@" --per-net "$per" --list |
        while read -r net prop; do
            [ -n "$prop" ] || continue  # a suite whose data is absent lists nothing
            for tool in $tools; do echo "$tool $suite $net $prop $limit"; done
        done
}
missing() {  # the job lines of stdin whose tool, net and property have no row in $done_rows
    if [ -z "$done_rows" ]; then cat; return; fi
    python3 -c 'import json, sys
done = {(r["tool"], r["net"], r["property"]) 
        for r in map(json.loads, filter(str.strip, open(sys.argv[1])))}
for line in sys.stdin:
    tool, _, net, prop, _ = line.split()
    if (tool, net, prop) not in done:
        print(line, end="")' "$done_rows"
}
{
    if [ ${#plans[@]} -gt 0 ]; then
        for plan in "${plans[@]}"; do  # TOOLS|SUITE LIMIT PER NETS...
            tools=${plan%%|*} list ${plan#*|}  # word-split
        done
    elif [ "$smoke" = 1 ]; then
        list mnistfc 10 2 256x2; list eran 10 1 relu; list cifar 10 1 resnet_2b
    else
        list mnistfc 60 0 256x4 256x6; list mnistfc 60 0 256x2; list eran 60 0 mnist
        list cifar 300 0 resnet cifar10_
    fi
} | missing > "$out/jobs.txt"
echo $(( $(date +%s) + budget )) > "$out/deadline"
echo "$(wc -l < "$out/jobs.txt") jobs (tool suite net property limit) in $out/jobs.txt"
xargs -P "$jobs" -L 1 bash bench/verification_sweep.sh --job < "$out/jobs.txt"
cat "$out"/rows/*.jsonl > "$out/results.jsonl" 2>/dev/null
[ -s "$out/not-started.txt" ] && echo "not started (budget): $(wc -l < "$out/not-started.txt") jobs"
echo "load at end $(cut -d' ' -f1-3 /proc/loadavg)"
cd bench && python3 sweep_report.py "$out/results.jsonl" $attack
