#!/usr/bin/env bash
# The compiled run against by hand (after call6.sh on the same start).
set -u
[ -f /tmp/site/.done ] || { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && touch /tmp/site/.done; } || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT/r
s=$SECONDS
TOOLCHAIN=torch-compile timeout ${RUN_S:-240} bash scripts/check_run_against_hand.sh /tmp/w/compile 150 > /tmp/w-compile.out 2>&1
echo "compile run vs hand: $((SECONDS - s)) s rc $?" > $OUT/r/tree7.txt
cp /tmp/w-compile.out $OUT/r/compile.out; (cd /tmp/w && tar czf $OUT/r/compile.tgz compile)
cat $OUT/r/tree7.txt; cat /tmp/w/compile/summary.txt
