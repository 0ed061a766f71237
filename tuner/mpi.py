"""Running `tune` or `sweep` as one MPI job over several processes and
hosts: `mpirun -n R sparseforge tune MODEL` (or `sweep SPEC`).

Nothing here imports mpi4py unless an MPI launcher started this process,
as its environment says (LAUNCHER_VARIABLES); without one, or in a world
of one rank, the commands run as a single process.

Under MPI every rank reads the same input and plans the same work; the
layers (or sweep points) are shared out deterministically over the ranks
(tuner/model.py `shard`: the largest first, each to the least loaded
rank; an identical matrix goes with its first).  Each rank maps to one
local GPU (its rank among the ranks of its host picks the ordinal, from
`--gpus` where given) or, without GPUs, compiles only; a host with more
ranks than GPUs is refused (ranks sharing a GPU would time each other).
GPUs of different models are refused unless `--mixed-gpus`: then each
model's ranks share all the work among themselves.

Each rank writes its own database, `<db>.rank<r>` beside `<db>`.  When
every rank is done, rank 0 merges the rank databases into `<db>`
(Cache.merge: what `<db>` holds is kept, nothing is duplicated; a layer
this run stored again replaces the one in `<db>`) and prints the table
of every rank's rows.  The rank databases are kept: a rerun with the same
number of ranks finds each rank's work (trials and binaries) in its own
file and resumes; remove `<db>.rank*` to reclaim the space.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

# Set by the launchers of Open MPI, MPICH and Intel MPI (hydra), PMIx-based
# launchers (srun --mpi=pmix, prterun) and MVAPICH.
LAUNCHER_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS",
                      "MV2_COMM_WORLD_SIZE")
_SIZE_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE")


def launched(environ=None) -> Optional[str]:
    """'NAME=value' of the first launcher variable set, or None where no
    MPI launcher started this process (or it started one rank alone)."""
    env = os.environ if environ is None else environ
    for name in _SIZE_VARIABLES:
        if env.get(name, "").strip() == "1":
            return None
    for name in LAUNCHER_VARIABLES:
        if name in env:
            return f"{name}={env[name]}"
    return None


@dataclass
class Ranks:
    """This process's place in the MPI job."""
    comm: object
    rank: int
    size: int
    local_rank: int      # among the ranks of this host
    local_size: int

    def gather(self, obj):
        """Every rank's `obj` at rank 0 (a list there, None elsewhere)."""
        return self.comm.gather(obj, root=0)

    def allgather(self, obj) -> list:
        return self.comm.allgather(obj)

    def bcast(self, obj):
        return self.comm.bcast(obj, root=0)


def join(environ=None) -> Optional[Ranks]:
    """The MPI job this process is a rank of, or None (no launcher, or one
    rank).  ValueError where a launcher started it but mpi4py is missing."""
    var = launched(environ)
    if var is None:
        return None
    try:
        from mpi4py import MPI
    except ImportError:
        raise ValueError(f"an MPI launcher started this process ({var}) but mpi4py is not "
                         "installed: pip install 'sparseforge[mpi]' (it needs an MPI "
                         "runtime: the cluster's, or `pip install mpich`)") from None
    world = MPI.COMM_WORLD
    if world.Get_size() == 1:
        return None
    local = world.Split_type(MPI.COMM_TYPE_SHARED, key=world.Get_rank())
    return Ranks(world, world.Get_rank(), world.Get_size(), local.Get_rank(), local.Get_size())


def launcher(ranks: int) -> list[str]:
    """The command that starts `ranks` processes as one MPI job on this
    host (`mpiexec -n R`, with Open MPI's flags for more ranks than cores
    and for root), found on PATH or beside this Python (where `pip install
    mpich` puts it); ValueError saying what is missing otherwise."""
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        raise ValueError("mpi4py is not installed (pip install 'sparseforge[mpi]' mpich)") from None
    exe = (shutil.which("mpiexec") or shutil.which("mpirun")
           or next((str(p) for n in ("mpiexec", "mpirun")
                    for p in (Path(sysconfig.get_path("scripts")) / n, Path(sys.prefix) / "bin" / n)
                    if p.exists()), None))
    if exe is None:
        raise ValueError("no mpiexec on PATH (pip install mpich, or your MPI's)")
    cmd = [exe, "-n", str(ranks)]
    version = subprocess.run([exe, "--version"], capture_output=True, text=True,
                             stdin=subprocess.DEVNULL).stdout
    if "Open MPI" in version or "OpenRTE" in version:
        cmd.append("--oversubscribe")
        if os.geteuid() == 0:
            cmd.append("--allow-run-as-root")
    return cmd


def compile_jobs(ranks: Ranks, cores: int | None = None) -> int:
    """Compile processes for one rank where --jobs is not given: the host's
    cores shared by its ranks (each rank has its own compile pool; the
    host's ranks compile at the same time)."""
    return max(1, (cores or os.cpu_count() or 2) // max(1, ranks.local_size))


def rank_db(db: Path, rank: int) -> Path:
    """Where rank `rank` writes: `<db>.rank<r>`, beside the database."""
    db = Path(db)
    return db.with_name(f"{db.name}.rank{rank}")


def local_device(ranks: Ranks, ordinals: list[int]) -> int:
    """The GPU ordinal of this rank: its place among its host's ranks picks
    one of the host's `ordinals`; ValueError where the host has fewer."""
    if ranks.local_size > len(ordinals):
        raise ValueError(f"this host runs {ranks.local_size} ranks but has {len(ordinals)} "
                         f"GPU(s) to give them ({', '.join(map(str, ordinals))}): one rank per "
                         "GPU (ranks sharing a GPU would time each other), so start fewer "
                         "ranks per host or name more GPUs with --gpus")
    return ordinals[ranks.local_rank]


def my_share(entries: list, ranks: Ranks, models: list[str]) -> list:
    """The entries this rank tunes: the work is shared over the ranks with
    this rank's GPU model (`models`: every rank's), all of it per model."""
    from .model import shard
    mine = models[ranks.rank]
    group = [r for r, m in enumerate(models) if m == mine]
    owner = shard(entries, len(group))
    me = group.index(ranks.rank)
    return [e for e, o in zip(entries, owner) if o == me and (not e.skipped or me == 0)]


@dataclass
class RankReport:
    """What a rank sends rank 0 when it is done."""
    rank: int
    db: str
    model: str                      # its GPU's name, or "none (compiled for ...)"
    rows: list = field(default_factory=list)     # ModelRow, without matrices
    names: list = field(default_factory=list)    # the layers it stored
    lanes: int = 1                  # searches in flight on its GPU (--lanes)
    compiled: int = 0
    corrupt: int = 0
    phases: dict = field(default_factory=dict)
    error: str = ""


def merge_ranks(cache, reports: list[RankReport]) -> int:
    """Rank 0: merges every rank's database into `cache` (the rows it
    lacks), then writes again each layer a rank stored this run that
    differs from the one `cache` held (a rerun's added N buckets, --force);
    the rows added."""
    from ..cache import Cache
    added = 0
    for rep in reports:
        if not Path(rep.db).exists():
            continue
        added += cache.merge(rep.db)
        with Cache(rep.db, create=False, readonly=True) as src:
            for name in rep.names:
                held = {r["gpu_name"]: r for r in cache.layers(name)}
                for rec in src.layers(name):
                    if rec["problem"] or held.get(rec["gpu_name"]) == rec:
                        continue
                    cache.put_layer(rec["name"], rec["gpu_name"], rec["matrix_fp"], rec["op"],
                                    rec["rows"], rec["cols"], rec["x_elem_size"],
                                    rec["y_elem_size"], rec["variants"])
                    added += 1
    return added
