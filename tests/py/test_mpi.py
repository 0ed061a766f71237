"""Tuning as one MPI job (tuner/mpi.py): the launcher is recognised from
the environment and mpi4py imported only then; the work is shared out
deterministically; each rank writes its own database and rank 0 merges
them into one whose content equals a single-process run's, and a rerun
resumes.  The sharing and merging are tested in one process; then
`mpiexec -n 2` runs a compile-only sweep and model tune for real (skipped,
saying why, where mpiexec or mpi4py is missing: scripts/test.sh installs
both)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sparseforge.cache import Cache
from sparseforge.generator.synth import random_matrix
from sparseforge.tuner import mpi
from sparseforge.tuner.dbcompare import differences
from sparseforge.tuner.driver import Tuner
from sparseforge.tuner.model import Entry, plan_model, shard, tune_entries

from recipes import SMALL

ROOT = Path(__file__).resolve().parents[2]
FLAGS = ["--arch", "sm_80", "--budget", "2", "--jobs", "1"]

SPEC = """families = ["nm24", "bsr:32x32", "shflbw:32"]
densities = [0.25]
shapes = [[128, 96]]
n = [16]
dtype = "fp16"
seed = 0
"""


# ---- the launcher ------------------------------------------------------------
@pytest.mark.parametrize("env,expected", [
    ({}, None),
    ({"OMPI_COMM_WORLD_SIZE": "4"}, "OMPI_COMM_WORLD_SIZE=4"),
    ({"PMI_SIZE": "2", "PMI_RANK": "1"}, "PMI_SIZE=2"),
    ({"PMIX_RANK": "0"}, "PMIX_RANK=0"),
    ({"PMI_SIZE": "1", "PMI_RANK": "0"}, None),          # one rank: a plain run
])
def test_the_launcher_is_recognised_from_the_environment(env, expected):
    assert mpi.launched(env) == expected


def test_without_a_launcher_mpi4py_is_not_imported(monkeypatch):
    monkeypatch.setitem(sys.modules, "mpi4py", None)     # importing it would fail
    assert mpi.join({"HOME": "/"}) is None


def test_a_launcher_without_mpi4py_is_said(monkeypatch):
    monkeypatch.setitem(sys.modules, "mpi4py", None)
    with pytest.raises(ValueError, match=r"an MPI launcher started this process "
                                         r"\(PMI_SIZE=2\) but mpi4py is not installed"):
        mpi.join({"PMI_SIZE": "2"})


def test_rank_databases_sit_beside_the_database():
    assert mpi.rank_db(Path("/x/sf.db"), 3) == Path("/x/sf.db.rank3")


# ---- sharing the work out -----------------------------------------------------
def entries_of(costs, firsts=None, skipped=()):
    firsts = firsts or {}
    return [Entry(i, f"e{i}", skipped="dense" if i in skipped else "",
                  key=(firsts.get(i, i),), first=f"e{firsts[i]}" if i in firsts else "",
                  cost=float(c)) for i, c in enumerate(costs)]


def test_the_largest_go_first_to_the_least_loaded_rank():
    es = entries_of([1, 8, 3, 3, 1, 2], firsts={4: 0}, skipped={5})
    ranks = shard(es, 2)
    assert ranks == shard(es, 2)                       # the same on every rank
    assert ranks[1] == 0 and ranks[2] == ranks[3] == 1  # 8 alone; 3 + 3 beside it
    assert ranks[4] == ranks[0]                        # a copy goes with its first
    assert ranks[5] == 0                               # rank 0 lists the skipped
    load = [sum(e.cost for e, r in zip(es, ranks) if r == k and not e.first and not e.skipped)
            for k in (0, 1)]
    assert max(load) - min(load) <= 3


class FakeRanks:
    def __init__(self, rank, size, local_rank=0, local_size=1):
        self.rank, self.size, self.local_rank, self.local_size = rank, size, local_rank, local_size


def test_each_gpu_model_shares_all_the_work_among_its_ranks():
    es = entries_of([5, 4, 3, 2])
    models = ["A", "B", "A", "B"]
    shares = {r: {e.index for e in mpi.my_share(es, FakeRanks(r, 4), models)} for r in range(4)}
    assert shares[0] | shares[2] == shares[1] | shares[3] == {0, 1, 2, 3}
    assert not shares[0] & shares[2] and not shares[1] & shares[3]


def test_a_rank_takes_the_gpu_its_place_on_the_host_picks():
    assert mpi.local_device(FakeRanks(5, 8, local_rank=1, local_size=2), [2, 3]) == 3
    with pytest.raises(ValueError, match="this host runs 3 ranks but has 2 GPU"):
        mpi.local_device(FakeRanks(0, 3, 0, 3), [0, 1])


# ---- merging, in one process ----------------------------------------------------
def compile_only_tuner(cache):
    return Tuner(cache, arch="sm_80", budget="2", jobs=1)


@pytest.fixture(scope="module")
def no_gpu():
    from sparseforge import native
    if native.gpu_available()[0]:
        pytest.skip("a GPU answers: these compare compile-only runs")


def small_model():
    mats = [(f"l{i}", random_matrix(p, 96, 64, 0.25, "fp16", seed=i))
            for i, p in enumerate(["nm24", "bsr:32x32", "nm24"])]
    mats.append(("copy", mats[0][1]))
    return mats


def test_rank_databases_merge_into_the_single_process_database(tmp_path, no_gpu):
    entries = plan_model(small_model())
    with Cache(tmp_path / "single.db") as cache:
        tune_entries(entries, compile_only_tuner(cache), [16, 64])
    owner = shard(entries, 2)
    reports = []
    for r in range(2):
        path = mpi.rank_db(tmp_path / "merged.db", r)
        mine = [e for e, o in zip(entries, owner) if o == r]
        with Cache(path) as cache:
            rows = tune_entries(mine, compile_only_tuner(cache), [16, 64])
        reports.append(mpi.RankReport(r, str(path), "none", [x.light() for x in rows],
                                      [e.name for e in mine]))
    assert all(rep.names for rep in reports)             # both ranks had work
    with Cache(tmp_path / "merged.db") as cache:
        assert mpi.merge_ranks(cache, reports) > 0
        assert mpi.merge_ranks(cache, reports) == 0      # merging again adds nothing
    assert differences(tmp_path / "single.db", tmp_path / "merged.db") == []


def test_a_layer_stored_again_replaces_the_merged_one(tmp_path, no_gpu):
    """A rerun that adds N buckets stores the layer again in the rank
    database: the merge writes it over the one the database held."""
    (entry,) = plan_model(small_model()[:1])
    path = mpi.rank_db(tmp_path / "m.db", 0)
    for ns in ([16], [16, 64]):
        with Cache(path) as cache:
            tune_entries([entry], compile_only_tuner(cache), ns)
        with Cache(tmp_path / "m.db") as cache:
            mpi.merge_ranks(cache, [mpi.RankReport(0, str(path), "none", names=["l0"])])
            buckets = {v["n_bucket"] for v in cache.layers("l0")[0]["variants"]}
        assert buckets == set(ns)
    assert differences(path, tmp_path / "m.db") == []


def test_the_comparison_names_what_differs(tmp_path, no_gpu):
    with Cache(tmp_path / "a.db") as a:
        a.put_matrix("fp1", 2, 3, 4, "fp16", "x")
    with Cache(tmp_path / "b.db") as b:
        b.put_matrix("fp1", 2, 3, 4, "fp16", "y")
    diff = differences(tmp_path / "a.db", tmp_path / "b.db")
    assert any("matrices: only in" in d and "info='x'" in d for d in diff)
    assert any("info='y'" in d for d in diff)
    assert differences(tmp_path / "a.db", tmp_path / "a.db") == []


# ---- mpiexec -n 2, for real -------------------------------------------------------
def _mpiexec() -> list[str]:
    try:
        return mpi.launcher(2)
    except ValueError as e:
        pytest.skip(f"{e}; scripts/test.sh installs both")


def _env(tmp_path) -> dict:
    return dict(os.environ, SF_CUDA_DRIVER="/nonexistent/libcuda.so.1", PYTHONUNBUFFERED="1",
                XDG_CACHE_HOME=str(tmp_path / "xdg"),
                PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def _run(tmp_path, *args, mpiexec=()) -> subprocess.CompletedProcess:
    return subprocess.run([*mpiexec, sys.executable, "-m", "sparseforge", *map(str, args), *FLAGS],
                          cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True,
                          timeout=600, stdin=subprocess.DEVNULL)


def _sparseforge(tmp_path, *args, mpiexec=()):
    r = _run(tmp_path, *args, mpiexec=mpiexec)
    assert r.returncode == 0, (r.stdout, r.stderr)
    return r.stdout, r.stderr


def _compiled(out: str) -> int:
    return int(re.search(r"kernels compiled in this run: (\d+)", out).group(1))


@pytest.mark.parametrize("command,source,text", [("sweep", "spec.toml", SPEC),
                                                  ("tune", "model.toml", SMALL)])
def test_two_ranks_merge_to_the_single_process_database(tmp_path, command, source, text):
    mpiexec = _mpiexec()
    (tmp_path / source).write_text(text)
    single, merged = tmp_path / "single.db", tmp_path / "merged.db"
    _sparseforge(tmp_path, command, tmp_path / source, "--db", single)
    out, err = _sparseforge(tmp_path, command, tmp_path / source, "--db", merged,
                            mpiexec=mpiexec)
    assert "merged from 2 rank databases" in out
    assert re.search(r"each rank's time: rank 0 [\d.]+ s \(\d+ layers\), rank 1 ", out)
    assert "[rank 0]" in err and "[rank 1]" in err
    assert out.count("GPU: none") == 1                   # one table, printed by rank 0
    for name in (["q", "up", "down", "o"] if command == "tune" else ["nm24", "bsr:32x32", "shflbw:32"]):
        assert name in out
    assert all(mpi.rank_db(merged, r).exists() for r in (0, 1))
    assert _compiled(out) > 0
    assert differences(single, merged) == []
    # a rerun resumes: every kernel is in its rank's database
    out, _ = _sparseforge(tmp_path, command, tmp_path / source, "--db", merged, mpiexec=mpiexec)
    assert _compiled(out) == 0
    assert differences(single, merged) == []


def test_a_ranks_compile_pool_takes_its_share_of_the_hosts_cores():
    def ranks(local_size):
        return mpi.Ranks(None, 0, 4, 0, local_size)
    assert mpi.compile_jobs(ranks(2), cores=32) == 16
    assert mpi.compile_jobs(ranks(1), cores=32) == 32
    assert mpi.compile_jobs(ranks(8), cores=4) == 1          # never none


def test_lanes_without_a_gpu_are_refused_under_mpi_by_every_rank_together(tmp_path):
    """Each rank runs --lanes searches on its GPU; without one (_env hides
    the driver), every rank refuses and rank 0 says it once, for them all."""
    mpiexec = _mpiexec()
    (tmp_path / "model.toml").write_text(SMALL)
    r = _run(tmp_path, "tune", tmp_path / "model.toml", "--db", tmp_path / "t.db", "--lanes", "2",
             mpiexec=mpiexec)
    assert r.returncode != 0
    assert r.stderr.count("sparseforge tune: error:") == 1                     # rank 0 says it
    assert "rank 0: --lanes: no GPU here" in r.stderr and "rank 1: --lanes: no GPU" in r.stderr
