#!/usr/bin/env bash
# The seed matrix's record on one GPU machine start (docs/results/sweeps.md): the whole matrix
# (VARIANTS="bf16 fp16", the five PyTorch toolchains, six points) from an empty workspace and empty
# compiler caches, then the same command again in that workspace with --force and the caches kept;
# then how the two answers agree with each other and with the last recorded run.
#
#   bash scripts/record_seed_matrix.sh OUT [LAST_COMPARE_JSON]
#
# Writes, flat in OUT (the files a benchmark record keeps): cold.txt and warm.txt (each run's
# summary: wall clock, rows, where each point's time went), cold-run.log and warm-run.log (every
# line stamped with the seconds since the start), cold-compare.json and warm-compare.json, and
# cold-manifests.tgz and warm-manifests.tgz (each run's manifests folder), and
# agreement.txt (scripts/check_rerun_agreement.py: cold against warm, and cold against
# LAST_COMPARE_JSON, by default the newest cold-compare.json under docs/results/records/).
# The workspaces stay under ${SEED_WORK:-/tmp/seed}. Exits with the cold run's status.
# STACKS=1: the warm run's main thread sampled five times a second (scripts/sample_stacks.py),
# written to OUT/warm-stacks-PID.txt (one for the run, one for the compare after it).
set -uo pipefail
out="${1:?usage: record_seed_matrix.sh OUT [LAST_COMPARE_JSON]}"
cd "$(dirname "$0")/.."
last="${2:-$(ls -1 docs/results/records/*/cold-compare.json 2>/dev/null | sort | tail -1)}"
work="${SEED_WORK:-/tmp/seed}"
mkdir -p "$out" "$work"
{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
  echo "$(nproc) CPUs; $(git log -1 --format='%h %s' 2>/dev/null)"
} > "$out/cold.txt"
VARIANTS="bf16 fp16" bash scripts/check_gpus_speedup.sh one "$work" >> "$out/cold.txt" 2>&1
cold=$?
cp "$work/one/run.log" "$out/cold-run.log"
cp "$work/one/compare.json" "$out/cold-compare.json"
# Each run's manifests (the warm run writes over the cold one's, in the same workspace): where each
# compiled point's time went in its process (compiled_ahead), each profile's preparing and checking.
tar czf "$out/cold-manifests.tgz" -C "$work/one/ws" manifests
sampled=()
[ "${STACKS:-0}" = 1 ] && sampled=(PIPELINE="python3 scripts/sample_stacks.py $out/warm-stacks-{pid}.txt 0.2 pipeline.cli")
env "${sampled[@]}" VARIANTS="bf16 fp16" bash scripts/check_gpus_speedup.sh again "$work" > "$out/warm.txt" 2>&1
cp "$work/again/run.log" "$out/warm-run.log"
cp "$work/again/compare.json" "$out/warm-compare.json"
tar czf "$out/warm-manifests.tgz" -C "$work/one/ws" manifests
{
  echo "== cold against warm (--force, caches kept)"
  python3 scripts/check_rerun_agreement.py "$out/cold-compare.json" "$out/warm-compare.json"
  if [ -n "$last" ]; then
    echo "== cold against the last record, $last"
    python3 scripts/check_rerun_agreement.py "$last" "$out/cold-compare.json"
  fi
} > "$out/agreement.txt" 2>&1
echo "cold $(cat "$work/one/seconds.txt") s, warm $(cat "$work/again/seconds.txt") s"
exit $cold
