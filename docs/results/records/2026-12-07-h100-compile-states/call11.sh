#!/usr/bin/env bash
# Whether Python's garbage collector slows the compiled engine's takes in a run's process: whole runs
# of 40 rounds with takes.py's GC probe (.whl/gc_probe.py) logging (L) and with GC off during each
# take (V: GC_OFF=1), LVLV; then fresh processes (check_process_state compile-product) with the probe.
set -u
[ -f /tmp/site/.done ] || { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && touch /tmp/site/.done; } || exit 1
export PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0
mkdir -p $OUT/r; root=$PWD; s=$SECONDS
{ echo "product at $(cat .whl/HEAD) with .whl/gc_probe.py appended to takes.py"; date; nvidia-smi -L; nproc; } > $OUT/r/tree.txt 2>&1
rm -rf /tmp/probe && cp -r "$root" /tmp/probe && cat .whl/gc_probe.py >> /tmp/probe/pipeline/measuring/takes.py
ws() { rm -rf $1; mkdir -p $1; sed -e 's/^shapes = \["2x512", "4x512", "2x2048", "4x2048", "2x4096", "4x4096"\]/shapes = ["2x512"]/' -e "s/^min_rounds = 6/min_rounds = 40/" "$root/pipeline.toml" > $1/pipeline.toml; grep -q '^shapes = \["2x512"\]' $1/pipeline.toml; }
takes() {
  python3 - "$2" "$1" <<'PY' | tee -a $OUT/r/summary.txt
import json, sys, statistics
m = json.load(open(f"{sys.argv[1]}/manifests/torch-compile/modernbert_bf16@2x512.json"))
d = m["profile"]["details"]; r = d["rounds"][0]; t = r["takes"]
med = [x["median_ms"] for x in t]; iss = [x["issue_ms"] for x in t]
print(f"{sys.argv[2]}: median {statistics.median(med):.3f} ms over {len(t)} takes in {r['elapsed_s']} s; issue median {statistics.median(iss):.2f} ms")
print("  takes", " ".join(f"{v:.2f}" for v in med))
PY
}
ws /tmp/wl; ws /tmp/wv
run() { rm -f /tmp/gcinfo-*; (cd /tmp/probe && PYTHONPATH=/tmp/site:/tmp/probe GC_OFF=$2 timeout 150 python3 -m pipeline.cli --catalog $3/pipeline.toml run --model modernbert --variant bf16 --toolchain torch-compile $4 > $OUT/r/$1.log 2>&1); echo "$1 rc $? at $((SECONDS - s)) s" >> $OUT/r/summary.txt; takes $1 $3; for f in /tmp/gcinfo-*; do echo "  $(basename $f): $(cat $f)"; done | tee -a $OUT/r/summary.txt; }
run L1 0 /tmp/wl ""
run V1 1 /tmp/wv ""
run L2 0 /tmp/wl --force
run V2 1 /tmp/wv --force
rm -f /tmp/gcinfo-*
(cd /tmp/probe && PYTHONPATH=/tmp/site:/tmp/probe timeout ${STATES_S:-150} python3 scripts/check_process_state.py --shape 2x512 --rounds 10 --take-ms 100 --states compile-product compile-product#2 compile-hand --out $OUT/r/process-state > $OUT/r/process-state.log 2>&1)
echo "process states rc $? at $((SECONDS - s)) s" >> $OUT/r/summary.txt; grep -v Warn $OUT/r/process-state.log | tail -4 >> $OUT/r/summary.txt
for f in /tmp/gcinfo-*; do echo "  $(basename $f): $(cat $f)"; done >> $OUT/r/summary.txt
cat $OUT/r/summary.txt
