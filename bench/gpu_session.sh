#!/usr/bin/env bash
# What one call on the lent GPU machine runs (no internet there): install the wheels carried
# in .whl/ (see README "Benchmarks"), then run a stage and leave logs and results in $OUT.
#   bench/gpu_session.sh tests    GPU tests of every file that has them, files in parallel
#   bench/gpu_session.sh gemm     bench/bench_gemm.py (CUTLASS tuned, cuBLASLt engine, cuBLAS)
#   bench/gpu_session.sh models CASES...   bench/run_models.py over the shipped CUDA configs
#   bench/gpu_session.sh release  the model cases the open issues ask for (after gemm and tests)
#   bench/gpu_session.sh setup    only the set-up (then export PYTHONPATH=$PWD and CUTLASS_PATH as below)
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/byoc-out}"
mkdir -p "$OUT"
for package in jinja2 pyyaml ninja ml_dtypes; do  # one at a time: one that cannot install must not stop the rest
  python3 -c "import ${package/pyyaml/yaml}" 2>/dev/null || pip install --no-index --find-links .whl "$package" >>"$OUT/pip.log" 2>&1
done
# CUTLASS's headers straight from the wheel (byoc finds them through CUTLASS_PATH).
python3 -m zipfile -e .whl/nvidia_cutlass-*.whl /tmp/nvidia-cutlass >>"$OUT/pip.log" 2>&1
export CUTLASS_PATH=/tmp/nvidia-cutlass/cutlass_library/source
# byoc itself from the checkout (an editable install needs a build backend the machine may lack).
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >"$OUT/gpu.txt"
stage="${1:-tests}"; shift || true
case "$stage" in
  tests)
    files=("$@"); [ ${#files[@]} -eq 0 ] && files=(tests/test_build_cuda.py tests/test_cutlass.py tests/test_json_engine.py tests/test_shim_cuda.py tests/test_builtin_codegen.py tests/test_plan_devices.py)
    pids=()
    for f in "${files[@]}"; do
      name=$(basename "$f" .py)
      python3 -m pytest -q -m gpu -p no:cacheprovider "$f" >"$OUT/$name.log" 2>&1 &
      pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p"; done
    tail -n 3 "$OUT"/test_*.log ;;
  gemm)
    python3 bench/bench_gemm.py --out "$OUT" --workdir /tmp/byoc-gemm --tuning-db "$OUT/tuning_sm90.json" "$@" 2>&1 | tee "$OUT/bench_gemm.log" | tail -n 30 ;;
  models)
    python3 bench/run_models.py --out "$OUT" --configs cuda_sm90_builtin cuda_sm90 cuda_sm90:nograph cuda_sm90_cublaslt \
      ${TUNING_DB:+--tuning-db "$TUNING_DB"} ${PROFILE:+--profile "$PROFILE"} --cases "$@" 2>&1 \
      | tee "$OUT/run_models.log" | tail -n 40 ;;
  release)
    # The model cases the open issues need, with the kernels `gemm` just tuned (its
    # $OUT/tuning_sm90.json, carried back into bench/results/ between calls). A device
    # command may run 10 minutes, so a session makes three calls:
    #   bash bench/gpu_session.sh gemm; bash bench/gpu_session.sh tests; bash bench/gpu_session.sh release
    TUNING_DB="${TUNING_DB:-bench/results/tuning_sm90.json}" PROFILE=false bash "$0" models \
      mlp:1=cuda_sm90,cuda_sm90:update,cuda_sm90:nograph,cuda_sm90_cublaslt \
      bert_base:1=cuda_sm90,cuda_sm90:update,cuda_sm90_cublaslt,cuda_sm90:nograph \
      bert_base:8=cuda_sm90,cuda_sm90_cublaslt,cuda_sm90_builtin resnet50:32=cuda_sm90_builtin,cuda_sm90 ;;
esac
