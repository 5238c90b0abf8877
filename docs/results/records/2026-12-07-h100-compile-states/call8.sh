#!/usr/bin/env bash
# Where the compiled engine's rounds read slow (its rounds 5.1-6.1 ms in the run, its requests 3.7 ms,
# 3.7 ms by the same take in a fresh process): (1) the compiled states with the SM clock's sampler
# or the machine watch, take for take; (2) whole runs of 40 rounds, as they are (A) and with no SM
# clock read during a take (B: sm_clock.CLOCK_INTERVAL_S 10 s, a copy of the tree), ABAB.
set -u
[ -f /tmp/site/.done ] || { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && touch /tmp/site/.done; } || exit 1
export PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0
mkdir -p $OUT/r; root=$PWD; s=$SECONDS
{ echo "product at $(cat .whl/HEAD)"; date; nvidia-smi -L; nproc; } > $OUT/r/tree.txt 2>&1
PYTHONPATH=/tmp/site:$root timeout ${STATES_S:-200} python3 scripts/check_process_state.py --shape 2x512 --rounds 10 --take-ms 100 --states compile-product compile-sampled compile-watched compile-hand --out $OUT/r/process-state > $OUT/r/process-state.log 2>&1
echo "process states: $((SECONDS - s)) s rc $?" >> $OUT/r/summary.txt; tail -7 $OUT/r/process-state.log >> $OUT/r/summary.txt
rm -rf /tmp/variant && cp -r "$root" /tmp/variant && sed -i 's/^CLOCK_INTERVAL_S = 0.02$/CLOCK_INTERVAL_S = 10.0/' /tmp/variant/pipeline/measuring/sm_clock.py
grep -q '^CLOCK_INTERVAL_S = 10.0' /tmp/variant/pipeline/measuring/sm_clock.py || { echo "variant not made"; exit 1; }
ws() { rm -rf $1; mkdir -p $1; sed -e 's/^shapes = \["2x512", "4x512", "2x2048", "4x2048", "2x4096", "4x4096"\]/shapes = ["2x512"]/' -e "s/^min_rounds = 6/min_rounds = 40/" "$root/pipeline.toml" > $1/pipeline.toml; grep -q '^shapes = \["2x512"\]' $1/pipeline.toml; }
takes() {
  python3 - "$2" "$1" <<'PY' | tee -a $OUT/r/summary.txt
import json, sys, statistics
m = json.load(open(f"{sys.argv[1]}/manifests/torch-compile/modernbert_bf16@2x512.json"))
d = m["profile"]["details"]; r = d["rounds"][0]; t = r["takes"]
med = [x["median_ms"] for x in t]; iss = [x["issue_ms"] for x in t]
print(f"{sys.argv[2]}: prepared_ahead {d.get('prepared_ahead')} median {statistics.median(med):.3f} ms over {len(t)} takes in {r['elapsed_s']} s; clocks {sorted(set(x['sm_clock_mhz'] for x in t))}")
print("  takes", " ".join(f"{v:.2f}" for v in med)); print("  issue", " ".join(f"{v:.1f}" for v in iss))
PY
}
ws /tmp/wa; ws /tmp/wb
run() { (cd $2 && PYTHONPATH=/tmp/site:$2 timeout 150 python3 -m pipeline.cli --catalog $3/pipeline.toml run --model modernbert --variant bf16 --toolchain torch-compile $4 > $OUT/r/$1.log 2>&1); echo "$1 rc $? at $((SECONDS - s)) s" >> $OUT/r/summary.txt; takes $1 $3; }
run A1 $root /tmp/wa ""
run B1 /tmp/variant /tmp/wb ""
[ $SECONDS -lt ${DEADLINE_S:-420} ] && run A2 $root /tmp/wa --force
[ $SECONDS -lt ${DEADLINE_S:-420} ] && run B2 /tmp/variant /tmp/wb --force
mkdir -p $OUT/r/a $OUT/r/b; cp /tmp/wa/manifests/torch-compile/*.json $OUT/r/a/; cp /tmp/wb/manifests/torch-compile/*.json $OUT/r/b/
echo "all: $((SECONDS - s)) s" >> $OUT/r/summary.txt; cat $OUT/r/summary.txt
