#!/usr/bin/env bash
# Cold builds with unity builds on and off (BYOC_UNITY_BUILD=1/0), one after another on one
# machine, each with an empty object cache and the shipped tuning database: what unity
# builds change, without the 20% that build times vary between machines of one kind
# (bench/results/build_times.md). On the lent GPU machine, carrying .whl/:
#   bash bench/ab_unity.sh [CASE ...]     (default: bert_base:1 resnet50:32 gpt2:1)
# Prints one line per build: name, build s, nvcc wall s, the slowest units.
set -u
cd "$(dirname "$0")/.."
lscpu | grep -E "^CPU\(s\)|Thread|Core|Socket|Model name"
bash bench/gpu_session.sh setup >/dev/null 2>&1
export CUTLASS_PATH=/tmp/nvidia-cutlass/cutlass_library/source PYTHONPATH=$PWD
[ $# -eq 0 ] && set -- bert_base:1 resnet50:32 gpt2:1
build() {  # NAME UNITY CASE
  rm -rf "/tmp/ab-cache-$1" "build/ab-$1"
  BYOC_UNITY_BUILD=$2 BYOC_CACHE_DIR="/tmp/ab-cache-$1" timeout 300 python3 bench/real_models.py --prebuild \
    --workdir "build/ab-$1" --configs cuda_sm90 --tuning-db backends/cutlass/tuning_sm90.json --profile false \
    --cases "$3" >"/tmp/ab-$1.log" 2>&1
  python3 - "$1" "build/ab-$1/prebuilt" <<'PY'
import glob, json, sys
for path in glob.glob(sys.argv[2] + "/*.json"):
    record = json.load(open(path))
    stats = record["build_stats"]
    print(sys.argv[1], record["build_s"], stats["compile_seconds"],
          [(unit["source"][:60], unit["seconds"]) for unit in stats["slowest_units"]], flush=True)
PY
}
date +%T
for case in "$@"; do
  name="${case%%:*}"
  build "${name}_unity" 1 "$case"
  build "${name}_alone" 0 "$case"
done
date +%T
