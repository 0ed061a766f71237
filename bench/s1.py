"""S1 prefill suite (DESIGN.md): tensor-core families against cuBLAS fp16
dense, measured side by side in one run on one GPU.

For every shape x family x density: a random pattern (generator.synth,
fixed seed, standard-normal values), tuned by the tuner (budgeted greedy
search; every candidate verified before its time counts, every trial in the
database), the winner's median time against cuBLAS's median (its best
layout) in the same run, and the winner's fraction of the roofline floor:
max(nonzero FLOPs / measured dense peak, bytes / measured copy bandwidth).
For bsr patterns of square blocks, cuSPARSE's Blocked-ELL SpMM on the same
pattern is timed too (same protocol, feature-major; --no-peer skips it).

    python3 bench/s1.py --db /tmp/s1.db --families shflbw:64,bsr:64x64 \
        --densities 0.25,0.1 --budget 24 --results bench/RESULTS.md
"""
from __future__ import annotations

import argparse
import datetime
import math
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

S1_SHAPES = [(3072, 768, 4096), (768, 3072, 4096), (4096, 1024, 8192), (1024, 4096, 8192),
             (11008, 4096, 4096), (4096, 4096, 4096)]

COPY_KERNEL = r"""
extern "C" __global__ void sf_copy(const int4* __restrict__ src, int4* __restrict__ dst, long n) {
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
    dst[i] = src[i];
}
"""


def measure_copy_bandwidth(ctx, nbytes=1 << 30) -> float:
    """Bytes read + written per second by a plain 16-byte copy kernel."""
    binary = ctx.compile(COPY_KERNEL, name="copy.cu")
    mod = ctx.load(binary)
    fn = mod.kernel("sf_copy")
    a, b = ctx.alloc(nbytes), ctx.alloc(nbytes)
    ctx.memset(a, 1)
    sms = ctx.device_info()["sm_count"]
    t = ctx.time(fn, (sms * 8, 1, 1), (512, 1, 1), [a, b, nbytes // 16], sig="PPq",
                 warmup=3, min_reps=20, min_total_ms=50, flush_l2=False)
    a.free()
    b.free()
    return 2 * nbytes / (t["median_ms"] * 1e-3)


L2_KERNEL = r"""
extern "C" __global__ void sf_l2_read(const int4* __restrict__ src, long n, int reps, int4* out) {
  int4 acc = make_int4(0, 0, 0, 0);
  for (int r = 0; r < reps; ++r)
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
      const int4 v = __ldcg(src + i);
      acc.x ^= v.x; acc.y ^= v.y; acc.z ^= v.z; acc.w ^= v.w;
    }
  if ((acc.x & acc.y & acc.z & acc.w) == -1) out[0] = acc;  // never true for the zero buffer
}
"""


def measure_l2_bandwidth(ctx, nbytes=16 << 20, reps=32) -> float:
    """Bytes per second that the SMs read out of L2: a 16 MB buffer (which
    L2 holds) read 32 times with 16-byte L2-only loads, not flushed."""
    binary = ctx.compile(L2_KERNEL, name="l2.cu")
    mod = ctx.load(binary)
    fn = mod.kernel("sf_l2_read")
    a, out = ctx.alloc(nbytes), ctx.alloc(16)
    ctx.memset(a, 0)
    sms = ctx.device_info()["sm_count"]
    t = ctx.time(fn, (sms * 4, 1, 1), (512, 1, 1), [a, nbytes // 16, reps, out], sig="PqiP",
                 warmup=3, min_reps=20, min_total_ms=50, flush_l2=False)
    a.free()
    out.free()
    return reps * nbytes / (t["median_ms"] * 1e-3)


def measure_dense_peak(ctx) -> float:
    t = ctx.time_gemm("fp16", 8192, 8192, 8192, layout="best", min_reps=10, min_total_ms=50)
    return 2 * 8192 ** 3 / (t["median_ms"] * 1e-3)


def sparse_bytes(m, k, n, nnz, elem=2):
    # nonzero weights + one index per stored column vector (approx.) + X once + Y once
    return nnz * elem + k * n * elem + m * n * elem


def publish(text: str, results=None) -> None:
    """Prints a results table and appends it to the markdown file `results`
    (when given)."""
    print(text)
    if results:
        with open(results, "a") as f:
            f.write("\n" + text.rstrip("\n") + "\n")


def commit_id() -> str:
    """SF_COMMIT where set (the GPU machine's copy of the tree has no
    history of its own), else git's HEAD."""
    if os.environ.get("SF_COMMIT"):
        return os.environ["SF_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()
        return out + ("+dirty" if dirty else "")
    except Exception:  # noqa: BLE001 - a copy without git history
        return os.environ.get("SF_COMMIT", "unknown")


def geomean(xs):
    xs = [x for x in xs if x == x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else math.nan


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", default="/tmp/sparseforge-s1.db")
    ap.add_argument("--families", default="shflbw:64,shflbw:32,bsr:64x64,bsr:32x32")
    ap.add_argument("--densities", default="0.25,0.1")
    ap.add_argument("--shapes", default="all", help="'all' or indices into S1, e.g. 0,5")
    ap.add_argument("--dtype", default="fp16", choices=["fp16", "bf16"])
    ap.add_argument("--budget", default="24", help="trials per problem (tuner --budget)")
    ap.add_argument("--strategy", default="greedy")
    ap.add_argument("--activation", default="none")
    ap.add_argument("--layout", default="fm", choices=["fm", "tm"],
                    help="feature-major (X is K x N; the default) or token-major (X is N x K, "
                         "as a Linear layer sees it)")
    ap.add_argument("--results", help="append the table to this markdown file")
    ap.add_argument("--label", default="", help="a note for the results heading")
    ap.add_argument("--no-variants", action="store_true",
                    help="skip the winner's bf16 and fused-epilogue (bias + GELU) measurements")
    ap.add_argument("--no-peer", action="store_true",
                    help="skip each family's own peer (cuSPARSE Blocked-ELL for bsr)")
    args = ap.parse_args(argv)

    from sparseforge import native
    from sparseforge.cache import Cache
    from sparseforge.generator.families import family_of
    from sparseforge.generator.kernel import Epilogue, Operation
    from sparseforge.generator.synth import random_matrix
    from sparseforge.tuner.driver import QUICK_TIMING, Tuner
    from sparseforge.tuner.model import Progress

    ok, why = native.gpu_available()
    if not ok:
        print(f"no GPU: {why}", file=sys.stderr)
        return 1
    ctx = native.Context(0)
    dev = ctx.device_info()
    bw = measure_copy_bandwidth(ctx)
    l2 = measure_l2_bandwidth(ctx)
    peak = measure_dense_peak(ctx)
    print(f"{dev['name']}: copy {bw / 1e12:.2f} TB/s, L2 read {l2 / 1e12:.2f} TB/s, "
          f"cuBLAS fp16 8192^3 {peak / 1e12:.0f} TFLOP/s", flush=True)
    shapes = S1_SHAPES if args.shapes == "all" else [S1_SHAPES[int(i)] for i in args.shapes.split(",")]
    densities = [float(d) for d in args.densities.split(",")]
    rows = []
    t0 = time.time()
    with Cache(args.db) as cache:
        tuner = Tuner(cache, strategy=args.strategy, budget=args.budget, timing=QUICK_TIMING,
                      progress=Progress(), seed=1)
        try:
            for pattern in args.families.split(","):
                family, params = family_of(pattern)
                fam = family.name
                for d in family.densities(params, densities):
                    for (m, k, n) in shapes:
                        mat = random_matrix(pattern, m, k, d, args.dtype, seed=0)
                        op = Operation(args.dtype, args.layout, Epilogue(activation=args.activation))
                        res = tuner.tune(mat, fam, params, op, [n], f"s1/{pattern}/d{d:g}/{m}x{k}")
                        nr = res.per_n[n]
                        flops = 2.0 * mat.nnz * n
                        floor_s = max(flops / peak, sparse_bytes(m, k, n, mat.nnz) / bw)
                        frac = floor_s / (nr.median_ms * 1e-3) if nr.median_ms == nr.median_ms else math.nan
                        row = dict(pattern=pattern, density=d, m=m, k=k, n=n, ms=nr.median_ms,
                                   cublas=nr.peer_ms, speedup=nr.speedup, roof=frac,
                                   err=nr.max_error, trials=nr.trials, failed=nr.failed,
                                   config=nr.config, bf16=math.nan, epi=math.nan, l2=math.nan,
                                   ell=math.nan, vs_ell=math.nan)
                        gathered = (family.gather_bytes(mat, params, n, nr.config)
                                    if nr.config else None)
                        if gathered is not None and nr.median_ms == nr.median_ms:
                            row["l2"] = gathered / l2 / (nr.median_ms * 1e-3)
                        if not args.no_variants and nr.config and args.dtype == "fp16":
                            row["bf16"], row["epi"] = measure_variants(tuner, pattern, fam, params, d,
                                                                       (m, k, n), nr.config,
                                                                       args.layout)
                        if not args.no_peer and family.peer:
                            row["ell"] = time_peer(ctx, family, mat, params, op, n)
                            row["vs_ell"] = row["ell"] / nr.median_ms
                        rows.append(row)
                        print(f"  {pattern:10s} d={d:<5g} {m}x{k}x{n}: {nr.median_ms:.4f} ms, cuBLAS "
                              f"{nr.peer_ms:.4f} ms, {nr.speedup:.2f}x, roofline {frac:.2f}, "
                              f"err {nr.max_error:.1e}, {nr.trials} trials; bf16 {row['bf16']:.4f} ms, "
                              f"bias+GELU {row['epi']:.4f} ms; cuSPARSE ELL {row['ell']:.4f} ms",
                              flush=True)
        finally:
            tuner.close()
            ctx.close()
    publish(format_table(rows, dev, bw, peak, args, l2), args.results)
    print(f"total {time.time() - t0:.0f} s", file=sys.stderr)
    return 0


def time_peer(ctx, family, mat, params, op, n) -> float:
    """The family's own peer (Family.time_peer: cuSPARSE Blocked-ELL for
    bsr) on `mat`, timed like the tuner's peer: its median ms, or NaN (with
    the reason printed) where it cannot run it."""
    from sparseforge import native
    from sparseforge.tuner.driver import QUICK_TIMING
    m, k = mat.shape
    try:
        t = family.time_peer(ctx, mat, params, op, n, QUICK_TIMING)
    except (native.SFError, ValueError) as e:
        print(f"    {family.peer} on {m}x{k}x{n}: {e}", flush=True)
        return math.nan
    return t["median_ms"]


def measure_variants(tuner, pattern, fam, params, d, shape, config, layout="fm"):
    """The winner's configuration again: on the same pattern in bf16, and
    in fp16 with a fused bias + GELU epilogue.  Both verified; NaN where a
    variant fails."""
    import numpy as np
    from sparseforge.generator.kernel import Epilogue, Operation
    from sparseforge.generator.synth import random_matrix
    m, k, n = shape
    out = []
    bias = np.random.default_rng(3).standard_normal(m).astype(np.float32)
    for dtype, ep in (("bf16", Epilogue()), ("fp16", Epilogue(bias=True, activation="gelu"))):
        mat = random_matrix(pattern, m, k, d, dtype, seed=0)
        status, info = tuner.measure(mat, fam, params, Operation(dtype, layout, ep), n, config,
                                     bias=bias if ep.bias else None)
        out.append(info["median_ms"] if status == "ok" else math.nan)
        if status != "ok":
            print(f"    {dtype} {ep.tag}: {status} {str(info)[:200]}", flush=True)
    return tuple(out)


def _or_dash(value: float, spec: str, suffix: str = "") -> str:
    """`value` formatted, or "-" for NaN (no measurement)."""
    return "-" if value != value else f"{value:{spec}}{suffix}"


def format_table(rows, dev, bw, peak, args, l2=math.nan) -> str:
    date = datetime.date.today().isoformat()
    layout = {"fm": "feature-major", "tm": "token-major"}[args.layout]
    out = [f"\n## S1 prefill, {args.dtype}, {layout}: {date}, {dev['name']}, commit {commit_id()}",
           "",
           f"Random patterns (seed 0, standard-normal values); tuner `{args.strategy}` with budget "
           f"{args.budget} per problem; quick timing (median of >= 10 runs, L2 flushed); cuBLAS "
           f"fp16 GemmEx in its faster layout, same run. Measured ceilings: copy "
           f"{bw / 1e12:.2f} TB/s, dense fp16 {peak / 1e12:.0f} TFLOP/s, L2 read {l2 / 1e12:.2f} TB/s. "
           f"Roofline = floor time / our time. L2 = time to read the gathered rows of X "
           f"(once per group) and the weights (once per tile of N) at the L2 read rate / our time. "
           f"{args.label}",
           "",
           "The winner's configuration is also run in bf16 (same pattern; bf16/fp16 = time ratio) "
           "and in fp16 with a fused bias + GELU epilogue (its extra time over none). For bsr "
           "patterns of square blocks, cuSPARSE Blocked-ELL SpMM (CUSPARSE_SPMM_BLOCKED_ELL_ALG1, "
           "fp32 compute, row-major X and Y) runs the same pattern with the same timing; vs ELL = "
           "its time / ours (- where not measured).",
           "",
           "| family | density | M x K x N | ours ms | cuBLAS ms | speedup | cuSPARSE ELL ms | vs ELL "
           "| roofline | L2 | max err | trials (failed) | bf16/fp16 | bias+GELU | config |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        cfg = ",".join(f"{k}{v}" for k, v in sorted((r["config"] or {}).items()))
        out.append(f"| {r['pattern']} | {r['density']:g} | {r['m']}x{r['k']}x{r['n']} | {r['ms']:.4f} | "
                   f"{r['cublas']:.4f} | {r['speedup']:.2f}x | {_or_dash(r['ell'], '.4f')} | "
                   f"{_or_dash(r['vs_ell'], '.2f', 'x')} | {r['roof']:.2f} | {r['l2']:.2f} | {r['err']:.1e} | "
                   f"{r['trials']} ({r['failed']}) | {r['bf16'] / r['ms']:.2f} | "
                   f"{100 * (r['epi'] / r['ms'] - 1):+.1f}% | {cfg} |")
    out += ["", "| family | density | geomean speedup | geomean vs ELL | geomean bf16/fp16 "
            "| geomean bias+GELU |",
            "| --- | --- | --- | --- | --- | --- |"]
    groups = {}
    for r in rows:
        groups.setdefault((r["pattern"], r["density"]), []).append(r)
    for (p, d), rs in groups.items():
        sp = geomean([r["speedup"] for r in rs])
        ve = geomean([r["vs_ell"] for r in rs])
        bf = geomean([r["bf16"] / r["ms"] for r in rs])
        ep = geomean([r["epi"] / r["ms"] for r in rs])
        out.append(f"| {p} | {d:g} | {sp:.2f}x | {_or_dash(ve, '.2f', 'x')} | {bf:.2f} | "
                   f"{100 * (ep - 1):+.1f}% |")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
