#!/usr/bin/env bash
# The sweep's edges on a GPU machine, from an empty workspace each (docs/sweeps.md, "At the edges"):
#   1. the `gpu` tests of tests/stages/test_edges_gpu.py: a user's module out of GPU memory for real
#      at one of two points, and a device-side assert at one of two points;
#   2. ModernBERT-base (bf16) at 4×1024 and 48×8192 on torch-eager and torch-eager-attn: eager
#      attention runs out at 48×8192 where SDPA fits, and the FP32 reference there is made a few
#      samples at a time.
#   bash scripts/check_edges_gpu.sh OUT_DIR
# Writes OUT_DIR/{gpu.txt,edges-tests.log,modernbert.log,modernbert-compare.txt,modernbert.json}.
set -uo pipefail
out="${1:?usage: check_edges_gpu.sh OUT_DIR}"
mkdir -p "$out"
cd "$(dirname "$0")/.."
PIPELINE="${PIPELINE:-python3 -m pipeline}"
nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv | tee "$out/gpu.txt"
python3 -m pytest -m gpu -v -s -p no:cacheprovider tests/stages/test_edges_gpu.py > "$out/edges-tests.log" 2>&1
tests=$?
tail -5 "$out/edges-tests.log"
ws="$(mktemp -d)"
sed -e 's/^shapes = \["2x512", "4x512", "2x2048", "4x2048", "2x4096", "4x4096"\]/shapes = ["4x1024", "48x8192"]/' pipeline.toml > "$ws/pipeline.toml"
grep -q '"48x8192"' "$ws/pipeline.toml" || { echo "the catalog's modernbert shapes were not found"; exit 2; }
started=$(date +%s)
$PIPELINE --catalog "$ws/pipeline.toml" run --model modernbert --variant bf16 --toolchain torch-eager --toolchain torch-eager-attn > "$out/modernbert.log" 2>&1
modernbert=$?
echo "modernbert: exit $modernbert in $(( $(date +%s) - started )) s" | tee -a "$out/modernbert.log"
tail -25 "$out/modernbert.log"
$PIPELINE --catalog "$ws/pipeline.toml" compare --model modernbert > "$out/modernbert-compare.txt" 2>&1
$PIPELINE --catalog "$ws/pipeline.toml" compare --model modernbert --format json > "$out/modernbert.json" 2>/dev/null
python3 - "$ws" <<'PY'
import json, sys
from pathlib import Path
ws = Path(sys.argv[1])
export = json.loads((ws / "manifests/export/modernbert_bf16.json").read_text())["export"]
print("export:", export["status"], "in parts:", export["details"]["references_in_parts"], "oom:", list(export["details"]["references_out_of_memory"]))
for path in sorted((ws / "manifests").glob("torch-*/*@*.json")):
    record = json.loads(path.read_text())["profile"]
    details = record.get("details") or {}
    print(f"{path.parent.name}/{path.name}: {record['status']}", (details.get("latency_ms") or {}).get("median"), record.get("out_of_memory"))
PY

# What held before the edges were handled must still hold, each from an empty workspace:
#   a fullgraph compile refused with its reason while the other toolchain is measured; another
#   process busy on the GPU flagged in the rows; SIGTERM in the middle of a point's rounds exits 143
#   with nothing half-written, and the next run resumes.
held() {  # held NAME MODULE SHAPES TOOLCHAINS… : a workspace with that module
  local dir="$ws/$1"; mkdir -p "$dir/models-in"; cp "tests/data/python_models/$2" "$dir/models-in/"
  { sed -n '/^\[profile\]/,/^$/p' pipeline.toml | sed -e "s/^min_rounds = .*/min_rounds = ${MIN_ROUNDS:-6}/" -e "s/^budget_s = .*/budget_s = ${BUDGET_S:-30}/"
    printf '[defaults]\nmodels = ["m"]\nvariants = ["fp32"]\ntoolchain = "torch-eager"\n\n[models.m]\npython = "models-in/%s:make"\nshapes = %s\n\n' "$2" "$3"
    printf '[variants.fp32]\nprecision = "fp32"\n\n[toolchains.torch-eager]\nkind = "torch"\nbackend = "eager"\n\n'
    printf '[toolchains.torch-cudagraphs]\nkind = "torch"\nbackend = "cudagraphs"\n\n'
    printf '[toolchains.torch-fullgraph]\nkind = "torch"\nbackend = "compile"\nfullgraph = true\n'; } > "$dir/pipeline.toml"
  echo "$dir/pipeline.toml"
}
catalog=$(held fullgraph graph_break.py '["2x512"]')
$PIPELINE --catalog "$catalog" run --model m --toolchain torch-eager --toolchain torch-fullgraph > "$out/held.log" 2>&1
echo "fullgraph: exit $? (1 expected)" | tee -a "$out/held.log"; grep -E "^ERROR|refused" "$out/held.log" | head -4
catalog=$(held busy self_attention_scores.py '["1x4096"]')
python3 -c "
import time, torch
a = torch.randn(8192, 8192, device='cuda')
end = time.time() + 60
while time.time() < end:
    a = (a @ a).clamp_(-1, 1)
    torch.cuda.synchronize()" &
busy=$!
sleep 8
$PIPELINE --catalog "$catalog" run --model m --toolchain torch-eager --toolchain torch-cudagraphs >> "$out/held.log" 2>&1
echo "busy GPU: exit $?" | tee -a "$out/held.log"; kill $busy 2>/dev/null; wait $busy 2>/dev/null
$PIPELINE --catalog "$catalog" compare 2>&1 | grep -E "busy|gpu" | head -4
catalog=$(MIN_ROUNDS=2000 BUDGET_S=600 held term self_attention_scores.py '["1x2048", "2x2048"]')
timeout --preserve-status -s TERM 45 $PIPELINE --catalog "$catalog" run --model m --toolchain torch-eager --toolchain torch-cudagraphs >> "$out/held.log" 2>&1
echo "SIGTERM: exit $? (143 expected); temporary files left: $(find "$(dirname "$catalog")" -name '*.tmp' | wc -l)" | tee -a "$out/held.log"
sed -i -e 's/^min_rounds = .*/min_rounds = 6/' -e 's/^budget_s = .*/budget_s = 30/' "$catalog"
$PIPELINE --catalog "$catalog" run --model m --toolchain torch-eager --toolchain torch-cudagraphs >> "$out/held.log" 2>&1
echo "resumed: exit $?" | tee -a "$out/held.log"
echo "edges tests exit $tests, modernbert exit $modernbert"
exit $(( tests || modernbert ))
