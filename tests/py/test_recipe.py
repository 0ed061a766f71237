"""Model recipes (generator/recipe.py): checked with precise errors, made
from their seed at first use, their pruning kept in the user's cache
folder and reused (the same matrices, no pruning), a kept file that no
longer reproduces its layers made again; and the README's main job, the
Llama block, is what it says."""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

from sparseforge.generator import recipe
from sparseforge.generator.families import auto_pattern

from recipes import SMALL

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg"


def write(tmp_path, text, name="model.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def quiet():
    return io.StringIO()


def test_first_use_makes_and_keeps_the_pruning_then_reuses_it(tmp_path, monkeypatch):
    path = write(tmp_path, SMALL)
    log = quiet()
    first = recipe.load(path, log=log)
    assert "making the model of" in log.getvalue()
    kept = recipe.kept_path(path, recipe.read(path))
    assert kept.exists() and kept.parent == tmp_path / "xdg" / "sparseforge" / "models"
    assert [n for n, _ in first] == ["q", "up", "down", "o"]
    q, up, down, o = (m for _, m in first)
    assert q.perm is not None and auto_pattern(q) == "shflbw:32"
    assert auto_pattern(up) == "nm24" and auto_pattern(down) == "bsr:32x32"
    assert o.density == 1.0 and all(m.dtype == "fp16" for _, m in first)

    import sparseforge.generator.prune as prune_mod
    monkeypatch.setattr(prune_mod, "prune", lambda *a, **k: pytest.fail("pruned again"))
    log = quiet()
    again = recipe.load(path, log=log)
    assert log.getvalue() == ""
    assert [m.fingerprint() for _, m in again] == [m.fingerprint() for _, m in first]


def test_a_kept_file_that_no_longer_reproduces_its_layers_is_made_again(tmp_path):
    path = write(tmp_path, SMALL)
    first = recipe.load(path, log=quiet())
    kept = recipe.kept_path(path, recipe.read(path))
    with np.load(kept) as z:
        arrays = dict(z)
    arrays["0.mask"] = np.zeros_like(arrays["0.mask"])    # another pattern
    np.savez(kept, **arrays)
    log = quiet()
    again = recipe.load(path, log=log)
    assert "making the model" in log.getvalue()
    assert [m.fingerprint() for _, m in again] == [m.fingerprint() for _, m in first]
    kept.write_bytes(b"not an npz")
    assert recipe.load(path, log=quiet())[0][1].fingerprint() == first[0][1].fingerprint()


def test_another_recipe_or_seed_keeps_its_own_file(tmp_path):
    a = write(tmp_path, SMALL, "a.toml")
    b = write(tmp_path, SMALL.replace("seed = 1", "seed = 2"), "a2.toml")
    assert recipe.kept_path(a, recipe.read(a)) != recipe.kept_path(b, recipe.read(b))
    fa = recipe.load(a, log=quiet())[0][1].fingerprint()
    fb = recipe.load(b, log=quiet())[0][1].fingerprint()
    assert fa != fb


def test_a_layer_by_name_a_dtype_and_repeats(tmp_path):
    path = write(tmp_path, SMALL)
    [(name, m)] = recipe.load(path, name="up", dtype="bf16", log=quiet())
    assert name == "up" and m.dtype == "bf16"
    with pytest.raises(ValueError, match=r"no layer named 'k'; it makes q, up, down, o"):
        recipe.load(path, name="k", log=quiet())
    rep = write(tmp_path, "repeat = 3\n" + SMALL, "rep.toml")
    names = [s.name for s in recipe.layers(recipe.read(rep))]
    assert names[:5] == ["layers.0.q", "layers.0.up", "layers.0.down", "layers.0.o", "layers.1.q"]
    assert len(names) == 12


@pytest.mark.parametrize("text,message", [
    ('families = ["csr"]\nshapes = [[4, 4]]\nn = [16]\n', "is a sweep spec"),
    ("seed = 0\n", "no [[layer]] tables"),
    ('bogus = 1\n[[layer]]\nname = "a"\nshape = [4, 4]\n', "unknown keys ['bogus']"),
    ('[[layer]]\nname = "a"\nshape = [4, 0]\n', "layer 'a': shape is [rows, cols]"),
    ('[[layer]]\nname = "a"\nshape = [4, 4]\n[[layer]]\nname = "a"\nshape = [4, 4]\n',
     "the name 'a' is used twice"),
    ('[[layer]]\nname = "a"\nshape = [4, 4]\npattern = "bsr:2x2"\n', "needs a sparsity"),
    ('[[layer]]\nname = "a"\nshape = [4, 4]\nsparsity = 0.5\n', "sparsity without a pattern"),
    ('[[layer]]\nname = "a"\nshape = [4, 4]\npattern = "bsr:2x2"\nsparsity = 1.5\n',
     "sparsity is a fraction"),
    ('[[layer]]\nname = "a"\nshape = [4, 4]\npattern = "blocky"\n', "layer 'a': "),
    ('dtype = "fp8"\n[[layer]]\nname = "a"\nshape = [4, 4]\n', "dtype must be one of"),
    ('repeat = 0\n[[layer]]\nname = "a"\nshape = [4, 4]\n', "repeat must be a whole number"),
    ('[[layer]]\nname = "a"\nshape = [100000, 1000000]\n', "exceeds the limit"),
    ("not toml [", "not a valid TOML model recipe"),
])
def test_bad_recipes_are_refused_with_the_reason(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(ValueError, match=rf"^{path}: .*{__import__('re').escape(message)}"):
        recipe.read(path)


def test_the_main_job_is_a_pruned_llama_block():
    r = recipe.read(ROOT / "examples" / "llama_block.toml")
    specs = {s.name: s for s in recipe.layers(r)}
    shapes = {n: (s.rows, s.cols) for n, s in specs.items()}
    for p in ("q", "k", "v", "o"):
        assert shapes[f"attn.{p}_proj.weight"] == (4096, 4096)
    assert shapes["mlp.gate_proj.weight"] == shapes["mlp.up_proj.weight"] == (11008, 4096)
    assert shapes["mlp.down_proj.weight"] == (4096, 11008)
    families = {s.pattern for s in specs.values()}
    assert families == {"shflbw:64", "bsr:64x64", "nm24", None}     # one stays dense
    assert all(s.sparsity == 0.75 for s in specs.values() if s.pattern in ("shflbw:64",
                                                                          "bsr:64x64"))
