#!/usr/bin/env bash
# What a deployment asks beyond the median, recorded on one GPU machine start (docs/streams.md,
# docs/energy.md, docs/tails.md): ModernBERT-base bf16 at 2x512 and 4x4096 with torch-eager,
# torch-cudagraphs and torch-compile, served at 1, 2 and 4 streams, energy read around each take;
# beside it, the independent readings it is checked against:
#   - NVML's energy counter and power sampled by a process of its own (scripts/sample_gpu_power.py)
#     and nvidia-smi's power.draw every 100 ms, over the whole run;
#   - the same engines served by hand (scripts/serve_by_hand.py: nothing of the product imported),
#     every count BY_HAND_REPEATS times (3) in turn, so that a spell of a slow host lands on one
#     repeat (docs/streams.md, "The host's spells"), its requests padded as the product's are
#     (BY_HAND_PADDING: `on` by default; `both` also serves each count unpadded, in turn).
#
#   bash scripts/record_serving.sh OUT
#   SHAPES=2x512 TOOLCHAINS=torch-cudagraphs BY_HAND_KINDS=cuda-graph bash scripts/record_serving.sh OUT  # a part of it
#
# Writes, flat in OUT: run.txt, run.log and compare.json (the product's run: scripts/check_gpus_speedup.sh
# `one`), p99-under.txt (its compare with --p99-under $P99_UNDER, 10ms by default), power.csv
# (epoch s, counter mJ, power mW), nvidia-smi.csv, serve-by-hand.json and
# serve-by-hand.txt, and agreement.txt (scripts/check_serving_agreement.py: each engine's
# inferences/s against the by-hand figure, and its energy per inference against the counter read
# by the sampler over the same takes).
set -uo pipefail
out="${1:?usage: record_serving.sh OUT}"
cd "$(dirname "$0")/.."
work="${SERVING_WORK:-/tmp/serving}"
mkdir -p "$out" "$work"
{
  nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
  echo "$(nproc) CPUs; $(git log -1 --format='%h %s' 2>/dev/null)"
} > "$out/run.txt"
python3 scripts/sample_gpu_power.py --out "$out/power.csv" --period-ms 20 &
sampler=$!
nvidia-smi --query-gpu=timestamp,power.draw --format=csv,noheader,nounits -lms 100 > "$out/nvidia-smi.csv" 2>/dev/null &
smi=$!
sleep 2
shapes="${SHAPES:-2x512 4x4096}"
# serve_by_hand.py's kind for each toolchain, spelt without its space (cuda-graph).
kinds="${BY_HAND_KINDS:-eager cuda-graph compiled}"
MODEL=modernbert SHAPES="$shapes" VARIANTS=bf16 TOOLCHAINS="${TOOLCHAINS:-torch-eager torch-cudagraphs torch-compile}" \
  RUN_ARGS="${RUN_ARGS:---streams 1,2,4 --energy}" bash scripts/check_gpus_speedup.sh one "$work" >> "$out/run.txt" 2>&1
status=$?
cp "$work/one/run.log" "$out/run.log"
cp "$work/one/compare.json" "$out/compare.json"
# The answer a deployment asks for: the engine and concurrency serving the most within a p99 budget.
python3 -m pipeline.cli --catalog "$work/one/ws/pipeline.toml" compare --model "${MODEL:-modernbert}" \
  --p99-under "${P99_UNDER:-10ms}" > "$out/p99-under.txt" 2>&1
by_hand_kinds=()
for kind in $kinds; do by_hand_kinds+=("${kind//-/ }"); done
python3 scripts/serve_by_hand.py --shapes $shapes --kinds "${by_hand_kinds[@]}" --streams 1 2 4 --seconds "${BY_HAND_SECONDS:-4}" --repeats "${BY_HAND_REPEATS:-3}" --padding "${BY_HAND_PADDING:-on}" --out "$out" > "$out/serve-by-hand.txt" 2>&1
sleep 1
kill "$sampler" "$smi" 2>/dev/null
wait "$sampler" 2>/dev/null
python3 scripts/check_serving_agreement.py --workspace "$work/one/ws" --by-hand "$out/serve-by-hand.json" \
  --power "$out/power.csv" --nvidia-smi "$out/nvidia-smi.csv" > "$out/agreement.txt" 2>&1
cat "$out/agreement.txt"
exit $status
