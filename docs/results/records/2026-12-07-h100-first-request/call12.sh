#!/usr/bin/env bash
# A serving thread's first request: where its time goes (first_probe.py), then the compiled run
# against by hand with each thread's first request untimed in that thread (product at HEAD).
set -u
[ -f /tmp/site/.done ] || { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && touch /tmp/site/.done; } || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT/r; cat .whl/HEAD > $OUT/r/head.txt; nvidia-smi -L >> $OUT/r/head.txt; nproc >> $OUT/r/head.txt
s=$SECONDS
timeout 150 python3 .whl/first_probe.py $OUT/r/first-probe.json > $OUT/r/first-probe.txt 2>&1
echo "probe: $((SECONDS - s)) s rc $?" >> $OUT/r/head.txt; cat $OUT/r/first-probe.txt | tail -14
s=$SECONDS
TOOLCHAIN=torch-compile timeout ${RUN_S:-330} bash scripts/check_run_against_hand.sh /tmp/w/compile 150 > /tmp/w-compile.out 2>&1
echo "compile run vs hand: $((SECONDS - s)) s rc $?" >> $OUT/r/head.txt
cp /tmp/w-compile.out $OUT/r/compile.out; (cd /tmp/w && tar czf $OUT/r/compile.tgz compile)
cat $OUT/r/head.txt; cat /tmp/w/compile/summary.txt
