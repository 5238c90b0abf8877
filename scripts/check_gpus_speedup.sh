#!/usr/bin/env bash
# The seed matrix's bf16 half (docs/results/sweeps.md) from an empty workspace — no Inductor or Triton
# cache either — on one GPU, or on several with `--gpus`, for docs/cluster.md's comparison:
#
#   bash scripts/check_gpus_speedup.sh one OUT    # CUDA_VISIBLE_DEVICES=0 pipeline run …
#   bash scripts/check_gpus_speedup.sh all OUT    # pipeline run --gpus 0,1,… (every GPU; the cluster extra)
#   bash scripts/check_gpus_speedup.sh again OUT  # after `one`: its workspace and compiled work kept, --force
#   python scripts/check_rerun_agreement.py OUT/one/compare.json OUT/all/compare.json
#
# Each writes OUT/<mode>/{run.log,compare.json,seconds.txt} and prints where each point was
# measured (GPU, CPUs), the rows' flags and the wall clock. VARIANTS="bf16 fp16" runs the whole matrix;
# TOOLCHAINS="torch-eager torch-compile" fewer toolchains; MODEL=NAME another model of pipeline.toml;
# SHAPES="8x2048 16x4096" other shape points for it (the workspace's copy of the catalog is changed);
# RUN_ARGS="--no-racing" more arguments for `pipeline run`; RUN_PREFIX="py-spy record -o P.json --" a
# command the run (alone, not the compare after it) is started under, to see where its time goes.
#   bash scripts/check_gpus_speedup.sh compare OUT  # the two runs side by side, point by point
#
# `compare` prints both wall clocks and their ratio, then every row's median in each run, their
# ratio, each run's flags (launch-bound, host slowed, busy) and how its rounds held the host, and
# runs check_rerun_agreement.py on the two answers.
set -uo pipefail
mode="${1:?usage: check_gpus_speedup.sh one|all|compare OUT}"
cd "$(dirname "$0")/.."
if [ "$mode" = compare ]; then
  root="${2:?usage: check_gpus_speedup.sh compare OUT}"
  python3 - "$root" <<'PY'
import json, sys
from pathlib import Path

root = Path(sys.argv[1])
seconds = {mode: float((root / mode / "seconds.txt").read_text()) for mode in ("one", "all")}
print(f"wall clock: one GPU {seconds['one']:.1f} s, every GPU {seconds['all']:.1f} s: {seconds['all'] / seconds['one']:.2f}x")


def rows(mode):
    data = json.loads((root / mode / "compare.json").read_text())
    return {(row.get("shape"), row["variant"], row["toolchain"]): row for row in data["rows"]}


def held(mode, row):
    for manifest in (root / mode / "ws" / "manifests").rglob(f"*@{row.get('shape')}.json"):
        raw = json.loads(manifest.read_text())
        if raw["toolchain"] == row["toolchain"] and raw["variant"] == row["variant"]:
            rounds = (((raw.get("profile") or {}).get("details") or {}).get("rounds") or [{}])[0]
            return rounds.get("host_held") or "-"
    return "-"


def short(flags):
    kept = [flag.split(":")[0] for flag in flags or [] if flag.startswith(("launch-bound", "near launch-bound", "host slowed", "busy", "throttled"))]
    return ",".join(kept) or "-"


one, every = rows("one"), rows("all")
print(f"{'point':<8} {'engine':<32} {'one GPU ms':>10} {'every GPU ms':>12} {'ratio':>6}  flags (one | every), hold (one | every)")
for key in sorted(set(one) | set(every), key=lambda k: (str(k[0]), k[1], k[2])):
    a, b = one.get(key), every.get(key)
    ma, mb = (a or {}).get("median_ms"), (b or {}).get("median_ms")
    ratio = f"{mb / ma:.3f}" if ma and mb else "-"
    print(
        f"{str(key[0]):<8} {key[1] + '/' + key[2]:<32} {ma if ma is not None else '-':>10} {mb if mb is not None else '-':>12} {ratio:>6}"
        f"  {short((a or {}).get('flags'))} | {short((b or {}).get('flags'))}, {held('one', a) if a else '-'} | {held('all', b) if b else '-'}"
    )
PY
  python3 scripts/check_rerun_agreement.py "$root/one/compare.json" "$root/all/compare.json"
  exit $?
fi
out="${2:?usage: check_gpus_speedup.sh one|all|again OUT}/$mode"
PIPELINE="${PIPELINE:-python3 -m pipeline.cli}"
if [ "$mode" = again ]; then
  # The same workspace as `one` — its compiled work kept in ws/.cache/torch — every stage run again (--force).
  [ -f "$2/one/ws/pipeline.toml" ] || { echo "again: run 'one' first, with the same OUT"; exit 2; }
  rm -rf "$out" && mkdir -p "$out" && ln -s ../one/ws "$out/ws"
else
  rm -rf "$out" && mkdir -p "$out/ws"
  cp pipeline.toml "$out/ws/pipeline.toml"
fi
model="${MODEL:-modernbert}"
if [ -n "${SHAPES:-}" ]; then
  python3 - "$out/ws/pipeline.toml" "$model" $SHAPES <<'PY' || exit 1
import re, sys, tomllib
from pathlib import Path

path, model, shapes = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
text = path.read_text()
section = re.search(rf"^\[models\.{re.escape(model)}\]\n(?:(?!^\[).*\n)*", text, re.M)
if section is None or not re.search(r"^shapes = .*$", section.group(0), re.M):
    sys.exit(f"no shapes line for model {model} in {path}")
body = re.sub(r"^shapes = .*$", "shapes = " + repr(shapes).replace("'", '"'), section.group(0), count=1, flags=re.M)
text = text[: section.start()] + body + text[section.end() :]
assert tomllib.loads(text)["models"][model]["shapes"] == shapes
path.write_text(text)
PY
fi
# Compiled from nothing, as on a fresh machine: Inductor's cache (FX graphs, AOTAutograd, kernels) and
# Triton's, wherever they are (the workspace's .cache/torch is new with it); `again` keeps them.
if [ "$mode" != again ]; then
  rm -rf "/tmp/torchinductor_$(id -un)" "${TORCHINDUCTOR_CACHE_DIR:-/nonexistent}" "$HOME/.triton/cache"
fi
args=(run --model "$model")
for variant in ${VARIANTS:-bf16}; do args+=(--variant "$variant"); done
for toolchain in ${TOOLCHAINS:-torch-eager torch-eager-attn torch-compile torch-cudagraphs torch-reduce-overhead}; do args+=(--toolchain "$toolchain"); done
for arg in ${RUN_ARGS:-}; do args+=("$arg"); done  # RUN_ARGS="--no-racing", say
[ "$mode" = again ] && args+=(--force)
if [ "$mode" = one ] || [ "$mode" = again ]; then
  export CUDA_VISIBLE_DEVICES=0
else
  args+=(--gpus "$(nvidia-smi --query-gpu=index --format=csv,noheader | paste -sd,)")
fi
started=$(date +%s.%N)
# Each line of the log stamped with the seconds since the start: where the wall clock went.
PYTHONUNBUFFERED=1 ${RUN_PREFIX:-} $PIPELINE --catalog "$out/ws/pipeline.toml" "${args[@]}" 2>&1 |
  python3 -u -c 'import sys, time; t = time.monotonic(); [print(f"{time.monotonic() - t:7.1f}  {line}", end="") for line in sys.stdin]' > "$out/run.log"
status=${PIPESTATUS[0]}
seconds=$(python3 -c "print(round($(date +%s.%N) - $started, 1))")
echo "$seconds" > "$out/seconds.txt"
$PIPELINE --catalog "$out/ws/pipeline.toml" compare --model "$model" --format json > "$out/compare.json" 2> "$out/compare.err"
echo "== $mode: pipeline run exit $status in $seconds s"
python3 - "$out" <<'PY'
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
data = json.loads((out / "compare.json").read_text())
for row in data["rows"]:
    flags = "; ".join(row.get("flags") or [])
    print(f"  {row.get('shape')} {row['variant']}/{row['toolchain']}: {row.get('median_ms')} ms on GPU {(row.get('gpu_device') or {}).get('index')} {flags}")
# Where each point's time went: its rounds, and each engine's preparation there (compiling from
# Inductor's cache, capturing CUDA graphs); the rest of a point is loading models and starting up.
points: dict = {}
for manifest in sorted((out / "ws" / "manifests").rglob("*@*.json")):
    raw = json.loads(manifest.read_text())
    node = raw["environment"].get("cluster_node") or {}
    details = (raw.get("profile") or {}).get("details") or {}
    rounds = (details.get("rounds") or [{}])[0]
    execution = details.get("execution") or {}
    point = points.setdefault(manifest.stem.split("@")[1], {"rounds_s": rounds.get("elapsed_s"), "cpus": node.get("cpus"), "engines": {}})
    point["group"] = point.get("group") or rounds.get("group")  # a failed engine has no rounds
    engine = f"{manifest.stem.split('@')[0]} on {manifest.parent.name}"  # both variants of a toolchain
    point["engines"][engine] = {k: execution.get(k) for k in ("prepare_s", "compile_s", "inductor_cache_hits", "threads") if k in execution}
    point["engines"][engine].update(details.get("preparation_s") or {})
    # Prepared and checked while the run waited for its compilations, not at the point; or timed
    # in the process that compiled it.
    point["engines"][engine]["ahead"] = bool(details.get("prepared_ahead"))
    if execution.get("served_by"):
        point["engines"][engine]["served_by"] = execution["served_by"]["process"]
for name, point in points.items():
    here = [e for e in point["engines"].values() if not e["ahead"]]
    prepare = sum(e.get("prepare") or 0 for e in here)
    check = sum(e.get("check") or 0 for e in here)
    ahead = sum((e.get("prepare") or 0) + (e.get("check") or 0) for e in point["engines"].values() if e["ahead"])
    served = sum(1 for e in point["engines"].values() if "served_by" in e)
    print(
        f"  {name}: {len(point['engines'])} engines in group {point['group']} on CPUs {point['cpus']}; rounds {point['rounds_s']} s, "
        f"at the point preparing {prepare:.1f} s, checking outputs {check:.1f} s; {len(point['engines']) - len(here)} prepared "
        f"ahead ({ahead:.1f} s), {served} served by the processes that compiled them"
    )
    for engine, facts in point["engines"].items():
        print(f"    {engine}: {facts}")
# Where each export's time went, by phase (ExportDetails.timings_s).
for manifest in sorted((out / "ws" / "manifests" / "export").glob("*.json")):
    details = ((json.loads(manifest.read_text()).get("export") or {}).get("details") or {})
    print(f"  export {manifest.stem}: {details.get('timings_s')}")
# What each compiled engine's build compiled ahead, point by point (the profiles above should find it).
for manifest in sorted((out / "ws" / "manifests").glob("*/*.json")):
    if "@" in manifest.stem:
        continue
    compiler = ((json.loads(manifest.read_text()).get("build") or {}).get("details") or {}).get("compiler") or {}
    ahead = compiler.get("compiled_ahead")
    if ahead:
        print(f"  {manifest.stem} on {manifest.parent.name} built on {compiler.get('threads')} threads; ahead: {json.dumps(ahead)}")
PY
grep -E "^ *[0-9.]+  (export|build|profile|cluster|running|done|measuring)" "$out/run.log" | tail -60
exit $status
