#!/usr/bin/env bash
# Which part of the machine watch slows the compiled engine, three processes a state where it matters:
# plain, the whole watch, the watch without its GPU reads, only its NVML questions of processes.
set -u
[ -f /tmp/site/.done ] || { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && touch /tmp/site/.done; } || exit 1
export PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0 PYTHONPATH=/tmp/site:$PWD
mkdir -p $OUT/r; s=$SECONDS
{ echo "product at $(cat .whl/HEAD) + check_process_state.py's new states"; date; nvidia-smi -L; nproc; } > $OUT/r/tree.txt 2>&1
timeout ${STATES_S:-240} python3 scripts/check_process_state.py --shape 2x512 --rounds 12 --take-ms 100 --states compile-product compile-product#2 compile-product#3 compile-watched compile-watched#2 compile-watched#3 compile-watched-cpu compile-watched-cpu#2 compile-gpu-queries compile-gpu-queries#2 --out $OUT/r/process-state > $OUT/r/process-state.log 2>&1
echo "process states: $((SECONDS - s)) s rc $?" >> $OUT/r/tree.txt
tail -1 $OUT/r/tree.txt; grep -v Warning $OUT/r/process-state.log | tail -32
