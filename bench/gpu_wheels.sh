#!/usr/bin/env bash
# The Python packages the GPU machine lacks for the `scale` stage (mpi4py
# and MPICH's runtime), downloaded here as wheels for its Python (3.12,
# x86-64) into .whl/ (git-ignored; carry it along with .gpu/).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl \
  "mpi4py>=4" mpich
ls .whl
