#!/usr/bin/env bash
set -u
[ -f /tmp/site/.done ] || { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && touch /tmp/site/.done; } || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
cat .whl/HEAD > $OUT/head.txt; nvidia-smi -L >> $OUT/head.txt
timeout 200 python3 .whl/read_probe.py $OUT/read-probe.json 12 > $OUT/read-probe.txt 2>&1
echo "rc $?" >> $OUT/head.txt
cat $OUT/head.txt; grep -v Warning $OUT/read-probe.txt | tail -8
