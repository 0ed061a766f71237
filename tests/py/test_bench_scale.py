"""bench/scale.py without a GPU (compiling only): the model recipe it
writes is the benchmark's model; under `mpiexec -n 2` a rank killed midway
is reported by the launcher, the rank databases keep what was stored, and
the same job again finishes only what is missing (no trial twice, every
layer merged); the model and sweep runs are compared and tabled.  Skipped,
saying why, where mpiexec or mpi4py is missing (scripts/test.sh installs
both)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import scale  # noqa: E402
import tune_model  # noqa: E402

from sparseforge.generator import recipe  # noqa: E402
from sparseforge.tuner import mpi  # noqa: E402


def test_the_recipe_file_is_the_benchmarks_model(tmp_path):
    want = tune_model.bert_recipe("shflbw:64", 0.75, layers=3)
    path = tmp_path / "bert.toml"
    path.write_text(scale.recipe_toml(want))
    assert recipe.read_toml(str(path), "recipe") == want


@pytest.mark.parametrize("said,name", [
    ("HYDRA build details:\n    Version:                                 5.0.2\n", "MPICH 5.0.2"),
    ("mpirun (Open MPI) 5.0.3\n\nReport bugs to https://www.open-mpi.org/", "Open MPI 5.0.3"),
    ("mpiexec (OpenRTE) 4.1.6\n\nReport bugs to http://www.open-mpi.org/", "Open MPI 4.1.6"),
    ("something else\n", "something else")])
def test_the_mpi_is_named_from_what_its_launcher_says(said, name):
    assert scale._version(said) == name


@pytest.fixture
def launcher():
    try:
        return mpi.launcher(2)
    except ValueError as e:
        pytest.skip(f"{e}; scripts/test.sh installs both")


def test_a_killed_rank_is_reported_and_the_rerun_finishes_the_rest(tmp_path, monkeypatch,
                                                                   launcher):
    monkeypatch.setenv("SF_CUDA_DRIVER", "/nonexistent/libcuda.so.1")     # compiling only
    results = tmp_path / "RESULTS.md"
    assert scale.main(["--stages", "kill,model", "--layers", "1", "--n", "16,256",
                       "--arch", "sm_80", "--extra", "--budget 2 --jobs 1", "--kill-after", "2",
                       "--work", str(tmp_path / "w"), "--results", str(results)]) == 0
    state = json.loads((tmp_path / "w" / "scale.json").read_text())
    first, again = state["kill"]["first"], state["kill"]["again"]
    assert first["killed_at_s"] is not None and first["code"] != 0
    assert any("BAD TERMINATION" in s or "signal" in s.lower() for s in first["launcher_said"])
    kept = sum(r["binaries"] for r in first["ranks_after_kill"])
    assert kept >= 2 and first["merged_after_kill"]["layers"] == 0
    assert again["code"] == 0 and again["merged"]["layers"] == again["expected_layers"] == 12
    total = sum(r["binaries"] for r in again["ranks"])
    assert again["compiled"] == total - kept          # what was kept is not compiled again
    assert again["kept_rewritten"] == 0
    model = state["model"]
    assert "gpus" not in model and "lanes" not in model     # they need GPUs
    assert model["one"]["code"] == model["mpi"]["code"] == 0
    assert model["mpi"]["contents"]["layers"] == model["one"]["contents"]["layers"] == 6
    assert model["mpi"]["versus_one"]["pairs"] == 12 and model["mpi"]["versus_one"]["missing"] == 0
    text = results.read_text()
    assert "A rank killed: `mpiexec -n 2`" in text and "| `mpiexec -n 2` |" in text


def test_winners_are_compared_per_layer_and_n(monkeypatch):
    one = {("q", 16): ('{"bn": 64}', 1.0, "fp", "op"), ("q", 256): ('{"bn": 64}', 2.0, "fp", "op"),
           ("k", 16): ('{"bn": 64}', 1.0, "fk", "op")}
    other = {("q", 16): ('{"bn": 64}', 1.1, "fp", "op"), ("q", 256): ('{"bn": 128}', 2.2, "fp", "op")}
    monkeypatch.setattr(scale, "winners", lambda db: one if db == "one" else other)
    monkeypatch.setattr(scale, "times", lambda db: {("fp", "op", 256, '{"bn": 128}'): 2.1})
    v = scale.compare("one", "other")
    assert (v["pairs"], v["same"], v["differ"], v["missing"]) == (3, 1, 1, 1)
    assert v["cross_geomean"] == pytest.approx(1.1) and v["within_geomean"] == pytest.approx(1.05)
