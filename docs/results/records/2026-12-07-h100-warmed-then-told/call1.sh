#!/usr/bin/env bash
# The seed matrix cold and warm (record_seed_matrix.sh), then take_probe.py with the time left.
set -u
[ -f /tmp/site/.done ] || { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && touch /tmp/site/.done; } || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
cat .whl/HEAD > $OUT/head.txt; nvidia-smi -L >> $OUT/head.txt; nproc >> $OUT/head.txt
s=$SECONDS
timeout 400 bash scripts/record_seed_matrix.sh /tmp/rec/seed > /tmp/seed.out 2>&1
echo "seed matrix: $((SECONDS - s)) s rc $?" >> $OUT/head.txt
cp /tmp/seed.out /tmp/rec/seed/record.out; (cd /tmp/rec && tar czf $OUT/seed.tgz seed)
left=$((575 - SECONDS)); [ $left -gt 160 ] && left=160
s=$SECONDS
[ $left -gt 60 ] && timeout $left python3 .whl/take_probe.py $OUT/probe.json 10 > $OUT/probe.txt 2>&1
echo "probe: $((SECONDS - s)) s of $left" >> $OUT/head.txt
cat $OUT/head.txt; tail -3 /tmp/seed.out; cat /tmp/rec/seed/cold.txt | head -3; head -2 /tmp/rec/seed/warm.txt; cat /tmp/rec/seed/agreement.txt | head -30; cat $OUT/probe.txt | tail -14
