#!/usr/bin/env bash
# Sensitivity and plan of quantized engines on a GPU machine, timed, and the planned variants
# exported: the figures of docs/results/precision.md.
#   bash scripts/precision_gpu.sh OUT_DIR ENGINE[:PLANNED_NAME] ...
# e.g. bash scripts/precision_gpu.sh out vit_nvfp4 vit_mxfp8 modernbert_nvfp4:nvfp4_kept
# Each engine's plan keeps half of its fully quantized variant's error (cosine floor
# 1 - (1 - cos) / 2, four decimals; a third where that plan is not confirmed on the unseen
# batches), is added to pipeline.toml and exported. Writes
# OUT_DIR/ENGINE.sensitivity.json, .sensitivity.txt (the terminal's table), .plan.json, the
# planned export's manifest, and OUT_DIR/timings.txt.
# EVAL_DATA=scripts/gpu_eval_data.py measures on that file's data hook MODEL_batches (--eval-data)
# instead of seeded inputs; NO_EXPORT=1 leaves the planned variant unexported.
set -uo pipefail
out="${1:?usage: precision_gpu.sh OUT_DIR ENGINE[:NAME] ...}"
shift
mkdir -p "$out"
cd "$(dirname "$0")/.."
pipeline() { python3 -m pipeline.cli "$@"; }
status=0
{ nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader 2>/dev/null || echo "no GPU"; nproc; } > "$out/machine.txt"
for item in "$@"; do
  engine="${item%%:*}"
  name="${item#*:}"
  [ "$name" = "$item" ] && name=""
  model_of="${engine%_*}"
  data=()
  [ -n "${EVAL_DATA:-}" ] && data=(--eval-data "$EVAL_DATA:${model_of}_batches")
  start=$(date +%s.%N)
  COLUMNS=110 pipeline sensitivity --engine "$engine" "${data[@]}" --format json --out "$out/$engine.sensitivity.json" || status=1
  analysed=$(date +%s.%N)
  COLUMNS=110 pipeline sensitivity --engine "$engine" "${data[@]}" > "$out/$engine.sensitivity.txt" 2>/dev/null || status=1
  before_plan=$(date +%s.%N)
  for share in 2 3; do
    floor=$(python3 -c "import json,math,sys; c=json.load(open(sys.argv[1]))['fully_quantized']['cosine']; print(math.floor((1-(1-c)/int(sys.argv[2]))*1e4)/1e4)" "$out/$engine.sensitivity.json" "$share") || break
    pipeline plan --engine "$engine" "${data[@]}" --floor "cos=$floor" ${name:+--name "$name"} --format json --out "$out/$engine.plan.json" --apply && break
  done
  planned=$(date +%s.%N)
  variant=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['variant']['name'])" "$out/$engine.plan.json") || { status=1; continue; }
  model=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['engine'].removesuffix('_' + sys.argv[2]))" "$out/$engine.sensitivity.json" "$(echo "$engine" | sed 's/.*_\(int8\|fp8\|mxfp8\|nvfp4\)$/\1/')")
  if [ -z "${NO_EXPORT:-}" ]; then
    pipeline export --engine "${model}_${variant}" && cp "manifests/export/${model}_${variant}.json" "$out/" || status=1
  fi
  exported=$(date +%s.%N)
  python3 -c "import sys; a,b,c,d,e=map(float,sys.argv[2:]); print(f'{sys.argv[1]}: sensitivity {b-a:.1f} s, plan {d-c:.1f} s, export of the plan {e-d:.1f} s')" \
    "$engine" "$start" "$analysed" "$before_plan" "$planned" "$exported" | tee -a "$out/timings.txt"
done
exit $status
