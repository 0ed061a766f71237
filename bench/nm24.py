"""2:4 (`nm24`) beside cuBLAS and cuSPARSELt, measured side by side in one
run on one GPU: S1 prefill (six shapes, N = 4096 / 8192) and S2 decode
((4096, 4096), (11008, 4096), (4096, 11008) x N = 16, 64), fp16, both
activation layouts.

For every problem: a random 2:4 pattern (two of every four along K kept,
fixed seed, standard-normal values), tuned by the tuner (budgeted greedy
search, every candidate verified against float64 before its time counts,
every trial in the database); cuBLAS fp16 in its faster layout timed by
the tuner in the same run; cuSPARSELt's 2:4 matmul on the same shape and
layout after its own configuration search (cusparseLtMatmulSearch), timed
by the same protocol.  Short kernels (N <= 256) are timed, ours and both
peers alike, as CUDA graphs of 16 launches rotating through copies of
their operands that hold twice the L2, so that the weights come from
device memory as in a model's forward pass; their HBM column is the bytes
moved (compressed weights, metadata, X, Y) over the time, as a fraction of
the measured copy bandwidth.

    python3 bench/nm24.py --db /tmp/nm24.db --results bench/RESULTS.md
    python3 bench/nm24.py --suites s2 --configs '[{"bm":64,...,"wg":1}]'   # probe configurations
    python3 bench/nm24.py --shapes 3072x1536x4096 --layouts tm --configs @c.json --rounds 3
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from s1 import S1_SHAPES, commit_id, geomean, measure_copy_bandwidth, measure_dense_peak  # noqa: E402

S2_SHAPES = [(4096, 4096, 16), (4096, 4096, 64), (11008, 4096, 16), (11008, 4096, 64),
             (4096, 11008, 16), (4096, 11008, 64)]


def nm24_bytes(m: int, k: int, n: int) -> int:
    """Bytes a 2:4 matmul must move: the kept half of W (2 bytes each), its
    metadata (4 bits per kept pair), X and Y once."""
    return m * k // 2 * 2 + m * k // 8 + k * n * 2 + m * n * 2


def time_sparselt(ctx, dtype, m, k, n, layout, timing) -> tuple[float, str]:
    """cuSPARSELt's median ms (NaN with the reason where it cannot run)."""
    from sparseforge import native
    try:
        t = ctx.time_sparselt(dtype, m, k, n, layout=layout, **timing)
    except (native.SFError, ValueError) as e:
        return math.nan, str(e)
    return t["median_ms"], f"alg {t['alg_id']}"


def problems(suites: str, shapes: str, layouts: str) -> list[tuple[str, tuple, str]]:
    """(suite, (M, K, N), layout) of a run: the suites' shapes, or exactly
    the `shapes` named (MxKxN, comma-separated), each under the suite that
    holds it, else "custom"."""
    known = {"s1": S1_SHAPES, "s2": S2_SHAPES}
    chosen = []
    for suite in suites.split(","):
        if suite not in known:
            raise ValueError(f"unknown suite {suite!r}: expected s1 or s2")
        chosen += [(suite, shape) for shape in known[suite]]
    if shapes:
        named = []
        for text in shapes.split(","):
            try:
                shape = tuple(int(v) for v in text.lower().split("x"))
            except ValueError:
                shape = ()
            if len(shape) != 3 or min(shape) < 1:
                raise ValueError(f"shape {text!r}: expected MxKxN of positive integers")
            named.append((next((s for s, sh in chosen if sh == shape),
                               next((s for s, sh in known.items() if shape in sh), "custom")),
                          shape))
        chosen = named
    return [(suite, shape, layout) for suite, shape in chosen for layout in layouts.split(",")]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", default="/tmp/sparseforge-nm24.db")
    ap.add_argument("--suites", default="s1,s2", help="s1, s2 or both")
    ap.add_argument("--layouts", default="fm,tm")
    ap.add_argument("--shapes", default="",
                    help="exactly these MxKxN, comma-separated (any shape, in or out of the suites)")
    ap.add_argument("--dtype", default="fp16", choices=["fp16", "bf16"])
    ap.add_argument("--budget", default="16", help="trials per problem (tuner --budget)")
    ap.add_argument("--strategy", default="greedy")
    ap.add_argument("--configs", help="a JSON list of configurations (or @FILE holding one): "
                                      "measure each on every problem instead of tuning (a probe)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="(--configs) rounds in which every configuration is measured in turn "
                         "(verified, then timed), for side-by-side comparisons")
    ap.add_argument("--no-variants", action="store_true",
                    help="skip the winner's bf16 and fused bias + GELU measurements")
    ap.add_argument("--results", help="append the table to this markdown file")
    ap.add_argument("--label", default="", help="a note for the results heading")
    args = ap.parse_args(argv)
    try:
        todo = problems(args.suites, args.shapes, args.layouts)
    except ValueError as e:
        ap.error(str(e))
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")

    import numpy as np

    from sparseforge import native
    from sparseforge.cache import Cache
    from sparseforge.generator.families import get_family
    from sparseforge.generator.kernel import ConfigError, Epilogue, Operation
    from sparseforge.generator.synth import random_matrix
    from sparseforge.tuner.driver import QUICK_TIMING, Tuner, timing_for
    from sparseforge.tuner.model import Progress

    ok, why = native.gpu_available()
    if not ok:
        print(f"no GPU: {why}", file=sys.stderr)
        return 1
    ctx = native.Context(0)
    dev = ctx.device_info()
    bw = measure_copy_bandwidth(ctx)
    peak = measure_dense_peak(ctx)
    print(f"{dev['name']}: copy {bw / 1e12:.2f} TB/s, cuBLAS fp16 8192^3 {peak / 1e12:.0f} TFLOP/s",
          flush=True)
    probe = None
    if args.configs:
        text = Path(args.configs[1:]).read_text() if args.configs.startswith("@") else args.configs
        probe = json.loads(text)
    rows = []
    t0 = time.time()
    with Cache(args.db) as cache:
        tuner = Tuner(cache, strategy=args.strategy, budget=args.budget, timing=QUICK_TIMING,
                      progress=Progress(), seed=1)
        try:
            for suite, (m, k, n), layout in todo:
                mat = random_matrix("nm24", m, k, 0.5, args.dtype, seed=0)
                op = Operation(args.dtype, layout, Epilogue())
                timing = timing_for(QUICK_TIMING, n, dev)
                lt_ms, lt_note = time_sparselt(ctx, args.dtype, m, k, n, layout, timing)
                if probe:
                    peer = ctx.time_gemm(args.dtype, m, n, k, layout="best", **timing)["median_ms"]
                    accepted = []
                    for cfg in probe:
                        try:
                            get_family("nm24").check_config(cfg, mat, op, {}, dev)
                            accepted.append(cfg)
                        except ConfigError as e:
                            print(f"  {suite} {m}x{k}x{n} {layout} {json.dumps(cfg, sort_keys=True)}: "
                                  f"skipped ({e})", flush=True)
                    if not accepted:
                        continue
                    # side by side: every configuration a trial in turn, round after round
                    status, infos = tuner.measure_rounds(mat, "nm24", {}, op, n, accepted,
                                                         args.rounds)
                    if status == "ok":
                        results = [(cfg, "ok", r) for cfg, r in zip(accepted, infos)]
                    else:   # one failed (it is named): each alone, so that the others report
                        print(f"  {suite} {m}x{k}x{n} {layout}: {status} {str(infos)[:300]}; "
                              "each configuration alone", flush=True)
                        results = []
                        for cfg in accepted:
                            st, inf = tuner.measure_rounds(mat, "nm24", {}, op, n, [cfg],
                                                           args.rounds)
                            results.append((cfg, st, inf[0] if st == "ok" else inf))
                    for cfg, st, rounds in results:
                        head = f"  {suite} {m}x{k}x{n} {layout} {json.dumps(cfg, sort_keys=True)}: {st}"
                        if st != "ok":
                            print(f"{head} {str(rounds)[:300]}", flush=True)
                            continue
                        ms = [r["median_ms"] for r in rounds]
                        mid = sorted(ms)[len(ms) // 2]   # the rounds' median
                        print(f"{head} " + " / ".join(f"{v:.4f}" for v in ms) + f" ms, "
                              f"{peer / mid:.2f}x cuBLAS ({peer:.4f}), {lt_ms / mid:.2f}x "
                              f"cuSPARSELt ({lt_ms:.4f}), "
                              f"HBM {nm24_bytes(m, k, n) / (mid * 1e-3) / bw:.2f}", flush=True)
                    continue
                res = tuner.tune(mat, "nm24", {}, op, [n], f"nm24/{suite}/{m}x{k}x{n}/{layout}")
                nr = res.per_n[n]
                row = dict(suite=suite, m=m, k=k, n=n, layout=layout, ms=nr.median_ms,
                           cublas=nr.peer_ms, lt=lt_ms, lt_note=lt_note, err=nr.max_error,
                           trials=nr.trials, failed=nr.failed, config=nr.config,
                           hbm=nm24_bytes(m, k, n) / (nr.median_ms * 1e-3) / bw,
                           bf16=math.nan, epi=math.nan)
                if not args.no_variants and nr.config and args.dtype == "fp16":
                    bias = np.random.default_rng(3).standard_normal(m).astype(np.float32)
                    for key, dtype, ep in (("bf16", "bf16", Epilogue()),
                                           ("epi", "fp16", Epilogue(bias=True, activation="gelu"))):
                        vmat = random_matrix("nm24", m, k, 0.5, dtype, seed=0)
                        status, info = tuner.measure(vmat, "nm24", {}, Operation(dtype, layout, ep),
                                                     n, nr.config, bias=bias if ep.bias else None)
                        row[key] = info["median_ms"] if status == "ok" else math.nan
                rows.append(row)
                print(f"  {suite} {m}x{k}x{n} {layout}: {nr.median_ms:.4f} ms, cuBLAS "
                      f"{nr.peer_ms:.4f} ({nr.speedup:.2f}x), cuSPARSELt {lt_ms:.4f} "
                      f"({lt_ms / nr.median_ms:.2f}x; {lt_note}), HBM {row['hbm']:.2f}, "
                      f"err {nr.max_error:.1e}, {nr.trials} trials, {nr.config}", flush=True)
        finally:
            tuner.close()
            ctx.close()
    if rows:
        table = format_table(rows, dev, bw, peak, args)
        print(table)
        if args.results:
            with open(args.results, "a") as f:
                f.write(table + "\n")
    print(f"total {time.time() - t0:.0f} s", file=sys.stderr)
    return 0


def format_table(rows, dev, bw, peak, args) -> str:
    date = datetime.date.today().isoformat()
    out = [f"\n## 2:4 (nm24) beside cuBLAS and cuSPARSELt, {args.dtype}: {date}, {dev['name']}, "
           f"commit {commit_id()}",
           "",
           f"Random 2:4 patterns (seed 0, standard-normal values); tuner `{args.strategy}` with "
           f"budget {args.budget} per problem; quick timing (median of >= 10 runs); N <= 256: "
           f"graphs of 16 launches rotating through operand copies of twice the L2, ours and both "
           f"peers alike (else L2 flushed between runs).  cuBLAS fp16 GemmEx in its faster layout; "
           f"cuSPARSELt after cusparseLtMatmulSearch, same layout as ours.  Measured: copy "
           f"{bw / 1e12:.2f} TB/s, dense fp16 {peak / 1e12:.0f} TFLOP/s.  HBM = (compressed W + "
           f"metadata + X + Y) / time / copy bandwidth.  {args.label}",
           "",
           "| suite | M x K x N | layout | ours ms | cuBLAS ms | vs cuBLAS | cuSPARSELt ms "
           "| vs cuSPARSELt | HBM | max err | trials (failed) | bf16/fp16 | bias+GELU | config |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]

    def fmt(v, spec, suffix=""):
        return "-" if v != v else f"{v:{spec}}{suffix}"

    for r in rows:
        cfg = ",".join(f"{k}{v}" for k, v in sorted((r["config"] or {}).items()))
        out.append(f"| {r['suite']} | {r['m']}x{r['k']}x{r['n']} | {r['layout']} | {r['ms']:.4f} | "
                   f"{r['cublas']:.4f} | {r['cublas'] / r['ms']:.2f}x | {fmt(r['lt'], '.4f')} | "
                   f"{fmt(r['lt'] / r['ms'], '.2f', 'x')} | {r['hbm']:.2f} | {r['err']:.1e} | "
                   f"{r['trials']} ({r['failed']}) | {fmt(r['bf16'] / r['ms'], '.2f')} | "
                   f"{fmt(100 * (r['epi'] / r['ms'] - 1), '+.1f', '%')} | {cfg} |")
    out += ["", "| suite | layout | geomean vs cuBLAS | geomean vs cuSPARSELt | worst vs cuSPARSELt "
            "| geomean bf16/fp16 |", "| --- | --- | --- | --- | --- | --- |"]
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["suite"], r["layout"]), []).append(r)
    for (suite, layout), rs in groups.items():
        vs_lt = [r["lt"] / r["ms"] for r in rs]
        out.append(f"| {suite} | {layout} | {geomean([r['cublas'] / r['ms'] for r in rs]):.2f}x | "
                   f"{fmt(geomean(vs_lt), '.2f', 'x')} | "
                   f"{fmt(min((v for v in vs_lt if v == v), default=math.nan), '.2f', 'x')} | "
                   f"{fmt(geomean([r['bf16'] / r['ms'] for r in rs]), '.2f')} |")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
