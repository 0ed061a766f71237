"""Tuning a whole BERT-base-sized model on one GPU: how long it takes from an
empty database, how many trials and compilations, where the time goes,
how long a second run takes, and how close the winners come to the
exhaustive best of the same space.

The model: 12 layers of q, k, v, o (768 x 768), up (3072 x 768) and down
(768 x 3072), seeded standard normal weights (generator/recipe.py), each
pruning of --prunings applied to every weight (by default two models: all
Shfl-BW 64 at 75%, all 2:4).  Per pruning, from an empty database with the
tuner's defaults (automatic strategy, default timing, early stop) and N =
--n: the first run (wall time, trials, kernels compiled, the phases), the
second run (served from the database), then --samples (matrix, N) pairs
spread over the shapes and N buckets are searched exhaustively (the
trials already measured are reused) and each winner is compared with the
best of its whole space.  A table is appended to --results.

    python3 bench/tune_model.py --results bench/RESULTS.md          # on a GPU
    python3 bench/tune_model.py --dry-run                            # no GPU: the plan

--dry-run builds and prunes the model and counts the work (matrices,
searches, the space and budget of each search for --arch) without a GPU.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import re
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

BERT_BASE = [("attention.query.weight", 768, 768), ("attention.key.weight", 768, 768),
             ("attention.value.weight", 768, 768), ("attention.output.weight", 768, 768),
             ("intermediate.weight", 3072, 768), ("output.weight", 768, 3072)]


def parse_pruning(text: str) -> tuple[str, float | None]:
    """'shflbw:64@0.75' -> ('shflbw:64', 0.75); 'nm24' -> ('nm24', None)."""
    pattern, _, sparsity = text.partition("@")
    return pattern.strip(), float(sparsity) if sparsity else None


def bert_recipe(pattern: str, sparsity: float | None, layers: int = 12, seed: int = 0) -> dict:
    """The BERT-base-sized model as a recipe: every weight pruned to `pattern`."""
    entry = {"pattern": pattern, **({"sparsity": sparsity} if sparsity is not None else {})}
    return {"seed": seed, "dtype": "fp16", "repeat": layers,
            "layer": [{"name": n, "shape": [m, k], **entry} for n, m, k in BERT_BASE]}


def build(recipe_dict: dict) -> list:
    """(name, matrix) per weight, drawn and pruned."""
    from sparseforge.generator import recipe
    recipe.check(recipe_dict, "the benchmark's model")
    return [(s.name, recipe.make_layer(recipe_dict, s)[0]) for s in recipe.layers(recipe_dict)]


def plan(mats, ns, arch: str) -> dict:
    """The work without a GPU: entries, searches, and for each search the
    space and the budget the automatic strategy gives it (cold for the
    first matrix of a family, shape and N; warm after)."""
    from sparseforge.generator.families import family_of
    from sparseforge.tuner.driver import Tuner, target_of_arch
    from sparseforge.tuner.model import plan_model
    entries = plan_model(mats, log=open(os.devnull, "w"))
    tuned = [e for e in entries if not e.skipped and not e.first]
    t = Tuner.__new__(Tuner)          # the search plan alone: no cache, no GPU
    t.budget_text, t.strategy = None, "auto"
    seen, searches, trials = set(), 0, 0
    spaces = {}
    for e in tuned:
        m = e.get_matrix()
        fam, params = family_of(e.pattern)
        shape_key = (e.pattern, m.rows, m.cols)
        if shape_key not in spaces:
            spaces[shape_key] = len(fam.search_space(m, e.op, params, target_of_arch(arch)))
        for n in ns:
            _, budget = t._search_plan(spaces[shape_key], warm=(shape_key, n) in seen)
            seen.add((shape_key, n))
            searches += 1
            trials += min(budget.max_trials or spaces[shape_key], spaces[shape_key])
    return {"matrices": len(entries), "tuned": len(tuned),
            "skipped": sum(1 for e in entries if e.skipped), "searches": searches,
            "planned_trials": trials,
            "spaces": {f"{p} {r}x{c}": n for (p, r, c), n in spaces.items()}}


def samples(rows, ns, count: int) -> list[tuple[str, int]]:
    """`count` (layer, N) pairs spread over the model: each kind of weight
    in turn (query, key, ..., output), alternately from the first block and
    the last, the N buckets in turn."""
    kinds: dict = {}
    for r in rows:
        if r.result is not None and r.result.measured and not r.result.note:
            kinds.setdefault(re.sub(r"^layers\.\d+\.", "", r.name), []).append(r.name)
    order = list(kinds.values())
    picks = []
    for k in range(min(count, sum(len(v) for v in order))):
        names = order[k % len(order)]
        picks.append((names[0] if k % 2 == 0 else names[-1], ns[k % len(ns)]))
    return list(dict.fromkeys(picks))


def run_pruning(args, label: str, mats, make_tuner=None) -> dict:
    """The first run, the second, the exhaustive samples of one pruning.
    `make_tuner(cache, **settings)` makes each run's tuner (default: the
    tuner on this machine's GPU; the tests pass one with a replaying
    worker).  What is done is kept beside the database (PRUNING.json); with
    args.resume a later call goes on from there."""
    from sparseforge.cache import Cache
    from sparseforge.generator.families import family_of
    from sparseforge.tuner.driver import Tuner
    from sparseforge.tuner.model import Progress, plan_model
    make_tuner = make_tuner or Tuner
    db = Path(args.db_dir) / f"{label.replace(':', '').replace('@', '-')}.db"
    state = db.with_suffix(".json")      # what is done, for --resume
    entries = plan_model(mats, log=open(os.devnull, "w"))
    by_name = {e.name: e for e in entries}
    out = None
    if getattr(args, "resume", False) and state.exists() and db.exists():
        out = json.loads(state.read_text())
        print(f"{label}: resuming after the runs of {state} "
              f"({len(out['samples'])} of {len(out['picks'])} samples done)", file=sys.stderr)
    else:
        for side in ("", "-wal", "-shm"):
            Path(str(db) + side).unlink(missing_ok=True)
        state.unlink(missing_ok=True)
        out = _runs(args, label, db, entries, make_tuner)
        state.write_text(json.dumps(out, default=str))
    with Cache(db) as cache:
        tuner = make_tuner(cache, strategy="exhaustive", progress=Progress())
        try:
            for name, n, winner_ms, winner_trials, *rest in out["picks"][len(out["samples"]):]:
                winner_cfg = rest[0] if rest else None
                e = by_name[name]
                fam, params = family_of(e.pattern)
                res = tuner.tune(e.get_matrix(), fam.name, params, e.op, [n], name + "#exhaustive",
                                 force=True)
                best = res.per_n[n]
                space = len(fam.search_space(e.get_matrix(), e.op, params, tuner.target))
                retimed = _side_by_side(tuner, e, fam.name, params, n, winner_cfg, best.config)
                out["samples"].append({"layer": name, "n": n, "winner_ms": winner_ms,
                                       "winner_trials": winner_trials, "best_ms": best.median_ms,
                                       "space": space, "ratio": winner_ms / best.median_ms,
                                       "retimed": retimed})
                state.write_text(json.dumps(out, default=str))   # a call cut short keeps it
                print(f"{label}: sample {name} N={n}: winner {winner_ms:.4f} ms, "
                      f"exhaustive best {best.median_ms:.4f} ms of {space} "
                      f"({out['samples'][-1]['ratio']:.3f}; side by side {retimed:.3f})",
                      file=sys.stderr, flush=True)
        finally:
            tuner.close()
    return out


RETIME_ROUNDS = 5


def _side_by_side(tuner, entry, pattern: str, params: dict, n: int, winner_cfg, best_cfg) -> float:
    """The winner's time over the exhaustive best's, both measured again
    in alternation on one X (RETIME_ROUNDS rounds, each a full trial:
    verified, then timed), medians compared.  The best of a whole space is the
    fastest of hundreds of noisy measurements, so its searched time sits
    low by the noise; measured side by side the two are on equal terms.
    NaN where a configuration is unknown or a measurement fails."""
    if winner_cfg is None or best_cfg is None:
        return math.nan
    if winner_cfg == best_cfg:
        return 1.0
    status, infos = tuner.measure_rounds(entry.get_matrix(), pattern, params, entry.op, n,
                                         [winner_cfg, best_cfg], RETIME_ROUNDS)
    if status != "ok":
        return math.nan
    winner, best = ([info["median_ms"] for info in trials] for trials in infos)
    return statistics.median(winner) / statistics.median(best)


def _runs(args, label: str, db: Path, entries, make_tuner) -> dict:
    """The first and the second run from an empty database, and the
    samples to search exhaustively (with their winners' times)."""
    from sparseforge.cache import Cache
    from sparseforge.tuner.model import Progress, tune_entries
    out = {"pruning": label, "samples": []}
    for run in ("first", "second"):
        with Cache(db) as cache:
            tuner = make_tuner(cache, progress=Progress(), retime=False)   # as `sparseforge tune` reruns
            try:
                t0 = time.monotonic()
                rows = tune_entries(entries, tuner, args.n)
                wall = time.monotonic() - t0
            finally:
                tuner.close()
            if run == "first":
                first_rows = rows          # the winners as the search recorded them
            out[run] = {"wall_s": wall, "compiled": tuner.compiled,
                        "trials": len([t for t in cache.trials(tuner.env_key)
                                       if t["matrix_fp"] != "dense"]),
                        "phases": tuner.phases.format(wall=wall, threads=tuner.jobs)}
            out["gpu"] = tuner.device["name"]
            out["driver"] = tuner.device.get("driver_version")
            r = out[run]    # as it happens: a run cut short still tells this much
            print(f"{label}: {run} run {r['wall_s']:.1f} s, {r['trials']} trials, "
                  f"{r['compiled']} compiled; {r['phases']}", file=sys.stderr, flush=True)
    out["picks"] = []
    for name, n in samples(first_rows, args.n, args.samples):
        winner = next(r for r in first_rows if r.name == name).result.per_n[n]
        out["picks"].append([name, n, winner.median_ms, winner.trials, winner.config])
    return out


def table(results: list[dict], args, commit: str) -> str:
    r0 = results[0]
    lines = [f"## Tuning a BERT-base-sized model: {datetime.date.today()}, {r0['gpu']} "
             f"(driver {r0['driver']}), commit {commit}", "",
             f"`python3 bench/tune_model.py` ({args.layers} layers of q, k, v, o 768 x 768, "
             f"up 3072 x 768, down 768 x 3072; seeded weights), N = "
             f"{', '.join(map(str, args.n))}, the tuner's defaults, from an empty database.", "",
             "| pruning | first run | trials | kernels compiled | second run | compiled |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in results:
        f, s = r["first"], r["second"]
        lines.append(f"| {r['pruning']} | {f['wall_s']:.0f} s | {f['trials']} | {f['compiled']} "
                     f"| {s['wall_s']:.1f} s | {s['compiled']} |")
    lines += ["", "Where the first run's time went:", ""]
    lines += [f"- {r['pruning']}: {r['first']['phases']}" for r in results]
    lines += ["", "Sampled (layer, N): the winner against the best of the whole space "
              "(exhaustive; the trials already measured reused), as searched and measured "
              f"again side by side ({RETIME_ROUNDS} alternating rounds each, medians):", "",
              "| pruning | layer | N | winner ms | its trials | exhaustive best ms | space | "
              "winner / best | side by side |",
              "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in results:
        for s in r["samples"]:
            lines.append(f"| {r['pruning']} | {s['layer']} | {s['n']} | {s['winner_ms']:.4f} | "
                         f"{s['winner_trials']} | {s['best_ms']:.4f} | {s['space']} | "
                         f"{s['ratio']:.3f} | {s.get('retimed', math.nan):.3f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prunings", default="shflbw:64@0.75,nm24",
                    help="comma-separated PATTERN[@SPARSITY], one model each")
    ap.add_argument("--layers", type=int, default=12, help="transformer layers (BERT-base: 12)")
    ap.add_argument("--n", default="16,256,4096", help="N buckets")
    ap.add_argument("--samples", type=int, default=6, help="(layer, N) pairs searched exhaustively")
    ap.add_argument("--db-dir", default="/tmp/sparseforge-bench")
    ap.add_argument("--arch", default="sm_90a", help="--dry-run: the architecture planned for")
    ap.add_argument("--results", help="append the table to this markdown file")
    ap.add_argument("--resume", action="store_true",
                    help="keep the runs recorded in --db-dir (PRUNING.json beside its database) "
                         "and go on with the samples not done yet: a benchmark longer than one "
                         "sitting, run in parts")
    ap.add_argument("--dry-run", action="store_true",
                    help="build and prune the model and count the work; no GPU")
    args = ap.parse_args(argv)
    args.n = [int(x) for x in args.n.split(",")]
    prunings = [parse_pruning(p) for p in args.prunings.split(",") if p.strip()]
    results = []
    for pattern, sparsity in prunings:
        label = pattern + (f"@{sparsity:g}" if sparsity is not None else "")
        t0 = time.monotonic()
        mats = build(bert_recipe(pattern, sparsity, args.layers))
        print(f"{label}: {len(mats)} weights built and pruned in {time.monotonic() - t0:.1f} s",
              file=sys.stderr)
        if args.dry_run:
            p = plan(mats, args.n, args.arch)
            print(f"{label}: {p['matrices']} matrices ({p['tuned']} tuned, {p['skipped']} "
                  f"skipped), {p['searches']} searches, about {p['planned_trials']} trials on "
                  f"{args.arch}; spaces: "
                  + ", ".join(f"{k}: {v}" for k, v in p["spaces"].items()))
            results.append(p)
            continue
        from sparseforge import native
        ok, why = native.gpu_available()
        if not ok:
            print(f"tune_model: no GPU ({why}); --dry-run counts the work without one",
                  file=sys.stderr)
            return 1
        Path(args.db_dir).mkdir(parents=True, exist_ok=True)
        results.append(run_pruning(args, label, mats))
        print(json.dumps(results[-1], indent=1, default=str), file=sys.stderr)
    if args.dry_run:
        return 0
    from s1 import commit_id, publish
    publish(table(results, args, commit_id()), args.results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
