"""Tuning on several GPUs of one host, measured: how the model tune and a
sweep scale from one GPU to all of them, whether they find the same
winners, and what a rank killed midway leaves behind.

Stages (--stages, all by default; each one's result is kept in --work as
JSON, so a call cut short goes on with --resume):
- model: the BERT-base-sized model (bench/tune_model.py's, --pattern at
  --sparsity, N = --n) tuned from empty databases: on one GPU (the plain
  command), on one GPU with two searches in flight (`--lanes 2`), with
  `--gpus all`, and as `mpiexec -n G` (one rank per GPU), without and
  with `--lanes 2` (--runs picks among them); wall times,
  kernels compiled, trials, and each run's winners against the one-GPU
  run's: the same configuration, or the other run's winner as timed
  there over the one-GPU winner as timed here.
- sweep: bench/sweeps/scale.toml on one GPU and under `mpiexec -n G`.
- kill: a 2-layer model under `mpiexec -n G`; rank 1 is killed (SIGKILL)
  once its database holds --kill-after trials; what the launcher says,
  what every rank database kept, then the same job again: what it
  compiled and measured, and the merged database whole.

    python3 bench/scale.py --results bench/RESULTS.md           # a host with 2+ GPUs
    python3 bench/scale.py --stages kill,sweep --arch sm_90a    # no GPU: compiling only

Without a GPU the stages still run (the runs compile and store, nothing
is measured) except the `--lanes` and `--gpus all` runs, which need GPUs;
the times then say nothing of scaling on GPUs.  The commands run as the user runs
them (`python3 -m sparseforge`), each in its own process.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from tune_model import BERT_BASE, bert_recipe  # noqa: E402

SWEEP = ROOT / "bench" / "sweeps" / "scale.toml"
RUNS = ("one", "lanes", "gpus", "mpi", "mpi_lanes")   # the model stage's runs


def recipe_toml(recipe: dict) -> str:
    """A model recipe (tune_model.bert_recipe's dict) as the file the
    README describes."""
    def value(v):
        return f'"{v}"' if isinstance(v, str) else f"[{', '.join(map(str, v))}]" \
            if isinstance(v, (list, tuple)) else str(v)
    lines = [f"{k} = {value(v)}" for k, v in recipe.items() if k != "layer"]
    for layer in recipe["layer"]:
        lines += ["", "[[layer]]"] + [f"{k} = {value(v)}" for k, v in layer.items()]
    return "\n".join(lines) + "\n"


# ---- running the commands --------------------------------------------------
class Runner:
    """Runs `sparseforge` commands as separate processes with one cache
    folder (the recipe's pruned weights are made once and kept there),
    their output kept in --work."""

    def __init__(self, args):
        self.args, self.work = args, Path(args.work)
        self.env = dict(os.environ, PYTHONUNBUFFERED="1", XDG_CACHE_HOME=str(self.work / "xdg"),
                        PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.flags = ["--arch", args.arch] if args.arch else []
        self.flags += args.extra.split() if args.extra else []

    def command(self, verb: str, source, db, launcher=(), extra=()) -> list[str]:
        return [*launcher, sys.executable, "-m", "sparseforge", verb, str(source), "--db", str(db),
                *self.flags, *extra]

    def run(self, label: str, cmd: list[str]) -> dict:
        """Runs `cmd`, its output in <work>/<label>.log; wall time, exit
        code, kernels compiled."""
        log = self.work / f"{label}.log"
        print(f"[scale] {label}: {' '.join(cmd)}", file=sys.stderr, flush=True)
        t0 = time.monotonic()
        with open(log, "w") as f:
            r = subprocess.run(cmd, cwd=ROOT, env=self.env, stdout=f, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL)
        wall = time.monotonic() - t0
        text = log.read_text(errors="replace")
        m = re.search(r"kernels compiled in this run: (\d+)", text)
        out = {"label": label, "wall_s": wall, "code": r.returncode,
               "compiled": int(m.group(1)) if m else None, "log": str(log)}
        print(f"[scale] {label}: exit {r.returncode}, {wall:.1f} s, "
              f"{out['compiled']} compiled", file=sys.stderr, flush=True)
        if r.returncode != 0:
            print(text[-3000:], file=sys.stderr, flush=True)
        return out


def count(db: Path, query: str) -> int:
    """A COUNT query on a database, read-only, without disturbing a writer;
    0 where it is missing or not yet written."""
    if not db.exists():
        return 0
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
        try:
            return con.execute(query).fetchone()[0]
        finally:
            con.close()
    except sqlite3.Error:
        return 0


def trial_count(db: Path) -> int:
    """Trials of sparse kernels (cuBLAS's left out)."""
    return count(db, "SELECT COUNT(*) FROM trials WHERE matrix_fp != 'dense'")


def contents(db: Path) -> dict:
    """What a database holds: trials of sparse kernels, binaries, layers."""
    from sparseforge.cache import Cache
    if not db.exists():
        return {"trials": 0, "binaries": 0, "layers": 0}
    with Cache(db, create=False, readonly=True) as c:
        s = c.summary()
    return {"trials": trial_count(db), "binaries": s.get("binaries", 0),
            "layers": s.get("layers", 0)}


def times(db: Path) -> dict:
    """(matrix, op, N, configuration) -> median ms of every ok trial of a
    sparse kernel in a database."""
    from sparseforge.cache import Cache
    with Cache(db, create=False, readonly=True) as c:
        return {(t["matrix_fp"], t["op"], t["n"], _canon(t["config"])): t["median_ms"]
                for t in c.trials() if t["status"] == "ok" and t["matrix_fp"] != "dense"}


def winners(db: Path) -> dict:
    """(layer, N bucket) -> (config, its median ms as timed in that run,
    matrix, op)."""
    from sparseforge.cache import Cache
    timed = times(db)
    out = {}
    with Cache(db, create=False, readonly=True) as c:
        for rec in c.layers():
            for v in rec["variants"]:
                cfg = _canon(v["config"])
                out[(rec["name"], v["n_bucket"])] = (
                    cfg, timed.get((rec["matrix_fp"], rec["op"], v["n_bucket"], cfg), math.nan),
                    rec["matrix_fp"], rec["op"])
    return out


def _canon(config) -> str:
    if config is None:
        return ""
    try:
        return json.dumps(json.loads(config) if isinstance(config, str) else config,
                          sort_keys=True)
    except ValueError:
        return str(config)


def compare(base: Path, other: Path) -> dict:
    """The other run's winners against the base run's, per (layer, N):
    how many are the same configuration; for those that differ, the
    other's winner over the base's winner, each as timed in its own run,
    and, where the base run also measured the other's winner, as timed
    there (one run, one GPU: no run-to-run drift)."""
    a, b, a_times = winners(base), winners(other), times(base)
    same, cross, within, missing = 0, [], [], 0
    for key, (cfg, ms, fp, op) in a.items():
        if key not in b:
            missing += 1
            continue
        ocfg, oms = b[key][0], b[key][1]
        if ocfg == cfg:
            same += 1
            continue
        cross.append(oms / ms)
        there = a_times.get((fp, op, key[1], ocfg))
        if there is not None:
            within.append(there / ms)
    return {"pairs": len(a), "same": same, "missing": missing, "differ": len(cross),
            "cross_geomean": _geomean(cross), "cross_max": max(cross, default=math.nan),
            "within_n": len(within), "within_geomean": _geomean(within),
            "within_max": max(within, default=math.nan)}


def _geomean(xs):
    xs = [x for x in xs if x == x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else math.nan


# ---- the stages ----------------------------------------------------------
def gpu_names() -> list[str]:
    """The GPUs' names, asked in a process of its own (this one holds no
    CUDA context while the runs measure); [] without a GPU."""
    probe = ("import json; from sparseforge import native\n"
             "ok, _ = native.gpu_available()\n"
             "names = []\n"
             "if ok:\n"
             "    with native.Context(0) as c: count = c.device_count()\n"
             "    for o in range(count):\n"
             "        with native.Context(o) as c: names.append(c.device_info()['name'])\n"
             "print(json.dumps(names))")
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env,
                       check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def stage_model(args, runner: Runner, gpus: int, launcher) -> dict:
    work = runner.work
    recipe = work / "bert.toml"
    recipe.write_text(recipe_toml(bert_recipe(args.pattern, args.sparsity, args.layers)))
    n = ["--n", args.n]
    # the pruned model made once, before any timed run
    runner.run("model-prune", [sys.executable, "-m", "sparseforge", "inspect", str(recipe)])
    runs = {}
    # one search a GPU unless the run is about lanes (the default is 2 on a GPU)
    plan = [("one", ["--lanes", "1"]), ("lanes", ["--lanes", "2"] if gpus else None),
            ("gpus", ["--gpus", "all", "--lanes", "1"] if gpus > 1 else None),
            ("mpi", ["--lanes", "1"]),
            ("mpi_lanes", ["--lanes", "2"] if gpus else None)]
    for label, how in plan:
        if how is None or label not in args.runs:
            continue
        db = work / f"model-{label}.db"
        for p in work.glob(f"model-{label}.db*"):      # -wal, -shm, .rank<r>: from empty
            p.unlink()
        under_mpi = label.startswith("mpi")
        cmd = runner.command("tune", recipe, db, launcher=launcher if under_mpi else (),
                             extra=[*n, *how])
        runs[label] = runner.run(f"model-{label}", cmd)
        runs[label]["contents"] = contents(db)
        runs[label]["db"] = str(db)
        if label != "one" and runs["one"]["code"] == 0 and runs[label]["code"] == 0:
            runs[label]["versus_one"] = compare(work / "model-one.db", db)
        if under_mpi:
            runs[label]["rank_dbs"] = [contents(r) for r in rank_dbs(db, launcher)]
    return runs


def stage_sweep(args, runner: Runner, gpus: int, launcher) -> dict:
    work = runner.work
    runs = {}
    for label, how in (("one", ()), ("mpi", launcher)):
        db = work / f"sweep-{label}.db"
        for p in work.glob(f"sweep-{label}.db*"):
            p.unlink()
        runs[label] = runner.run(f"sweep-{label}", runner.command(
            "sweep", args.sweep, db, launcher=how, extra=["--budget", str(args.sweep_budget)]))
        runs[label]["contents"] = contents(db)
    return runs


def stage_kill(args, runner: Runner, gpus: int, launcher) -> dict:
    """mpiexec -n G of a 2-layer model; rank 1 killed once its database
    holds --kill-after trials (or compiled kernels, without a GPU); then
    the same job again."""
    from sparseforge.tuner import mpi
    work = runner.work
    recipe = work / "bert2.toml"
    recipe.write_text(recipe_toml(bert_recipe(args.pattern, args.sparsity, 2)))
    db = work / "kill.db"
    for p in work.glob("kill.db*"):
        p.unlink()
    for p in work.glob("kill.pid.*"):
        p.unlink()
    runner.run("kill-prune", [sys.executable, "-m", "sparseforge", "inspect", str(recipe)])
    inner = runner.command("tune", recipe, db, extra=["--n", args.n])
    # each rank writes its pid before it becomes the tune (exec keeps the pid)
    wrapped = [*launcher, "sh", "-c",
               f'echo $$ > {work}/kill.pid.${{PMI_RANK:-${{OMPI_COMM_WORLD_RANK:-x}}}}; '
               f'exec "$@"', "sh", *inner]
    log = work / "kill-first.log"
    print(f"[scale] kill-first: {' '.join(wrapped)}", file=sys.stderr, flush=True)
    t0 = time.monotonic()
    victim_db = mpi.rank_db(db, 1)
    with open(log, "w") as f:
        proc = subprocess.Popen(wrapped, cwd=ROOT, env=runner.env, stdout=f,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        killed_at, held = None, 0
        while proc.poll() is None:
            held = trial_count(victim_db) if args.gpu else _binaries(victim_db)
            pid_file = work / "kill.pid.1"
            if held >= args.kill_after and pid_file.exists():
                pid = int(pid_file.read_text())
                os.kill(pid, signal.SIGKILL)
                killed_at = time.monotonic() - t0
                print(f"[scale] kill-first: rank 1 (pid {pid}) killed at {killed_at:.1f} s, "
                      f"its database holding {held} {'trials' if args.gpu else 'kernels'}",
                      file=sys.stderr, flush=True)
                break
            time.sleep(0.25)
        code = proc.wait(timeout=600)
    first = {"wall_s": time.monotonic() - t0, "code": code, "killed_at_s": killed_at,
             "held_at_kill": held, "log": str(log)}
    text = log.read_text(errors="replace")
    first["launcher_said"] = [ln for ln in text.splitlines()
                              if re.search(r"BAD TERMINATION|KILLED|signal|exited on|EXIT CODE|"
                                           r"terminated", ln, re.I)][:6]
    first["ranks_after_kill"] = [contents(r) for r in rank_dbs(db, launcher)]
    kept = [_trials(r) for r in rank_dbs(db, launcher)]
    first["merged_after_kill"] = contents(db)
    print(f"[scale] kill-first: exit {code}; the launcher said: {first['launcher_said']}",
          file=sys.stderr, flush=True)
    again = runner.run("kill-again", runner.command("tune", recipe, db, launcher=launcher,
                                                    extra=["--n", args.n]))
    again["ranks"] = [contents(r) for r in rank_dbs(db, launcher)]
    again["merged"] = contents(db)
    again["expected_layers"] = 2 * len(BERT_BASE)
    # the rerun measured only what was missing: every trial kept from the
    # first run is still there, written once
    after = [_trials(r) for r in rank_dbs(db, launcher)]
    again["kept_trials"] = sum(len(k) for k in kept)
    again["kept_rewritten"] = sum(1 for k, a in zip(kept, after) for key, v in k.items()
                                  if a.get(key) != v)
    return {"first": first, "again": again}


def _version(text: str) -> str:
    """'MPICH 5.0.2' or 'Open MPI 5.0.3' from `mpiexec --version`."""
    m = re.search(r"Version:\s*(\S+)", text)         # MPICH's hydra
    if m:
        return f"MPICH {m.group(1)}"
    m = (re.search(r"\((?:Open MPI|OpenRTE)\)\s*(\S+)", text)     # 5.x; 4.x's runtime
         or re.search(r"Open MPI.*?(\d[\d.]*)", text))
    return f"Open MPI {m.group(1)}" if m else (text.split("\n")[0].strip() or "?")


def len_ranks(launcher) -> int:
    return int(launcher[launcher.index("-n") + 1])


def rank_dbs(db: Path, launcher) -> list[Path]:
    """The databases the ranks of `launcher`'s job write beside `db`."""
    from sparseforge.tuner import mpi
    return [mpi.rank_db(db, r) for r in range(len_ranks(launcher))]


def _binaries(db: Path) -> int:
    return count(db, "SELECT COUNT(*) FROM binaries")


def _trials(db: Path) -> dict:
    """(environment, matrix, op, N, configuration) -> (created, median ms)
    of every trial a database holds."""
    if not db.exists():
        return {}
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    try:
        return {row[:5]: row[5:] for row in con.execute(
            "SELECT env_key, matrix_fp, op, n, config, created, median_ms FROM trials")}
    finally:
        con.close()


# ---- the table -------------------------------------------------------------
def table(results: dict, args, commit: str) -> str:
    names = results.get("gpu_names") or ["none"]
    lines = [f"## Several GPUs of one host: {datetime.date.today()}, {len(names)} x {names[0]}, "
             f"commit {commit}", "",
             f"`python3 bench/scale.py` on {results.get('host', '?')} ({results.get('cores')} "
             f"cores); MPI: `{' '.join(Path(results['launcher'][0]).name.split() + results['launcher'][1:])}` "
             f"({results.get('mpi_version', '?')}).", ""]
    g = len_ranks(results["launcher"])
    model = results.get("model")
    if model:
        one = model["one"]
        lines += [f"The model: the BERT-base-sized model ({args.layers} layers; q, k, v, o "
                  f"768 x 768, up 3072 x 768, down 768 x 3072), {args.pattern}"
                  f"{'' if args.sparsity is None else f' at {args.sparsity:g}'}, N = {args.n}, "
                  "the tuner's defaults, from empty databases.", "",
                  "| run | wall s | speedup | per GPU | exit | kernels compiled | trials | layers "
                  "| same winner | differing: other / one (own runs) | (timed in the one-GPU run) |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | --- |"]
        for label, what in (("one", "one GPU (plain `tune`)"), ("lanes", "one GPU, `--lanes 2`"),
                            ("gpus", "`--gpus all`"), ("mpi", f"`mpiexec -n {g}`"),
                            ("mpi_lanes", f"`mpiexec -n {g}`, `--lanes 2`")):
            r = model.get(label)
            if not r:
                continue
            sp = one["wall_s"] / r["wall_s"]
            v = r.get("versus_one")
            same = diff = within = "-"
            if v:
                same = f"{v['same']} of {v['pairs']}" + (f" ({v['missing']} missing)"
                                                         if v["missing"] else "")
                diff = (f"{v['differ']}: geomean {v['cross_geomean']:.3f}, max {v['cross_max']:.3f}"
                        if v["differ"] else "-")
                within = (f"{v['within_n']}: geomean {v['within_geomean']:.3f}, max "
                          f"{v['within_max']:.3f}" if v["within_n"] else "-")
            c = r["contents"]
            lanes = 1 if label in ("one", "lanes") else g
            lines.append(f"| {what} | {r['wall_s']:.1f} | {sp:.2f}x | {sp / lanes:.2f} | "
                         f"{r['code']} | {r['compiled']} | {c['trials']} | {c['layers']} | {same} "
                         f"| {diff} | {within} |")
        lines.append("")
    sweep = results.get("sweep")
    if sweep:
        one = sweep["one"]
        spec = Path(args.sweep)
        spec = spec.relative_to(ROOT) if spec.is_relative_to(ROOT) else spec
        lines += [f"The sweep: `{spec}`, `--budget {args.sweep_budget}` a search.", "",
                  "| run | wall s | speedup | per GPU | exit | kernels compiled | trials | layers |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for label, what, lanes in (("one", "one GPU", 1), ("mpi", f"`mpiexec -n {g}`", g)):
            r = sweep.get(label)
            if r:
                sp = one["wall_s"] / r["wall_s"]
                c = r["contents"]
                lines.append(f"| {what} | {r['wall_s']:.1f} | {sp:.2f}x | {sp / lanes:.2f} | "
                             f"{r['code']} | {r['compiled']} | {c['trials']} | {c['layers']} |")
        lines.append("")
    kill = results.get("kill")
    if kill:
        f, a = kill["first"], kill["again"]
        ranks = ", ".join(f"rank {i}: {c['trials']} trials, {c['binaries']} kernels, "
                          f"{c['layers']} layers" for i, c in enumerate(f["ranks_after_kill"]))
        ranks2 = ", ".join(f"rank {i}: {c['trials']} trials, {c['binaries']} kernels, "
                           f"{c['layers']} layers" for i, c in enumerate(a["ranks"]))
        said = "; ".join(f"`{s.strip()}`" for s in f["launcher_said"][:3]) or "(nothing)"
        lines += [f"A rank killed: `mpiexec -n {g}` tuning 2 layers of the model; rank 1 killed "
                  f"(SIGKILL) at {f['killed_at_s'] or math.nan:.1f} s, its database holding "
                  f"{f['held_at_kill']} {'trials' if args.gpu else 'kernels'}.", "",
                  f"- The job: exit {f['code']} after {f['wall_s']:.1f} s; the launcher: {said}.",
                  f"- Kept in the rank databases: {ranks}; merged database: "
                  f"{f['merged_after_kill']['layers']} layers.",
                  f"- The same job again: exit {a['code']}, {a['wall_s']:.1f} s, "
                  f"{a['compiled']} kernels compiled; {ranks2}; merged: "
                  f"{a['merged']['layers']} of {a['expected_layers']} layers; of the "
                  f"{a['kept_trials']} trials kept from the first run, {a['kept_rewritten']} "
                  "measured again.", ""]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stages", default="model,sweep,kill")
    ap.add_argument("--pattern", default="shflbw:64")
    ap.add_argument("--sparsity", type=float, default=0.75)
    ap.add_argument("--layers", type=int, default=12, help="the model's layers (BERT-base: 12)")
    ap.add_argument("--n", default="16,256,4096")
    ap.add_argument("--runs", default=",".join(RUNS),
                    help="the model stage's runs (one, the baseline, always runs)")
    ap.add_argument("--sweep", default=str(SWEEP))
    ap.add_argument("--sweep-budget", type=int, default=12, help="trials per sweep search")
    ap.add_argument("--ranks", type=int, help="MPI ranks (default: the GPUs; 2 without a GPU)")
    ap.add_argument("--kill-after", type=int, default=40,
                    help="rank 1 is killed once its database holds this many trials "
                         "(kernels, without a GPU)")
    ap.add_argument("--arch", help="passed to every command (without a GPU: what is compiled)")
    ap.add_argument("--extra", help="more flags for every command, e.g. '--budget 2 --jobs 1'")
    ap.add_argument("--work", default="/tmp/sparseforge-scale")
    ap.add_argument("--resume", action="store_true", help="keep the stages done in --work")
    ap.add_argument("--results", help="append the table to this markdown file")
    args = ap.parse_args(argv)
    args.runs = {"one", *(r.strip() for r in args.runs.split(",") if r.strip())}
    if args.runs - set(RUNS):
        ap.error(f"unknown runs {sorted(args.runs - set(RUNS))} ({', '.join(RUNS)})")
    from sparseforge.tuner import mpi
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    state = work / "scale.json"
    results = json.loads(state.read_text()) if args.resume and state.exists() else {}
    names = gpu_names()
    args.gpu = bool(names)
    ranks = args.ranks or max(2, len(names))
    launcher = mpi.launcher(ranks)
    version = subprocess.run([launcher[0], "--version"], capture_output=True, text=True).stdout
    results.update({"gpu_names": names, "launcher": launcher, "cores": os.cpu_count(),
                    "host": os.uname().nodename,
                    "mpi_version": _version(version)})
    runner = Runner(args)
    stages = {"model": stage_model, "sweep": stage_sweep, "kill": stage_kill}
    for name in [s.strip() for s in args.stages.split(",") if s.strip()]:
        if name not in stages:
            ap.error(f"unknown stage {name!r} (model, sweep, kill)")
        if name in results:
            print(f"[scale] {name}: kept from {state}", file=sys.stderr)
            continue
        results[name] = stages[name](args, runner, len(names), launcher)
        state.write_text(json.dumps(results, indent=1, default=str))
    from s1 import commit_id, publish
    publish(table(results, args, commit_id()), args.results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
