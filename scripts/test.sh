#!/usr/bin/env bash
# The test command (README): installs sparseforge with its test, MPI and
# torch extras (MPICH's wheel where no MPI launcher is on PATH, for the
# 2-rank tests of tests/py/test_mpi.py; PyTorch from PyPI, about a minute
# the first time), builds the C library with its ctest suite, and runs
# ctest and pytest.  GPU tests run where a GPU answers and are skipped with
# the reason elsewhere.
set -euo pipefail
cd "$(dirname "$0")/.."
mpi_runtime=()
command -v mpiexec >/dev/null || mpi_runtime=(mpich)
python3 -m pip install -q --disable-pip-version-check '.[test,mpi,torch]' "${mpi_runtime[@]}"
cmake -S . -B build/test -DCMAKE_BUILD_TYPE=RelWithDebInfo ${SF_CMAKE_ARGS:-} >/dev/null
cmake --build build/test -j "$(nproc)"
ctest --test-dir build/test --output-on-failure
# Test the installed package (sparseforge/lib/libsparseforge.so) from outside
# the checkout, so that what pip installed is what runs.
export SPARSEFORGE_LIB="$(cd / && python3 -c 'import sparseforge, pathlib; print(pathlib.Path(sparseforge.__file__).parent / "lib" / "libsparseforge.so")')"
python3 -m pytest -rs tests/py "$@"
