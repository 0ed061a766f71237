"""Measures the budgeted strategy's claim: within 5% of the exhaustive best
with at most a quarter of the trials.

For each problem, every configuration of the space is measured on the GPU
(exhaustive, recorded in the database like any tuning run).  Then the
budgeted strategies are replayed on those recorded timings, many seeds each,
with a budget of 25% of the space: a replay asks for configurations and gets
the recorded times, exactly as the tuner's evaluate() serves resumed trials.

    python3 bench/strategy_claim.py --db /tmp/claim.db --results bench/RESULTS.md
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PROBLEMS = [("shflbw:64", 0.25, (4096, 4096, 4096)), ("bsr:32x32", 0.10, (4096, 1024, 8192)),
            ("nm24", 0.5, (3072, 768, 4096))]


def replay(name, space, table, seeds=30):
    from sparseforge.tuner.strategies import Budget, config_key, get_strategy
    best = min(table.values())
    hits, ratios = 0, []
    for seed in range(seeds):
        budget = Budget(max_trials=max(1, len(space) // 4))
        seen = {}

        def evaluate(batch):
            budget.trials += len(batch)
            out = [table.get(config_key(c), math.inf) for c in batch]
            for c, t in zip(batch, out):
                seen[config_key(c)] = t
            return out

        get_strategy(name).run(space, evaluate, budget, seed=seed)
        found = min(seen.values())
        ratios.append(found / best)
        hits += found <= 1.05 * best
    return hits, seeds, sum(ratios) / len(ratios), max(ratios)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", default="/tmp/sparseforge-claim.db")
    ap.add_argument("--problems", default="all", help="'all' or indices into PROBLEMS")
    ap.add_argument("--results")
    args = ap.parse_args(argv)
    from sparseforge.cache import Cache
    from sparseforge.generator.families import get_family, parse_pattern
    from sparseforge.generator.kernel import Operation
    from sparseforge.generator.synth import random_matrix
    from sparseforge.tuner.driver import QUICK_TIMING, Tuner
    from sparseforge.tuner.model import Progress
    from sparseforge.tuner.strategies import config_key
    sys.path.insert(0, str(ROOT / "bench"))
    from s1 import commit_id

    probs = PROBLEMS if args.problems == "all" else [PROBLEMS[int(i)] for i in args.problems.split(",")]
    lines = []
    with Cache(args.db) as cache:
        tuner = Tuner(cache, strategy="exhaustive", timing=QUICK_TIMING, progress=Progress(), seed=1,
                      peer=False)
        try:
            for pattern, d, (m, k, n) in probs:
                fam_name, params = parse_pattern(pattern)
                mat = random_matrix(pattern, m, k, d, "fp16", seed=0)
                op = Operation("fp16", "fm")
                res = tuner.tune(mat, fam_name, params, op, [n], f"claim/{pattern}/{m}x{k}", force=True)
                space = get_family(fam_name).search_space(mat, op, params, tuner.device)
                table = {}
                for t in cache.trials(tuner.env_key, mat.fingerprint(), res.op_tag, n):
                    table[config_key(json.loads(t["config"]))] = (
                        t["median_ms"] if t["status"] == "ok" else math.inf)
                ok = sum(1 for v in table.values() if math.isfinite(v))
                for strat in ("greedy", "random"):
                    hits, seeds, mean_r, worst = replay(strat, space, table)
                    lines.append(f"| {pattern} d={d:g} {m}x{k}x{n} | {len(space)} ({ok} ok) | "
                                 f"{len(space) // 4} | {strat} | {hits}/{seeds} | {mean_r:.3f} | {worst:.3f} |")
                    print(lines[-1], flush=True)
        finally:
            tuner.close()
    out = [f"\n## Budgeted search vs exhaustive: {datetime.date.today().isoformat()}, "
           f"{tuner.device['name']}, commit {commit_id()}", "",
           "Every configuration measured once (quick timing, verified); strategies replayed on those "
           "timings with a budget of a quarter of the space, 30 seeds each. 'within 5%' counts the "
           "seeds whose best found is within 5% of the exhaustive best; ratios are found/best.", "",
           "| problem | space (ok) | budget | strategy | within 5% | mean ratio | worst ratio |",
           "| --- | --- | --- | --- | --- | --- | --- |"] + lines
    text = "\n".join(out)
    print(text)
    if args.results:
        with open(args.results, "a") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
