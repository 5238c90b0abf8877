#!/usr/bin/env bash
# The eager run against by hand with each thread's first request untimed in that thread (after call12.sh, same start).
set -u
[ -f /tmp/site/.done ] || { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && touch /tmp/site/.done; } || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT/r; cat .whl/HEAD > $OUT/r/head13.txt; nvidia-smi -L >> $OUT/r/head13.txt
s=$SECONDS
TOOLCHAIN=torch-eager timeout ${RUN_S:-400} bash scripts/check_run_against_hand.sh /tmp/w/eager 170 > /tmp/w-eager.out 2>&1
echo "eager run vs hand: $((SECONDS - s)) s rc $?" >> $OUT/r/head13.txt
cp /tmp/w-eager.out $OUT/r/eager.out; (cd /tmp/w && tar czf $OUT/r/eager.tgz eager)
cat $OUT/r/head13.txt; cat /tmp/w/eager/summary.txt
