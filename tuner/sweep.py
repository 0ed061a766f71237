"""Research sweeps: families x densities x shapes x N, described by a small
TOML spec; every trial goes into the cache.

    # bench/sweeps/small.toml
    families  = ["shflbw:64", "bsr:32x32", "nm24", "csr"]
    densities = [0.25, 0.10]          # nm24 is always 0.5
    shapes    = [[1024, 1024]]        # M, K
    n         = [256]
    dtype     = "fp16"                # each family computes in the dtype it takes (csr: fp32)
    seed      = 0                     # of the random patterns and values
    activation = "none"
"""
from __future__ import annotations

from ..generator.families import family_of
from ..generator.kernel import Epilogue, Operation

SPEC_KEYS = {"families", "densities", "shapes", "n", "dtype", "seed", "activation", "layout"}


def load_spec(path: str) -> dict:
    from ..generator.recipe import no_unknown_keys, read_toml
    spec = read_toml(path, "sweep spec")
    no_unknown_keys(spec, SPEC_KEYS, path)
    for key in ("families", "shapes", "n"):
        if key not in spec:
            raise ValueError(f"{path}: missing '{key}'")
    for fam in spec["families"]:
        family_of(fam)
    for shape in spec["shapes"]:
        if len(shape) != 2 or min(shape) < 1:
            raise ValueError(f"{path}: a shape is [M, K] with positive sizes, got {shape}")
    spec.setdefault("densities", [0.25, 0.1])
    spec.setdefault("dtype", "fp16")
    spec.setdefault("seed", 0)
    spec.setdefault("activation", "none")
    spec.setdefault("layout", "fm")
    return spec


def sweep_entries(spec: dict) -> list:
    """Every point of the sweep as a tuning entry (tuner/model.py), its
    matrix made when it is tuned: a random pattern of the family
    (generator.synth) with standard normal values."""
    from .model import Entry
    entries = []
    for m, k in spec["shapes"]:
        for pattern in spec["families"]:
            fam, params = family_of(pattern)
            dtype = fam.dtype_for(spec["dtype"])
            op = Operation(dtype, spec["layout"], Epilogue(activation=spec["activation"]))
            for d in fam.densities(params, spec["densities"]):
                name = f"sweep/{pattern}/d{d:g}/{m}x{k}"
                entries.append(Entry(len(entries), name, pattern=pattern, op=op,
                                     key=(name,), cost=float(m * k * d),
                                     make=_maker(pattern, m, k, d, dtype, spec["seed"])))
    return entries


def _maker(pattern, m, k, d, dtype, seed):
    def make():
        from ..generator.synth import random_matrix
        return random_matrix(pattern, m, k, d, dtype, seed=seed)
    return make


def sweep_matrices(spec: dict):
    """(layer name, pattern, matrix) for every point of the sweep."""
    for e in sweep_entries(spec):
        yield e.name, e.pattern, e.get_matrix()


def run_sweep(spec: dict, tuner, log=None, entries=None):
    """Tunes the sweep's points (`entries`: a share of them); their rows."""
    from .model import tune_entries
    return tune_entries(sweep_entries(spec) if entries is None else entries, tuner, spec["n"],
                        log=log)
