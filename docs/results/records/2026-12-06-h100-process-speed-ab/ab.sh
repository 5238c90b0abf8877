#!/usr/bin/env bash
# The product at 313535c (.whl/old) against the working tree, run in turn on one machine start:
# ModernBERT bf16 at 2x512 on torch-eager (launch-bound) and torch-cudagraphs (GPU-bound), each
# version in a workspace of its own; a cold run each, then three --force runs each, interleaved.
set -u
out="$1"; root="$PWD"
mk() {
  d=/tmp/ab/$1; rm -rf "$d"; mkdir -p "$d"
  sed 's/^shapes = \["2x512", "4x512", "2x2048", "4x2048", "2x4096", "4x4096"\]/shapes = ["2x512"]/' "$root/pipeline.toml" > "$d/pipeline.toml"
  grep -q '^shapes = \["2x512"\]' "$d/pipeline.toml" || { echo "shapes not changed"; exit 1; }
}
mk new; mk old
export CUDA_VISIBLE_DEVICES=0 PYTHONUNBUFFERED=1
one() {
  local which=$1 take=$2; shift 2
  local code="$root"; [ "$which" = old ] && code="$root/.whl/old"
  local s; s=$(date +%s.%N)
  (cd "$code" && PYTHONPATH="/tmp/site:$code" python3 -m pipeline.cli --catalog "/tmp/ab/$which/pipeline.toml" run --model modernbert --variant bf16 --toolchain torch-eager --toolchain torch-cudagraphs "$@" > "$out/$which-$take.log" 2>&1)
  local e; e=$(python3 -c "print(round($(date +%s.%N) - $s, 1))")
  (cd "$code" && PYTHONPATH="/tmp/site:$code" python3 -m pipeline.cli --catalog "/tmp/ab/$which/pipeline.toml" compare --model modernbert --format json > "$out/$which-$take.json" 2>/dev/null)
  python3 - "$out/$which-$take.json" "$which" "$take" "$e" <<'PY' | tee -a "$out/summary.txt"
import json, sys
rows = {r["toolchain"]: r for r in json.load(open(sys.argv[1]))["rows"] if r["variant"] == "bf16"}
print(sys.argv[2], sys.argv[3], f"{sys.argv[4]} s", "eager", rows.get("torch-eager", {}).get("median_ms"), "cudagraphs", rows.get("torch-cudagraphs", {}).get("median_ms"))
PY
}
one new 0; one old 0
for i in 1 2 3; do one new "$i" --force; one old "$i" --force; done
