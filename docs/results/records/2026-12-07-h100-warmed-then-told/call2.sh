#!/usr/bin/env bash
set -u
[ -f /tmp/site/.done ] || { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && touch /tmp/site/.done; } || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
cat .whl/HEAD > $OUT/head.txt; nvidia-smi -L >> $OUT/head.txt
s=$SECONDS
SHAPES=${SHAPES:-4x4096} timeout 560 bash scripts/record_serving.sh /tmp/rec/serving > /tmp/serving.out 2>&1
echo "serving: $((SECONDS - s)) s rc $?" >> $OUT/head.txt
cp /tmp/serving.out /tmp/rec/serving/record.out; (cd /tmp/rec && tar czf $OUT/serving.tgz serving)
cat $OUT/head.txt; cat /tmp/rec/serving/agreement.txt; cat /tmp/rec/serving/p99-under.txt | tail -8
