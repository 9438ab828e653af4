#!/usr/bin/env bash
# What one call on the lent GPU machine runs (no internet there): install the wheels carried
# in .whl/ (see docs/performance.md), then run a stage and leave logs and results in $OUT.
#   bench/gpu_session.sh tests    GPU tests of every file that has them, files in parallel, and the torch interop tests
#   bench/gpu_session.sh gemm     bench/bench_gemm.py (CUTLASS tuned, cuBLASLt engine, cuBLAS)
#   bench/gpu_session.sh attention [ARGS...]  bench/bench_attention.py (every fused attention kernel and tile)
#   bench/gpu_session.sh build_times [CASES...]  cold/warm/measure-all build times (bench/build_times.py tables them; LIBRARY=1: with the kernel library)
#   bench/gpu_session.sh models CASES...   bench/run_models.py over the shipped CUDA configs
#   bench/gpu_session.sh release 1|2  the model cases the open issues ask for, in two calls
#   bench/gpu_session.sh profile [CASES...]  per-kernel GPU time (bench/profile_kernels.py)
#   bench/gpu_session.sh timeline CASES...  one run of real models kernel by kernel, beside torch.compile's (bench/kernel_timeline.py)
#   bench/gpu_session.sh tune [CASES...]     tune the CUTLASS kernels of whole models into the database
#   bench/gpu_session.sh retune KEYS... [-- TILES...]  tune settled database problems again (new candidates)
#   bench/gpu_session.sh real [CASES...]   real transformers/torchvision models (bench/real_models.py)
#   bench/gpu_session.sh suite [CASES...]  the same, built side by side first, then timed one by one
#   bench/gpu_session.sh buckets [CASES...]  shape buckets against static libraries (bench/shape_buckets.py)
#   bench/gpu_session.sh corpus [NAME[:EXPORTER] ...]  the model corpus at full size against onnxruntime (bench/corpus_gpu.py)
#   bench/gpu_session.sh replay [ARGS...]  every run of a built model against onnxruntime (bench/replay_check.py)
#   bench/gpu_session.sh setup    only the set-up (then export PYTHONPATH=$PWD and CUTLASS_PATH as below)
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/byoc-out}"
mkdir -p "$OUT"
for package in jinja2 pyyaml ninja ml_dtypes timm; do  # one at a time: one that cannot install must not stop the rest
  python3 -c "import ${package/pyyaml/yaml}" 2>/dev/null || pip install --no-index --find-links .whl "$package" >>"$OUT/pip.log" 2>&1
done
# CUTLASS's headers straight from the wheel (byoc finds them through CUTLASS_PATH).
python3 -m zipfile -e .whl/nvidia_cutlass-*.whl /tmp/nvidia-cutlass >>"$OUT/pip.log" 2>&1
export CUTLASS_PATH=/tmp/nvidia-cutlass/cutlass_library/source
# byoc itself from the checkout (an editable install needs a build backend the machine may lack),
# byte-compiled as pip compiles an installed package: the machine sets PYTHONDONTWRITEBYTECODE,
# so without this every build process compiles byoc's modules from source (0.7 s of a warm build).
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
python3 -m compileall -q -j 0 byoc backends >>"$OUT/pip.log" 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >"$OUT/gpu.txt"
stage="${1:-tests}"; shift || true
case "$stage" in
  tests)
    files=("$@"); [ ${#files[@]} -eq 0 ] && files=(tests/test_build_cuda.py tests/test_cutlass.py tests/test_json_engine.py tests/test_shim_cuda.py tests/test_builtin_codegen.py tests/test_plan_devices.py tests/test_runtime_cuda.py tests/test_squeeze_excitation.py tests/test_refit.py tests/test_multi_arch.py tests/test_measured_partition.py tests/test_cudnn.py tests/test_kernel_library.py tests/test_runtime_epilogue.py)
    # One process per GPU test of the files that build a library per test (test_cutlass.py,
    # test_build_cuda.py, test_cudnn.py: run one after another they outlast a 10-minute device
    # command), one per file for the rest; at most 12 at a time, and one log per file (the
    # device returns 8 files). A command cut off by `timeout` still brings back the logs.
    # Keep test_builtin_codegen.py whole: split, its 550 GPU tests each compiled the CUDA
    # shim at once (48 processes on a 64-core host: 290 s a test, 48 done in 560 s).
    copy_logs() {
      for f in "${files[@]}"; do
        name=$(basename "${f%%::*}" .py)
        cat /tmp/byoc-test-logs/"$name".*.log >"$OUT/$name.log" 2>/dev/null
      done
    }
    trap 'copy_logs; grep -hE "^== |passed|failed|^FAILED|^ERROR" "$OUT"/test_*.log; exit 124' TERM
    ids=()
    for f in "${files[@]}"; do
      if [[ " ${SPLIT_FILES:-test_cutlass.py test_build_cuda.py test_cudnn.py test_runtime_epilogue.py} " == *" $(basename "$f") "* ]]; then
        while read -r id; do ids+=("$id"); done < <(python3 -m pytest -q --collect-only -m gpu -p no:cacheprovider "$f" 2>/dev/null | grep '::')
      else
        ids+=("$f")
      fi
    done
    # On a host of several GPUs each one-test process gets one of them in turn (whole files
    # see every GPU: their multi-GPU tests need them); TEST_JOBS processes at a time.
    mkdir -p /tmp/byoc-test-logs
    gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
    index=0
    for id in "${ids[@]}"; do
      index=$((index + 1))
      visible=()
      [[ "$id" == *::* && "$gpus" -gt 1 ]] && visible=(env CUDA_VISIBLE_DEVICES=$((index % gpus)))
      (echo "== $id"; "${visible[@]}" python3 -m pytest -q -m gpu -p no:cacheprovider "$id" 2>&1) >"/tmp/byoc-test-logs/$(basename "${id%%::*}" .py).$index.log" &
      while [ "$(jobs -rp | wc -l)" -ge "${TEST_JOBS:-12}" ]; do sleep 1; done
    done
    wait
    copy_logs
    # the tests that compare with torch (installed here, not in CI): every GPU session runs them
    (echo "== torch interop"; python3 -m pytest -q -p no:cacheprovider tests/test_ops_nn_layout.py -k torch 2>&1) \
      >"$OUT/test_torch_interop.log"
    grep -hE "^== |passed|failed|^FAILED|^ERROR" "$OUT"/test_*.log ;;
  tune)
    # Tune the CUTLASS kernels of whole models (problems the database lacks, e.g. BERT at
    # batch 1: M=128) while building them, then time the models; the grown database comes
    # back as $OUT/tuning_sm90.json (copy it over backends/cutlass/tuning_sm90.json).
    cp backends/cutlass/tuning_sm90.json "$OUT/tuning_sm90.json"
    [ $# -eq 0 ] && set -- bert_base:1=cuda_sm90
    TUNING_DB="$OUT/tuning_sm90.json" PROFILE=auto bash "$0" models "$@" ;;
  retune)
    # Problems whose keys contain any of KEYS, among TILES (all candidates when none) ->
    # $OUT/tuning_sm90.json (copy it over backends/cutlass/tuning_sm90.json), e.g.
    #   retune m128:n768 m128:n2304 -- 64x64x64 64x32x64 64x16x64   (SPLIT_K=1: split-K and stream-K too)
    keys=(); tiles=()
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do keys+=("$1"); shift; done
    [ $# -gt 0 ] && shift && tiles=("$@")
    cp backends/cutlass/tuning_sm90.json "$OUT/tuning_sm90.json"
    python3 bench/retune_gemms.py --tuning-db "$OUT/tuning_sm90.json" --keys "${keys[@]}" --tiles "${tiles[@]}" ${SPLIT_K:+--split-k} \
      2>&1 | tee "$OUT/retune.log" | tail -n 20 ;;
  profile)
    # Where one run's GPU time goes (kernel table per model and config)
    [ $# -eq 0 ] && set -- bert_base:1=cuda_sm90 mlp:1=cuda_sm90
    python3 bench/profile_kernels.py --out /tmp/byoc-profile \
      --tuning-db "${TUNING_DB:-backends/cutlass/tuning_sm90.json}" "$@" >"$OUT/profile.log" 2>&1
    cat /tmp/byoc-profile/*.txt >"$OUT/profiles.txt"; cat "$OUT/profiles.txt" ;;
  timeline)
    # Real models kernel by kernel in launch order, each kernel's exposed time, per family,
    # beside torch.compile default's run, e.g. bash bench/gpu_session.sh timeline mobilenet_v3_large:32
    [ $# -eq 0 ] && set -- mobilenet_v3_large:32
    for case in "$@"; do
      PYTHONUNBUFFERED=1 python3 bench/kernel_timeline.py "$case" --out "$OUT" 2>&1 | grep -v Warning | tee -a "$OUT/timeline.log"
    done ;;
  build_times)
    # Cold (empty object cache) and warm builds of each case with the shipped tuning database,
    # then BERT-base b1 cold with every CUTLASS kernel measured here (cuda_sm90:measure, or
    # MEASURE_CONFIG=cuda_sm90:measure_all: every candidate with its own epilogue; at
    # most MEASURE_S seconds), then the libraries timed; the records come back as
    # $OUT/build_times.tar.gz for bench/build_times.py.
    # With LIBRARY=1 the kernel library comes first (byoc kernels build: its one-time cost and
    # size in $OUT/kernel_library.json), kept across the cold builds, which then tune on this
    # GPU as the shipped config does (profile auto, an empty user database: every problem
    # the shipped database lacks is measured), e.g.
    #   LIBRARY=1 MEASURE= bash bench/gpu_session.sh build_times bert_base:1 convnext_tiny:32
    # LIBRARY_CONFIG=bench/cuda_sm90_runtime.yaml BUILD_CONFIG=cuda_sm90:runtime: the same with
    # the cutlass runtime_epilogue (the library's config and the builds' must agree).
    [ $# -eq 0 ] && set -- bert_base:1 gpt2:1 resnet50:32
    mkdir -p /tmp/build-times
    cold_profile=false
    if [ -n "${LIBRARY:-}" ]; then
      export BYOC_KERNEL_LIBRARY="${BYOC_KERNEL_LIBRARY:-/tmp/kernel-library}" TUNING_DB_ARG=""
      cold_profile=auto
      echo "$(date +%T) kernel library: building into $BYOC_KERNEL_LIBRARY"
      python3 -m byoc kernels build -c "${LIBRARY_CONFIG:-cuda_sm90}" --json >"$OUT/kernel_library.json" \
        2>/tmp/build-times/kernel_library.log
      echo "$(date +%T) kernel library: $(tr -d '\n ' <"$OUT/kernel_library.json")"
    fi
    prebuild() {  # CACHE WORKDIR TAG CONFIG PROFILE CASE [timeout]
      BYOC_CACHE_DIR="$1" timeout "${7:-500}" python3 bench/real_models.py --prebuild --workdir "$2" \
        --configs "$4" --tuning-db "${TUNING_DB_ARG-backends/cutlass/tuning_sm90.json}" --profile "$5" --cases "$6" \
        --build-log "/tmp/build-times/$3.progress" >"/tmp/build-times/$3.log" 2>&1
      echo "$(date +%T) $3: $(grep -h 'built in\|FAILED' "/tmp/build-times/$3.log" | tail -n 1)"
      for record in "$2"/prebuilt/*.json; do cp "$record" "/tmp/build-times/$3.$(basename "$record")"; done
    }
    # the warm build in a workdir of its own: only the object cache is warm, as for a user
    # building the same model again elsewhere
    for case in "$@"; do
      name="${case%%:*}"
      rm -rf "/tmp/cache-$name"  # cold: a machine kept warm between calls keeps /tmp
      prebuild "/tmp/cache-$name" build/byoc-real "$name.cold" "${BUILD_CONFIG:-cuda_sm90}" "$cold_profile" "$case"
      prebuild "/tmp/cache-$name" build/byoc-real-warm "$name.warm" "${BUILD_CONFIG:-cuda_sm90}" "$cold_profile" "$case"
    done
    # MEASURE= (empty) leaves the measure-all build out
    measure="${MEASURE-bert_base:1}"
    [ -n "$measure" ] && rm -rf /tmp/cache-measure && TUNING_DB_ARG="" prebuild /tmp/cache-measure build/byoc-real-measure "${measure%%:*}.measure" \
      "${MEASURE_CONFIG:-cuda_sm90:measure}" auto "$measure" "${MEASURE_S:-200}"
    PYTHONUNBUFFERED=1 python3 bench/real_models.py --prebuilt --out /tmp/build-times --workdir build/byoc-real \
      --configs "${BUILD_CONFIG:-cuda_sm90}" --torch-modes none --cases "$@" >/tmp/build-times/timing.log 2>&1
    # the measured build's run time beside it (what the tuning found)
    [ -n "$measure" ] && [ -d build/byoc-real-measure/prebuilt ] && PYTHONUNBUFFERED=1 python3 bench/real_models.py --prebuilt \
      --out /tmp/build-times/measure --workdir build/byoc-real-measure --configs "${MEASURE_CONFIG:-cuda_sm90:measure}" --torch-modes none \
      --cases "$measure" >/tmp/build-times/timing-measure.log 2>&1
    tar -czf "$OUT/build_times.tar.gz" -C /tmp/build-times . ;;
  proxy_ab)
    # Tuning with the epilogue proxy against each problem's own epilogue: per case, a cold
    # build (empty object cache and tuning database, the shipped one not read) with every
    # CUTLASS kernel measured each way, then both libraries timed in one process, e.g.
    #   bash bench/gpu_session.sh proxy_ab bert_base:1 resnet50:32
    # VARIANTS="measure measure_1gpu" compares tuning on every GPU of the host with one.
    [ $# -eq 0 ] && set -- bert_base:1 resnet50:32
    for case in "$@"; do
      for variant in ${VARIANTS:-measure measure_proxy}; do
        rm -rf "/tmp/cache-$variant"
        BYOC_CACHE_DIR="/tmp/cache-$variant" timeout "${MEASURE_S:-250}" python3 bench/real_models.py --prebuild \
          --workdir "build/byoc-$variant" --configs "cuda_sm90:$variant" --tuning-db "" --profile auto --cases "$case" \
          >"$OUT/proxy_ab.$variant.${case%%:*}.log" 2>&1
        echo "$(date +%T) $case $variant: $(grep -h 'built in\|FAILED' "$OUT/proxy_ab.$variant.${case%%:*}.log" | tail -n 1)"
      done
    done
    for variant in ${VARIANTS:-measure measure_proxy}; do
      PYTHONUNBUFFERED=1 python3 bench/real_models.py --prebuilt --out "$OUT/$variant" --workdir "build/byoc-$variant" \
        --configs "cuda_sm90:$variant" --torch-modes none --cases "$@" 2>&1 | grep -E "byoc [0-9.]+ ms" ;
    done ;;
  se_ab)
    # The squeeze-and-excitation kernel of the tree against another version of its file
    # (SE_BASELINE, default .gpu_extra/se_main.cu: main's, carried in a git-excluded folder)
    baseline="${SE_BASELINE:-.gpu_extra/se_main.cu}"
    python3 bench/bench_squeeze_excitation.py --out "$OUT/se_tree" 2>&1 | tee "$OUT/se_tree.log" | tail -n 20
    [ -f "$baseline" ] && python3 bench/bench_squeeze_excitation.py --out "$OUT/se_baseline" --source "$baseline" \
      2>&1 | tee "$OUT/se_baseline.log" | tail -n 20 ;;
  attention)
    python3 bench/bench_attention.py --out "$OUT" "$@" 2>&1 | tee "$OUT/bench_attention.log" | tail -n 60 ;;
  gemm)
    python3 bench/bench_gemm.py --out "$OUT" --workdir /tmp/byoc-gemm --tuning-db "$OUT/tuning_sm90.json" "$@" 2>&1 | tee "$OUT/bench_gemm.log" | tail -n 30 ;;
  models)
    python3 bench/run_models.py --out "$OUT" --configs cuda_sm90_builtin cuda_sm90 cuda_sm90:nograph cuda_sm90_cublaslt \
      ${TUNING_DB:+--tuning-db "$TUNING_DB"} ${PROFILE:+--profile "$PROFILE"} --cases "$@" 2>&1 \
      | tee "$OUT/run_models.log" | tail -n 40 ;;
  real)
    # Real models (transformers, torchvision; random weights) exported to ONNX, checked against
    # onnxruntime and timed against torch eager and torch.compile, e.g.
    #   bash bench/gpu_session.sh real bert_base:1 gpt2:1
    # Pass BYOC_GIT_COMMIT=<the local HEAD> in the command: the copied tree's .git may be older.
    # A 10-minute command fits about two cases with every torch mode (max-autotune compiles
    # for minutes): TORCH_MODES=eager,default,reduce-overhead leaves it out. Rows of cases not
    # run now are kept from ${MERGE_FROM:-bench/results/real_models.json}: copy each call's
    # $OUT/real_models.json there before the next. BUDGET_S (default 540) stops starting cases
    # and torch modes in time for the results to come back. TORCH_PRECISION=float32 times torch
    # in float32 with TF32 allowed (beside CONFIGS=default, #44). Per-case kernel profiles go to
    # /tmp/byoc-real-profiles (all of them, merged rows too, in $OUT/real_models_profiles.txt).
    [ $# -eq 0 ] && set -- bert_base:1 gpt2:1
    merge_from="${MERGE_FROM:-bench/results/real_models.json}"
    merge=(); [ -f "$merge_from" ] && merge=(--merge-from "$merge_from")
    set -o pipefail
    PYTHONUNBUFFERED=1 python3 bench/real_models.py --out "$OUT" --workdir /tmp/byoc-real \
      --profile-dir /tmp/byoc-real-profiles --configs ${CONFIGS:-cuda_sm90} --exporter "${EXPORTER:-auto}" \
      --tuning-db "${TUNING_DB:-backends/cutlass/tuning_sm90.json}" --profile "${PROFILE:-false}" \
      --torch-modes "${TORCH_MODES:-eager,default,reduce-overhead,max-autotune-no-cudagraphs}" \
      --torch-precision "${TORCH_PRECISION:-float16}" \
      --budget-s "${BUDGET_S:-540}" --build-log "$OUT/build_progress.log" "${merge[@]}" --cases "$@" 2>&1 | tee "$OUT/real_models.log" | tail -n 40 ;;
  replay)
    # every run of a built model against onnxruntime, with and without CUDA graphs, e.g.
    #   bash bench/gpu_session.sh replay --case resnet50:32 --config default
    PYTHONUNBUFFERED=1 python3 bench/replay_check.py "$@" 2>&1 | tee "$OUT/replay_check.log" | grep -v Warning ;;
  replay_probe)
    # A library right on its first run and wrong on later ones (ResNet-50 b32 under `default`
    # was, until cuDNN's convs were fenced: bench/results/resnet50_default_later_runs_h200.md):
    # one cudnn-only library, then the same library run under each condition, and builds
    # with PDL off, a function per call site and without TF32; every step bounded, so that a
    # hang costs its step only. CUDA_MODULE_LOADING=EAGER before a probe makes its run 1 count.
    case="${1:-resnet50:32}"
    common=(--case "$case" --backends cudnn --graphs off --runs 3)
    : >"$OUT/replay_probe.log"  # this call's lines only (the library path is read from it)
    probe() {  # TITLE SECONDS COMMAND...
      local title="$1" seconds="$2"; shift 2
      echo "$(date +%T) $title"
      PYTHONUNBUFFERED=1 timeout "$seconds" "$@" 2>&1 | grep -v -i warn | grep -E "\]|=========" | grep -v exported \
        | cut -c1-240 | tee -a "$OUT/replay_probe.log"
    }
    probe "build" 150 python3 bench/replay_check.py "${common[@]}" --workdir /tmp/rp
    library=$(grep -o "built [^ ]*model.so" "$OUT/replay_probe.log" | head -n 1 | cut -d' ' -f2)
    [ -z "$library" ] && { echo "no library built"; exit 1; }
    run=(python3 bench/replay_check.py "${common[@]}" --workdir /tmp/rp --library "$library")
    sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    probe "CUDA_LAUNCH_BLOCKING=1" 60 env CUDA_LAUNCH_BLOCKING=1 "${run[@]}"
    probe "a fresh instance for every run" 60 "${run[@]}" --instances 4
    probe "memcheck, no padding" 120 "$sanitizer" --tool memcheck --print-limit 8 "${run[@]}"
    probe "PDL off (a build of its own)" 150 python3 bench/replay_check.py "${common[@]}" --workdir /tmp/rp-nopdl \
      --target "cuda -arch=sm_90 -pdl=0"
    probe "a plan and handle per conv call (a build of its own)" 150 python3 bench/replay_check.py \
      --case "$case" --backends '[{"cudnn": {"share_functions": false}}]' --graphs off --runs 3 --workdir /tmp/rp-unshared
    probe "no TF32 engines (a build of its own)" 150 python3 bench/replay_check.py \
      --case "$case" --backends '[{"cudnn": {"tf32": false}}]' --graphs off --runs 3 --workdir /tmp/rp-exact
    probe "racecheck" 150 "$sanitizer" --tool racecheck --print-limit 8 "${run[@]}" ;;
  measured)
    # partition: measured against the priority order (#43), e.g.
    #   bash bench/gpu_session.sh measured resnext50_32x4d:32 convnext_tiny:32
    # `real` with CONFIGS (default: the priority build and the measured one with cudnn among
    # the candidates) and no torch modes; each measured build's partition report (its choices
    # against their alternatives) comes back as $OUT/report_<case>_<config>.txt.
    CONFIGS="${CONFIGS:-cuda_sm90 cuda_sm90:measured_cudnn}" TORCH_MODES="${TORCH_MODES:-none}" \
      MERGE_FROM="${MERGE_FROM:-/nonexistent}" bash "$0" real "$@"
    for report in $(find /tmp/byoc-real -name partition_report.txt 2>/dev/null); do
      case "$report" in *measured*)
        name=$(echo "${report#/tmp/byoc-real/}" | sed 's|/partition_report.txt||; s|/|_|g')
        cp "$report" "$OUT/report_${name}.txt" ;;
      esac
    done ;;
  suite)
    # The whole table timed in one process: every case exported and built first
    # (real_models.py --prebuild), then one process checks and times each case with nothing
    # else running (its torch.compile modes compile cold there), e.g.
    #   bash bench/gpu_session.sh suite bert_base:1 bert_base:8 gpt2:1 vit_b16:8 resnet50:32
    # Environment as for `real` (CONFIGS, TORCH_MODES, MERGE_FROM, BYOC_GIT_COMMIT, EXPORTER:
    # auto, torchscript or dynamo; rows are kept per case and exporter asked for); BUDGET_S
    # counts from the start of this script, the prebuilds included.
    # The builds run one after another, sharing the object cache: they are CPU-bound (on
    # the H100 machine five cold builds side by side with 4 nvcc jobs each took 377 s, as
    # long as one after another). SUITE_PHASE=build only builds,
    # SUITE_PHASE=time only times what an earlier call on the same (still warm) machine
    # built (the libraries stay in build/byoc-real, ignored by git, which the device keeps
    # between calls); the default does both.
    [ $# -eq 0 ] && set -- bert_base:1 bert_base:8 gpt2:1 vit_b16:8 resnet50:32
    phase="${SUITE_PHASE:-both}"
    if [ "$phase" != time ]; then
      echo "$(date +%T) prebuild $# cases"
      for case in "$@"; do
        PYTHONUNBUFFERED=1 python3 bench/real_models.py --prebuild --workdir build/byoc-real --configs ${CONFIGS:-cuda_sm90} --exporter "${EXPORTER:-auto}" \
          --tuning-db "${TUNING_DB:-backends/cutlass/tuning_sm90.json}" --profile "${PROFILE:-false}" \
          --cases "$case" >>"$OUT/prebuild.log" 2>&1
        echo "$(date +%T) $(grep -h "$case .*built in\|$case .*FAILED" "$OUT/prebuild.log" | tail -n 1)"
      done
    fi
    [ "$phase" = build ] && exit 0
    merge_from="${MERGE_FROM:-bench/results/real_models.json}"
    merge=(); [ -f "$merge_from" ] && merge=(--merge-from "$merge_from")
    set -o pipefail
    PYTHONUNBUFFERED=1 python3 bench/real_models.py --prebuilt --out "$OUT" --workdir build/byoc-real \
      --profile-dir /tmp/byoc-real-profiles --configs ${CONFIGS:-cuda_sm90} --exporter "${EXPORTER:-auto}" \
      --tuning-db "${TUNING_DB:-backends/cutlass/tuning_sm90.json}" --profile "${PROFILE:-false}" \
      --torch-modes "${TORCH_MODES:-eager,default,reduce-overhead}" \
      --budget-s "$(( ${BUDGET_S:-560} - SECONDS ))" "${merge[@]}" --cases "$@" 2>&1 | tee "$OUT/real_models.log" | tail -n 40 ;;
  buckets)
    # One library with a program per batch size against a static library of each size
    # (bench/shape_buckets.py), the bucket library built with an empty object cache, e.g.
    #   bash bench/gpu_session.sh buckets bert_base:1,8 resnet50:1,32
    [ $# -eq 0 ] && set -- bert_base:1,8 resnet50:1,32
    rm -rf /tmp/byoc-buckets-cache /tmp/byoc-buckets
    # SWEEP=1 runs every batch up to the largest bucket (BETWEEN=5,20: static libraries of those too)
    BYOC_CACHE_DIR=/tmp/byoc-buckets-cache PYTHONUNBUFFERED=1 python3 bench/shape_buckets.py --out "$OUT" \
      --workdir /tmp/byoc-buckets ${SWEEP:+--sweep} ${BETWEEN:+--between "$BETWEEN"} ${FULL_SWEEP:+--full-sweep} \
      ${NO_STATIC:+--no-static} --cases "$@" 2>&1 \
      | tee "$OUT/shape_buckets.log" | tail -n 30 ;;
  corpus)
    # Corpus architectures at full size, each exported by both torch exporters, built for
    # cuda_sm90 (no tuning measurements) and run against onnxruntime; BUDGET_S (default 480)
    # stops starting cases. Pass BYOC_GIT_COMMIT=<the local HEAD>. SPEED=1 times each case
    # against torch too ($OUT/corpus_speed.md; the children take the host's GPUs in turn, e.g.
    # JOBS=8 on four GPUs: two cases a GPU, one of them timing at a time), e.g.
    #   SPEED=1 JOBS=8 MERGE_FROM=/nonexistent bash bench/gpu_session.sh corpus phi:dynamo densenet:dynamo
    PYTHONUNBUFFERED=1 python3 bench/corpus_gpu.py --out "$OUT" --budget-s "${BUDGET_S:-480}" --jobs "${JOBS:-4}" \
      --merge-from "${MERGE_FROM:-bench/results/corpus_gpu.json}" ${SPEED:+--speed} ${GPUS:+--gpus "$GPUS"} \
      ${@:+--cases "$@"} 2>&1 | grep -v Warning | tee "$OUT/corpus_gpu.log" | tail -n 40 ;;
  release)
    # The model cases the open issues need, with the kernels `gemm` tuned (bench/results/
    # tuning_sm90.json). Each part fits one 10-minute device command (measured on an H100:
    # part 1 about 6 minutes, part 2 about 6):
    #   bash bench/gpu_session.sh release 1; bash bench/gpu_session.sh release 2
    # then merge: part 2 passes --merge-from $OUT/models.json only within one call, so copy
    # part 1's models.json into bench/results/ before part 2 (run_models keeps its rows).
    part="${1:-1}"
    common=(--out "$OUT" --tuning-db "${TUNING_DB:-backends/cutlass/tuning_sm90.json}" --profile false
            --merge-from bench/results/models.json)
    if [ "$part" = 1 ]; then
      python3 bench/run_models.py "${common[@]}" --cases \
        mlp:1=cuda_sm90,cuda_sm90:update,cuda_sm90:nograph,cuda_sm90_cublaslt \
        bert_base:1=cuda_sm90,cuda_sm90:update,cuda_sm90_cublaslt,cuda_sm90:nograph \
        bert_base:8=cuda_sm90,cuda_sm90_cublaslt,cuda_sm90_builtin 2>&1 | tee "$OUT/run_models.log" | tail -n 30
    else
      python3 bench/run_models.py "${common[@]}" --cases \
        resnet50:32=cuda_sm90_builtin,cuda_sm90_builtin:graph,cuda_sm90 2>&1 | tee "$OUT/run_models.log" | tail -n 30
    fi ;;
esac
