#!/usr/bin/env bash
# What in a thread beside it slows the compiled engine: its compiled states with the SM clock's
# sampler, the machine watch, an idle thread waking every 20 ms, NVML read every 20 ms by another process.
set -u
[ -f /tmp/site/.done ] || { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && touch /tmp/site/.done; } || exit 1
export PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0 PYTHONPATH=/tmp/site:$PWD
mkdir -p $OUT/r; s=$SECONDS
{ echo "product at $(cat .whl/HEAD) + check_process_state.py's new states"; date; nvidia-smi -L; nproc; } > $OUT/r/tree.txt 2>&1
timeout ${STATES_S:-240} python3 scripts/check_process_state.py --shape 2x512 --rounds 12 --take-ms 100 --states compile-product compile-hand compile-sampled compile-watched compile-thread compile-nvml-process --out $OUT/r/process-state > $OUT/r/process-state.log 2>&1
echo "process states: $((SECONDS - s)) s rc $?" >> $OUT/r/tree.txt
tail -1 $OUT/r/tree.txt; grep -v Warning $OUT/r/process-state.log | tail -22
