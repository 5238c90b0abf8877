#!/usr/bin/env bash
# A whole `pipeline run` against a fresh by-hand process (scripts/serve_by_hand.py), in turn on one
# machine start, ABBA (product, hand, hand, product, product, ...): eager ModernBERT bf16 at 2x512
# served by one and two threads for 2 s a count, padded as the product pads. Whether the run reads a
# launch-bound engine's throughput lower than a script beside it on the same start, with the
# host's speed spells spread over both sides (docs/streams.md, 'Not every gap is a spell').
# GPU only. Starts no pair once SECONDS (since it began) passes DEADLINE_S. TOOLCHAIN=torch-compile
# (or torch-cudagraphs) serves that toolchain and by hand's compiled model (or CUDA graph) instead.
#
#   bash scripts/check_run_against_hand.sh OUT [DEADLINE_S]
#
# Writes OUT/summary.txt (a line a run: the run's rounds median and, by threads and by processes,
# each count's inferences/s, median request and takes; by hand's inferences/s and median request), and each
# run's log, compare JSON and its toolchain's manifests, with what prepared and served it
# (product-N.log, product-N.json, product-N-manifests/), and by hand's (hand-N/).
set -u
mkdir -p "${1:?usage: check_run_against_hand.sh OUT [DEADLINE_S]}"
out="$(cd "$1" && pwd)"; deadline="${2:-200}"
cd "$(dirname "$0")/.." && root="$PWD"
d=/tmp/abh; rm -rf "$d"; mkdir -p "$d"
sed 's/^shapes = \["2x512", "4x512", "2x2048", "4x2048", "2x4096", "4x4096"\]/shapes = ["2x512"]/' "$root/pipeline.toml" > "$d/pipeline.toml"
grep -q '^shapes = \["2x512"\]' "$d/pipeline.toml" || { echo "shapes not changed"; exit 1; }
export CUDA_VISIBLE_DEVICES=0 PYTHONUNBUFFERED=1
toolchain="${TOOLCHAIN:-torch-eager}"
case "$toolchain" in
  torch-eager) kind=eager ;; torch-compile) kind=compiled ;; torch-cudagraphs) kind="cuda graph" ;;
  *) echo "TOOLCHAIN: torch-eager, torch-compile or torch-cudagraphs"; exit 2 ;;
esac
n=0
product() {
  local force=(); [ "$n" -gt 0 ] && force=(--force)
  local s=$SECONDS
  python3 -m pipeline.cli --catalog "$d/pipeline.toml" run --model modernbert --variant bf16 --toolchain "$toolchain" --streams 1,2 "${force[@]}" > "$out/product-$n.log" 2>&1
  python3 -m pipeline.cli --catalog "$d/pipeline.toml" compare --model modernbert --format json > "$out/product-$n.json" 2>/dev/null
  cp -r "$d/manifests/$toolchain" "$out/product-$n-manifests" 2>/dev/null  # what prepared and served it (execution facts)
  python3 - "$out/product-$n.json" "$n" "$((SECONDS - s))" "$toolchain" <<'PY' | tee -a "$out/summary.txt"
import json, sys
row = next(r for r in json.load(open(sys.argv[1]))["rows"] if r["toolchain"] == sys.argv[4] and r["variant"] == "bf16")
served = sorted((s["mode"], s["streams"], s) for s in row.get("streams", []))
print(f"product {sys.argv[2]} ({sys.argv[3]} s): rounds median {row['median_ms']:.2f} ms;",
      "; ".join(f"{n} {mode} {s.get('inferences_per_s') or 0:.1f} inf/s median {s.get('median_ms') or 0:.2f} ms takes {s.get('takes_inferences_per_s')}" for mode, n, s in served))
PY
  n=$((n + 1))
}
h=0
hand() {
  python3 scripts/serve_by_hand.py --shapes 2x512 --kinds "$kind" --streams 1 2 --seconds 2 --padding on --out "$out/hand-$h" > "$out/hand-$h.log" 2>&1
  python3 - "$out/hand-$h/serve-by-hand.json" "$h" <<'PY' | tee -a "$out/summary.txt"
import json, sys
print(f"hand {sys.argv[2]}:", "; ".join(f"{r['streams']} threads {r['inferences_per_s']:.1f} inf/s median {r['median_ms']:.2f} ms" for r in json.load(open(sys.argv[1]))))
PY
  h=$((h + 1))
}
product  # the first run exports and builds; its figures count like the others
for _ in 1 2 3; do
  [ "$SECONDS" -lt "$deadline" ] || break; hand; hand
  [ "$SECONDS" -lt "$deadline" ] || break; product; product
done
