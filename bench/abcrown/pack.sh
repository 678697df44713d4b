#!/usr/bin/env bash
# Pack alpha-beta-CROWN's source for a machine without the network: its complete_verifier
# folder (without the bundled models and datasets, which these runs do not read) with
# auto_LiRPA's package copied in where the repository has a symlink, as
# WHEELS/abcrown-8250d5f-src.tar.gz; bench/verification_sweep.sh unpacks it.
#
#     bash bench/abcrown/pack.sh [CHECKOUT] [WHEELS]
# CHECKOUT: alpha-beta-CROWN at 8250d5f with its auto_LiRPA submodule at 9d100ec
# (default $ABCROWN_DIR or /work/abcrown-8250d5f); WHEELS: default .whl.
set -euo pipefail
src=${1:-${ABCROWN_DIR:-/work/abcrown-8250d5f}}
wheels=${2:-.whl}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/abcrown" "$wheels"
cp -r "$src/complete_verifier" "$tmp/abcrown/"
rm -rf "$tmp/abcrown/complete_verifier/"{models,datasets,auto_LiRPA}
cp -r "$src/auto_LiRPA/auto_LiRPA" "$tmp/abcrown/complete_verifier/auto_LiRPA"
find "$tmp/abcrown" -name __pycache__ -prune -exec rm -rf {} +
tar -czf "$wheels/abcrown-8250d5f-src.tar.gz" -C "$tmp" abcrown
ls -l "$wheels/abcrown-8250d5f-src.tar.gz"
