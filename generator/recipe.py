"""Model recipes: a pruned model described by a small TOML file (shapes,
the family each layer is pruned to, a seed) instead of its weights, made
when it is first used.

    # examples/llama_block.toml
    seed  = 0               # of the weights (and of pruning's tie-breaks)
    dtype = "fp16"
    [[layer]]
    name = "attn.q_proj.weight"
    shape = [4096, 4096]    # rows, cols
    pattern = "shflbw:64"   # any family's pattern; left out: the layer stays dense
    sparsity = 0.75         # fraction removed (a fixed-density pattern keeps its own)

`repeat = 12` makes twelve blocks of the layers listed, named
`layers.<i>.<name>`.  Each layer's weights are standard normal draws from
numpy's default_rng([seed, its index]), pruned with
generator.prune.prune and rounded to `dtype`.

Pruning a large model takes a while (Shfl-BW's permutation search), so the
first use keeps what pruning decided -- each layer's mask of stored
entries, as bits, and its row permutation -- in the user's cache folder
(`<cache folder>/models/<recipe name>-<hash of the recipe>.npz`, a few MB
for a Llama block); later uses draw the weights again and apply them,
which takes seconds.  A kept file that no longer reproduces the layers it
records (their fingerprints) is made again.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from .matrix import DTYPES, SparseMatrix
from .workers import in_order

RECIPE_KEYS = {"seed", "dtype", "repeat", "layer"}
LAYER_KEYS = {"name", "shape", "pattern", "sparsity"}
# fingerprints of the matrices made from a kept file, bumped when making
# them changes meaning
KEPT_VERSION = 1


@dataclass
class LayerSpec:
    index: int
    name: str
    rows: int
    cols: int
    pattern: Optional[str]     # None: dense
    sparsity: Optional[float]


def is_recipe(path) -> bool:
    return str(path).endswith(".toml")


def read_toml(path, what: str) -> dict:
    """The TOML file at `path` (`what` it should be, for the errors:
    "model recipe", "sweep spec"); ValueError naming the file."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not a valid TOML {what}: {e}") from None
    except IsADirectoryError:
        raise ValueError(f"{path}: is a directory, not a {what}") from None
    except OSError as e:
        raise ValueError(f"{path}: cannot read it: {e.strerror}") from None


def no_unknown_keys(table: dict, allowed: set, where: str) -> None:
    unknown = set(table) - allowed
    if unknown:
        raise ValueError(f"{where}: unknown keys {sorted(unknown)}; allowed: {sorted(allowed)}")


def read(path) -> dict:
    """The recipe at `path`, checked: ValueError naming the file and the
    problem."""
    recipe = read_toml(path, "model recipe")
    check(recipe, str(path))
    return recipe


def check(recipe: dict, where: str) -> None:
    """ValueError (starting with `where`) for anything a recipe must not be."""
    if "families" in recipe or "shapes" in recipe:
        raise ValueError(f"{where}: is a sweep spec (run `sparseforge sweep {where}`), not a "
                         "model recipe")
    no_unknown_keys(recipe, RECIPE_KEYS, where)
    layers = recipe.get("layer")
    if not isinstance(layers, list) or not layers:
        raise ValueError(f"{where}: no [[layer]] tables")
    if recipe.get("dtype", "fp16") not in DTYPES:
        raise ValueError(f"{where}: dtype must be one of {', '.join(DTYPES)}, got "
                         f"{recipe.get('dtype')!r}")
    for key in ("seed", "repeat"):
        v = recipe.get(key, 0 if key == "seed" else 1)
        if isinstance(v, bool) or not isinstance(v, int) or v < (0 if key == "seed" else 1):
            raise ValueError(f"{where}: {key} must be a whole number"
                             f"{' >= 0' if key == 'seed' else ' >= 1'}, got {v!r}")
    from .io import element_limit
    limit, why = element_limit()
    names = set()
    for i, layer in enumerate(layers):
        what = f"{where}: layer {i + 1}"
        if not isinstance(layer, dict):
            raise ValueError(f"{what} is not a table")
        no_unknown_keys(layer, LAYER_KEYS, what)
        name = layer.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"{what}: needs a name")
        if name in names:
            raise ValueError(f"{what}: the name {name!r} is used twice")
        names.add(name)
        what = f"{where}: layer {name!r}"
        shape = layer.get("shape")
        if (not isinstance(shape, list) or len(shape) != 2
                or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in shape)):
            raise ValueError(f"{what}: shape is [rows, cols], positive whole numbers; "
                             f"got {shape!r}")
        if shape[0] * shape[1] > limit:
            raise ValueError(f"{what}: {shape[0]} x {shape[1]} exceeds the limit of {limit} "
                             f"elements per matrix ({why})")
        _check_pruning(layer, what)


def _check_pruning(layer: dict, what: str) -> None:
    pattern, sparsity = layer.get("pattern"), layer.get("sparsity")
    if pattern is None:
        if sparsity is not None:
            raise ValueError(f"{what}: sparsity without a pattern")
        return
    from .families import family_of
    try:
        fam, params = family_of(pattern)
    except ValueError as e:
        raise ValueError(f"{what}: {e}") from None
    fixed = fam.densities(params, [None])
    if sparsity is None and fixed == [None]:
        raise ValueError(f"{what}: {pattern} needs a sparsity (the fraction removed)")
    if sparsity is not None and (isinstance(sparsity, bool) or not isinstance(sparsity, (int, float))
                                 or not 0.0 <= sparsity < 1.0):
        raise ValueError(f"{what}: sparsity is a fraction from 0 to below 1, got {sparsity!r}")


def layers(recipe: dict) -> list[LayerSpec]:
    """Every layer the recipe makes, repeats expanded, in order."""
    repeat = recipe.get("repeat", 1)
    out = []
    for i in range(repeat):
        for layer in recipe["layer"]:
            name = layer["name"] if repeat == 1 else f"layers.{i}.{layer['name']}"
            out.append(LayerSpec(len(out), name, layer["shape"][0], layer["shape"][1],
                                 layer.get("pattern"), layer.get("sparsity")))
    return out


def _sparsity(spec: LayerSpec) -> float:
    from .families import family_of
    if spec.sparsity is not None:
        return float(spec.sparsity)
    fam, params = family_of(spec.pattern)
    return 1.0 - float(fam.densities(params, [None])[0])


def weights(recipe: dict, spec: LayerSpec) -> np.ndarray:
    """The layer's dense float32 weights: standard normal, seeded by the
    recipe's seed and the layer's index."""
    rng = np.random.default_rng([recipe.get("seed", 0), spec.index])
    return rng.standard_normal((spec.rows, spec.cols), dtype=np.float32)


def make_layer(recipe: dict, spec: LayerSpec) -> tuple[SparseMatrix, Optional[np.ndarray]]:
    """(matrix, mask of stored entries or None for a dense layer), made
    from scratch: drawn and pruned."""
    from .prune import prune
    dtype = recipe.get("dtype", "fp16")
    w = weights(recipe, spec)
    if spec.pattern is None:
        return SparseMatrix.from_dense(w, dtype=dtype), None
    m, _ = prune(w, spec.pattern, _sparsity(spec), seed=recipe.get("seed", 0), dtype=dtype)
    return m, m.mask()


def from_kept(recipe: dict, spec: LayerSpec, mask: np.ndarray,
              perm: Optional[np.ndarray]) -> SparseMatrix:
    """The layer made from a kept mask and permutation (no pruning)."""
    from .prune import from_mask
    return from_mask(weights(recipe, spec), mask, recipe.get("dtype", "fp16"), perm=perm)


def digest(recipe: dict) -> str:
    """A hash of what the recipe makes (its content, not its file)."""
    text = json.dumps({"v": KEPT_VERSION, "recipe": recipe}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def kept_path(path, recipe: dict) -> Path:
    """Where the pruning decisions of the recipe at `path` are kept."""
    from ..cache import default_path
    return default_path().parent / "models" / f"{Path(path).stem}-{digest(recipe)}.npz"


def load(path, name: Optional[str] = None, dtype: Optional[str] = None,
         log=None) -> list[tuple[str, SparseMatrix]]:
    """The recipe's layers as (name, matrix), or the one named `name`;
    values rounded to `dtype` where given.  Prunes on first use (and says
    so, on `log`: stderr by default), then reads the kept decisions."""
    log = log or sys.stderr
    recipe = read(path)
    specs = layers(recipe)
    if name is not None:
        specs = [s for s in specs if s.name == name]
        if not specs:
            listed = ", ".join(s.name for s in layers(recipe)[:12])
            raise ValueError(f"{path}: no layer named {name!r}; it makes {listed}")
    kept = kept_path(path, recipe)
    mats = _from_kept_file(recipe, specs, kept)
    if mats is None:
        mats = _make_and_keep(recipe, specs, kept, path, log)
    out = []
    for spec, m in zip(specs, mats):
        m.name = spec.name
        out.append((spec.name, m.astype(dtype) if dtype and dtype != m.dtype else m))
    return out


def _from_kept_file(recipe, specs, kept: Path) -> Optional[list[SparseMatrix]]:
    """The layers from the kept file, or None where it is missing, lacks a
    layer or no longer reproduces one."""
    if not kept.exists():
        return None
    try:
        with np.load(kept, allow_pickle=False) as z:
            out = []
            for spec in specs:
                if spec.pattern is None:
                    out.append(make_layer(recipe, spec)[0])
                    continue
                key = str(spec.index)
                bits = z[f"{key}.mask"]
                mask = np.unpackbits(bits, count=spec.rows * spec.cols).astype(bool)
                perm = z[f"{key}.perm"] if f"{key}.perm" in z else None
                m = from_kept(recipe, spec, mask.reshape(spec.rows, spec.cols), perm)
                if m.fingerprint() != str(z[f"{key}.fp"]):
                    return None
                out.append(m)
            return out
    except (OSError, KeyError, ValueError):
        return None


def _make_and_keep(recipe, specs, kept: Path, path, log) -> list[SparseMatrix]:
    """Draws and prunes every layer of the recipe (saying so), keeps the
    decisions of all of them, and returns those of `specs`."""
    every = layers(recipe)
    print(f"making the model of {path} (seed {recipe.get('seed', 0)}): drawing and pruning "
          f"{len(every)} layers; kept in {kept} for later runs", file=log)
    t0 = time.monotonic()
    arrays, made = {}, {}
    for spec, (m, bits) in zip(every, _made_in_parallel(recipe, every)):
        made[spec.index] = m
        if bits is not None:
            key = str(spec.index)
            arrays[f"{key}.mask"] = bits
            arrays[f"{key}.fp"] = np.array(m.fingerprint())
            if m.perm is not None:
                arrays[f"{key}.perm"] = m.perm
        print(f"  {spec.name}: {spec.rows}x{spec.cols} "
              f"{spec.pattern or 'dense'}{'' if spec.pattern is None else f' density {m.density:.3f}'}",
              file=log)
    _write_atomically(kept, arrays)
    print(f"made in {time.monotonic() - t0:.1f} s", file=log)
    return [made[s.index] for s in specs]


def _make_one(recipe: dict, spec: LayerSpec) -> tuple[SparseMatrix, Optional[np.ndarray]]:
    """make_layer, its mask packed to bits (what crosses back from a
    process of the pool: an eighth of the bytes)."""
    m, mask = make_layer(recipe, spec)
    return m, None if mask is None else np.packbits(mask.ravel())


def _made_in_parallel(recipe: dict, specs: list[LayerSpec]):
    """_make_one of every layer, in order, the layers spread over a pool
    of processes (one per core at most: drawing and pruning is numpy on
    one core, and a Llama block's seven layers took 21 s one by one); one
    by one where there is one layer or processes cannot be started."""
    from functools import partial
    return in_order(partial(_make_one, recipe), specs, min(len(specs), os.cpu_count() or 1),
                    died="a worker process died while drawing and pruning layer {i} or one "
                         "after it (out of memory?)",
                    alone="note: pruning one layer at a time ({error})")


def _write_atomically(path: Path, arrays: dict) -> None:
    """Writes the npz beside its final name, then renames it (a run
    killed meanwhile leaves no half file); a folder that cannot be
    written only costs the next run the pruning again."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with open(tmp, "wb") as f:
            np.savez_compressed(f, **arrays)
        os.replace(tmp, path)
    except OSError as e:
        print(f"note: cannot keep the pruned model in {path} ({e.strerror}); the next run "
              "prunes it again", file=sys.stderr)


def summary(recipe: dict) -> str:
    """One line: layers, parameters, families."""
    specs = layers(recipe)
    params = sum(s.rows * s.cols for s in specs)
    fams = sorted({s.pattern or "dense" for s in specs})
    return (f"{len(specs)} layers, {params / 1e6:.0f}M weights, "
            f"{sum(1 for s in specs if s.pattern)} pruned ({', '.join(fams)})")
