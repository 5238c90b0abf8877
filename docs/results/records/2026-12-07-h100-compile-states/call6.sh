#!/usr/bin/env bash
# Whose compiled engine issues slower: the compile states of check_process_state.py at 2x512, in turn (alone: a short budget).
set -u
[ -f /tmp/site/.done ] || { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && touch /tmp/site/.done; } || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT/r
{ echo "product at $(cat .whl/HEAD)"; date; nvidia-smi; nproc; python3 -c 'import torch,transformers;print(torch.__version__,transformers.__version__)'; } > $OUT/r/tree.txt 2>&1
s=$SECONDS
timeout ${STATES_S:-270} python3 scripts/check_process_state.py --shape 2x512 --rounds 8 --take-ms 300 --states fresh compile-hand compile-product compile-unprofiled compile-shared-cpus compile-forked --out $OUT/r/process-state > $OUT/r/process-state.log 2>&1
echo "process states: $((SECONDS - s)) s rc $?" >> $OUT/r/tree.txt
tail -2 $OUT/r/tree.txt; tail -12 $OUT/r/process-state.log
