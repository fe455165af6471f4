#!/usr/bin/env bash
# The whole GPU run in one call: the test suite on the GPU (no simulator), then the model
# checks and benchmarks. Results go under $OUT (or ./gpu-results). Usage on the GPU machine:
#   bash benchmarks/gpu_run.sh [pytest args...]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-gpu-results}"; mkdir -p "$OUT"
# Installed packages live outside the work tree, so that a later call to the same warm machine
# finds them without carrying them again (its copy of the tree keeps no carried folder).
SITE="${PLUGRT_GPU_SITE:-$HOME/.cache/plugrt-site}"
mkdir -p "$SITE" 2>/dev/null || SITE="$PWD/.site"
if [ -d .whl ]; then  # numba-cuda needs numpy < 2.5; carried as a wheel
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$SITE" .whl/*.whl
fi
[ -n "$(ls -A "$SITE" 2>/dev/null)" ] && export PYTHONPATH="$SITE"
if ls -d .carry[0-9]* >/dev/null 2>&1; then  # wheels too large for one call (Ray, pytriton): benchmarks/carry.py
  # A call that carries a part before the last runs the rest of the script without them.
  # Wheels are installed; a .tar.xz is a site folder installed here beforehand (smaller: xz,
  # and what serving does not need left out), unpacked as it is.
  if [ -e "$SITE/.unpacked" ] || python3 benchmarks/carry.py join .carry .carried; then
    export PYTHONPATH="$SITE"
    [ -e "$SITE/.unpacked" ] || for t in .carried/*.tar.xz; do [ -e "$t" ] && tar -xJf "$t" -C "$SITE"; done
    if ls .carried/*.whl >/dev/null 2>&1 && [ ! -e "$SITE/.unpacked" ]; then
      python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$SITE" .carried/*.whl
    fi
    touch "$SITE/.unpacked"
  fi
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . $(printf -- "-e %s " contrib_plugins/*/) \
  >"$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
export NUMBA_ENABLE_CUDASIM=0 PYTHONUNBUFFERED=1
# One kernel cache for the benchmarks' builds, kept between GPU calls: carried in as .kcache1..
# (an earlier call's $OUT/kcache1..), handed back the same way at the end (PLUGRT_GPU_KEEP_CACHE=0:
# not). A warm cache turns a 5-minute ResNet-50 build into seconds.
export PLUGRT_BENCH_KERNEL_CACHE="$PWD/.kcache"
mkdir -p .kcache
python3 benchmarks/carry.py join .kcache .kcache optional
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
TESTS="${PLUGRT_GPU_TESTS:-tests $(ls -d contrib_plugins/*/tests)}"
if [ "$TESTS" != "none" ]; then
  # -v: one line per test as it ends, so a run cut short by the timeout still names its failures.
  timeout "${PLUGRT_GPU_TEST_TIMEOUT:-330}" python3 -m pytest -v -p no:cacheprovider -n 16 --maxfail=400 \
    --junitxml="$OUT/junit.xml" $TESTS "$@" >"$OUT/pytest.log" 2>&1
  echo "pytest exit $?"; grep -E "^(FAILED|ERROR)|(FAILED|ERROR) (tests|contrib)" "$OUT/pytest.log" | cut -c1-220 | sort -u | head -80
  tail -3 "$OUT/pytest.log"
fi
if [ "${PLUGRT_GPU_BENCH:-1}" = "1" ]; then
  timeout "${PLUGRT_GPU_BENCH_TIMEOUT:-400}" python3 benchmarks/gpu_run.py --out "$OUT" --parts "${PLUGRT_GPU_PARTS:-chain,gemm,conv,attention,pool,tuning,models}" 2>&1 | tail -60
fi
if [ "${PLUGRT_GPU_INT8_GEMM:-1}" = "1" ]; then  # INT8 GEMM 4096^3 (MatMulInteger on wgmma) beside our FP16 GEMM, cuBLAS FP16, torch._int_mm
  timeout "${PLUGRT_GPU_INT8_GEMM_TIMEOUT:-300}" python3 benchmarks/int8_gemm_bench.py --out "$OUT" ${PLUGRT_INT8_GEMM_ARGS:-} 2>&1 | tail -30
fi
if [ "${PLUGRT_GPU_RUNTIME:-1}" = "1" ]; then  # issue 15's runtime figures (several minutes: builds, torch.compile)
  timeout "${PLUGRT_GPU_RUNTIME_TIMEOUT:-540}" python3 benchmarks/runtime_bench.py --out "$OUT" ${PLUGRT_RUNTIME_ARGS:-} 2>&1 | tail -60
fi
if [ "${PLUGRT_GPU_ZOO:-1}" = "1" ]; then  # issue 17's model zoo (torchvision and HF families, FP32 against PyTorch)
  timeout "${PLUGRT_GPU_ZOO_TIMEOUT:-540}" python3 benchmarks/zoo_bench.py --out "$OUT" ${PLUGRT_ZOO_ARGS:-} 2>&1 | tail -60
fi
if [ "${PLUGRT_GPU_FP16:-1}" = "1" ]; then  # issue 16's model figures (FP16 and TF32 builds beside torch.compile)
  timeout "${PLUGRT_GPU_FP16_TIMEOUT:-540}" python3 benchmarks/fp16_bench.py --out "$OUT" ${PLUGRT_FP16_ARGS:-} 2>&1 | tail -40
fi
if [ "${PLUGRT_GPU_DYNAMIC:-1}" = "1" ]; then  # issue 19's figures (BERT-base seq 1..512: first request vs steady)
  timeout "${PLUGRT_GPU_DYNAMIC_TIMEOUT:-540}" python3 benchmarks/dynamic_bench.py --out "$OUT" ${PLUGRT_DYNAMIC_ARGS:-} 2>&1 | tail -20
fi
if [ "${PLUGRT_GPU_SERVING:-0}" = "1" ]; then  # issue 20's figures (ResNet-50 FP16 behind Triton and Ray Serve)
  timeout "${PLUGRT_GPU_SERVING_TIMEOUT:-540}" python3 benchmarks/serving_bench.py --out "$OUT" ${PLUGRT_SERVING_ARGS:-} 2>&1 | tail -20
fi
if [ "${PLUGRT_GPU_INT8:-1}" = "1" ]; then  # issue 18's model figures (digits accuracy, ResNet-50/BERT INT8 beside FP16)
  timeout "${PLUGRT_GPU_INT8_TIMEOUT:-540}" python3 benchmarks/int8_bench.py --out "$OUT" ${PLUGRT_INT8_ARGS:-} 2>&1 | tail -40
fi
if [ "${PLUGRT_GPU_KEEP_CACHE:-1}" = "1" ] && [ -n "$(ls .kcache)" ]; then  # back through $OUT: 15 MB parts
  python3 benchmarks/carry.py split .kcache "$OUT/kcache" 15 xz
fi
