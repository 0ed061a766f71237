#!/usr/bin/env bash
# One call on the GPU machine: build, GPU tests, the README's main command
# (twice: the second must compile nothing), the deployment bundle (a small
# model tuned, exported, built with examples/deploy, every layer checked,
# the opens timed), compute-sanitizer, and the S1 benchmark; a short table
# last.  Stages: tests tune deploy sanitize bench (the default).  `claim`
# measures the budgeted strategy; `model` tunes the BERT-base-sized model
# (bench/tune_model.py, ~30 min for its two prunings); `gpus` runs the main
# job on every GPU (--gpus all); `scale` measures several GPUs and MPI
# (bench/scale.py); `nm24` runs the 2:4 GPU tests and
# bench/nm24.py (NM24_ARGS, e.g. --suites s2 or --configs for a probe);
# `csr` runs the unstructured family's GPU tests and bench/csr.py
# (CSR_ARGS, e.g. --suites decode --densities 0.1 --no-bf16: the whole
# decode suite takes longer than one 10-minute call); `torch` runs
# sparseforge.torch's GPU tests, its own kernels under compute-sanitizer
# (bench/sanitize_torch_ops.py) and bench/torch_models.py from an empty
# database (TORCH_ARGS; by default the fused Llama-style stack's decode,
# 2 layers, shflbw:64 at 75%, eager and compiled, the compiled kernels
# split by torch.profiler: about 4 minutes).
# The GPU machine lacks sqlite3.h: carry
# .gpu/ (holding it) along.
#   bash bench/gpu_check.sh tests tune
set -uo pipefail
cd "$(dirname "$0")/.."
STAGES="${*:-tests tune deploy sanitize bench}"
OUT="${OUT:-/tmp/sf-out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
SQLITE_LIB=$(ls /usr/lib/x86_64-linux-gnu/libsqlite3.so.0* 2>/dev/null | head -1)
SQLITE_INC=$([ -f /usr/include/sqlite3.h ] && echo /usr/include || echo "$PWD/.gpu/include")
summary=()
step() { local name=$1; shift; local t0=$SECONDS
  if "$@" >"$OUT/$name.log" 2>&1; then summary+=("$name: ok ($((SECONDS - t0)) s)")
  else summary+=("$name: FAILED ($((SECONDS - t0)) s; see $name.log)"); tail -40 "$OUT/$name.log"; fi
  echo "[${SECONDS} s] ${summary[-1]}"; }  # as it happens: a call cut short still tells where

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
step build bash -c "cmake -S . -B build/gpu -DCMAKE_BUILD_TYPE=Release -DSQLITE3_INCLUDE_DIR=$SQLITE_INC -DSQLITE3_LIBRARY=$SQLITE_LIB && cmake --build build/gpu -j 16"
export SPARSEFORGE_LIB=$PWD/build/gpu/libsparseforge.so
# the package, as a user installs it (no network there: no build isolation)
rm -rf /tmp/sfpkg build/lib build/bdist*
step install bash -c "SF_CMAKE_ARGS='-DSQLITE3_INCLUDE_DIR=$SQLITE_INC -DSQLITE3_LIBRARY=$SQLITE_LIB' python3 -m pip install -q --no-build-isolation --no-deps --target /tmp/sfpkg . && test -x /tmp/sfpkg/bin/sparseforge"
export PYTHONPATH=/tmp/sfpkg PATH=/tmp/sfpkg/bin:$PATH
case " $STAGES " in *" tests "*)
  step ctest ctest --test-dir build/gpu --output-on-failure
  [ -d .gpu/dlmc ] && export SPARSEFORGE_DLMC=$PWD/.gpu/dlmc
  step pytest_gpu python3 -m pytest -q -rs -m gpu tests/py -p no:cacheprovider --durations=8 -n 8
  grep -E "passed|failed" "$OUT/pytest_gpu.log" | tail -1
  # every configuration of every space through NVRTC's front end (CI checks a sample a day)
  step space env SF_FULL_SPACE=1 python3 -m pytest -q tests/py/test_space.py -p no:cacheprovider
  grep -E "passed|failed" "$OUT/space.log" | tail -1 ;; esac
case " $STAGES " in *" tune "*)
  export XDG_CACHE_HOME=/tmp/sf-xdg; rm -rf "$XDG_CACHE_HOME"
  step tune_first sparseforge tune examples/llama_block.toml --profile
  step tune_second sparseforge tune examples/llama_block.toml
  tail -24 "$OUT/tune_first.log"; grep -E "compiled in this run|^time " "$OUT/tune_second.log"
  step cache_ls sparseforge cache ls ;; esac
case " $STAGES " in *" deploy "*)
  DB=/tmp/sf-deploy.db; rm -rf /tmp/sf-bundle /tmp/sf-deploy "$DB"
  step deploy_tune sparseforge tune examples/tiny_model.npz --db "$DB" --n 16,256 --budget 4 --quick
  step export sparseforge export "$DB" -o /tmp/sf-bundle --vectors examples/tiny_model.npz --weights file
  step deploy_build bash -c "cmake -S examples/deploy -B /tmp/sf-deploy -DSF_BUNDLE_DIR=/tmp/sf-bundle && cmake --build /tmp/sf-deploy -j 16"
  step deploy_check /tmp/sf-deploy/deploy_check /tmp/sf-bundle/vectors /tmp/sf-bundle/sfmodel.weights
  step open_time python3 bench/open_time.py --db "$DB" --breakdown
  ldd /tmp/sf-deploy/deploy_check; cat "$OUT/deploy_check.log" "$OUT/open_time.log" ;; esac
case " $STAGES " in *" gpus "*)
  step tune_gpus sparseforge tune examples/llama_block.toml --gpus all --db /tmp/sf-gpus.db
  tail -4 "$OUT/tune_gpus.log" ;; esac
case " $STAGES " in *" scale "*)
  # several GPUs (bench/scale.py, ~16 min on 2 H100s: longer than one call,
  # so start it with bench/gpu_background.sh); mpi4py and MPICH from
  # wheels carried in .whl/ (bench/gpu_wheels.sh) where the machine lacks them
  python3 -c "import mpi4py" 2>/dev/null || [ ! -d .whl ] || \
    python3 -m pip install -q --no-index --no-deps --no-compile .whl/*.whl
  step scale python3 bench/scale.py --work /tmp/sf-scale ${SCALE_ARGS:-} --results "$OUT/SCALE.md"
  mkdir -p "$OUT/scale-logs"; cp /tmp/sf-scale/*.log "$OUT/scale-logs/" 2>/dev/null
  cat "$OUT/SCALE.md" 2>/dev/null ;; esac
case " $STAGES " in *" model "*)
  step model python3 bench/tune_model.py --db-dir /tmp/sf-model ${MODEL_ARGS:-} --results "$OUT/MODEL.md"
  cat "$OUT/MODEL.md" 2>/dev/null ;; esac
case " $STAGES " in *" nm24 "*)
  step nm24_tests python3 -m pytest -q -rs -p no:cacheprovider tests/py/test_family_nm24.py tests/py/test_peer_sparselt.py -m gpu ${NM24_TEST_ARGS:-}
  grep -E "passed|failed" "$OUT/nm24_tests.log" | tail -1
  step nm24_bench python3 bench/nm24.py --db /tmp/sf-nm24.db ${NM24_ARGS:-} --results "$OUT/NM24.md"
  grep -E "^  s[12] " "$OUT/nm24_bench.log" | tail -60; cat "$OUT/NM24.md" 2>/dev/null ;; esac
case " $STAGES " in *" csr "*)
  step csr_tests python3 -m pytest -q -rs -p no:cacheprovider -n 8 -m gpu tests/py/test_family_csr_tc.py tests/py/test_family_csr_split24.py tests/py/test_family_csr.py ${CSR_TEST_ARGS:-}
  grep -E "passed|failed" "$OUT/csr_tests.log" | tail -1
  step csr_bench python3 bench/csr.py --db /tmp/sf-csr.db ${CSR_ARGS:-} --results "$OUT/CSR.md"
  grep -E "^  (decode|prefill|dlmc) " "$OUT/csr_bench.log" | tail -60; cat "$OUT/CSR.md" 2>/dev/null ;; esac
case " $STAGES " in *" torch "*)
  step torch_tests python3 -m pytest -q -rs -p no:cacheprovider -m gpu tests/py/test_torch_gpu.py ${TORCH_TEST_ARGS:-}
  grep -E "passed|failed" "$OUT/torch_tests.log" | tail -1
  # the module's own kernels (transposes, rms_norm_t) under the sanitizers
  step torch_memcheck compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 python3 bench/sanitize_torch_ops.py
  step torch_racecheck compute-sanitizer --tool racecheck --error-exitcode 9 python3 bench/sanitize_torch_ops.py
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY| wrong" "$OUT/torch_memcheck.log" "$OUT/torch_racecheck.log"
  rm -f /tmp/sf-torch.db
  step torch_models python3 bench/torch_models.py --db /tmp/sf-torch.db --quiet \
    ${TORCH_ARGS:---model llama-fused --layers 2 --patterns shflbw:64@0.75 --phases decode --compile --kernels --budget 4 --quick} \
    --results "$OUT/TORCH.md"
  cat "$OUT/TORCH.md" 2>/dev/null ;; esac
case " $STAGES " in *" sanitize "*)
  # API errors not reported: the runtime probes each module for its optional sf_x_map
  # and sf_pdl (cuModuleGetGlobal answers CUDA_ERROR_NOT_FOUND where there is none, by
  # design)
  step memcheck compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 python3 bench/sanitize.py
  step racecheck compute-sanitizer --tool racecheck --error-exitcode 9 python3 bench/sanitize.py --small
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/memcheck.log" "$OUT/racecheck.log" ;; esac
case " $STAGES " in *" bench "*)
  step s1 python3 bench/s1.py --db /tmp/sf-s1.db ${S1_ARGS:-} --results "$OUT/RESULTS.md"
  cat "$OUT/RESULTS.md" 2>/dev/null ;; esac
case " $STAGES " in *" claim "*)
  step claim python3 bench/strategy_claim.py --db /tmp/sf-claim.db ${CLAIM_ARGS:-} --results "$OUT/CLAIM.md"
  cat "$OUT/CLAIM.md" 2>/dev/null ;; esac
printf '%s\n' "${summary[@]}"
