"""Unstructured sparsity (the csr family) against cuBLAS and cuSPARSE CSR,
measured side by side in one run on one GPU (issue 19's suites):

    decode   (M, K) = (4096, 4096), (11008, 4096), (4096, 11008) x N = 16, 64,
             density 0.5, 0.3, 0.1, fp16; target vs cuBLAS >= 1.25x / 1.9x /
             3.5x per row (the weight bytes allow about 1.7x / 2.5x / 5.2x)
    prefill  the same shapes at N = 4096, density 0.3 and 0.1; target >= 1.0x
    dlmc     the DLMC subset (../shared/data/dlmc) in fp16 and in fp32; N from
             rn50_batchsizes.txt (ResNet-50) or 256 (Transformer), and 8 times
             that; fp32 against SGEMM (no TF32): geomean goals 3.4x / 5.4x at
             90% / 95% sparsity (floors 2.5x / 3.5x)

Decode and prefill matrices are standard normal weights magnitude-pruned to
the density (a random pattern; fixed seeds); DLMC values are drawn from a
seeded generator.  Every problem is tuned (budgeted greedy search from the
family's hints; every candidate verified against float64 before its time
counts); cuBLAS runs the same shape and dtype in its faster layout, and
cuSPARSE CSR SpMM (its fastest CSR algorithm) the same pattern, both with
the same protocol: short kernels (N <= 256) as CUDA graphs of 16 launches
rotating W, X and Y through copies holding twice the L2.  Every fp16 row is
also run in bf16 with the winner's configuration (target: within 3%).

    python3 bench/csr.py --results bench/RESULTS.md                  # all suites
    python3 bench/csr.py --suites decode --layout tm --budget 24 --only 11008x4096
    python3 bench/csr.py --dry-run [--small]                         # no GPU

--dry-run makes every problem's matrix, counts each search space and
compiles the family's hint kernels for --arch (sm_90a): what the GPU run
will build, checked without one.  --small shrinks decode and prefill
shapes 16-fold (quick checks).
"""
from __future__ import annotations

import argparse
import datetime
import math
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

SHAPES = [(4096, 4096), (11008, 4096), (4096, 11008)]
DECODE_N = (16, 64)
DECODE_DENSITIES = (0.5, 0.3, 0.1)
DECODE_TARGET = {0.5: 1.25, 0.3: 1.9, 0.1: 3.5}
PREFILL_N = 4096
PREFILL_DENSITIES = (0.3, 0.1)
PREFILL_TARGET = 1.0
CUSPARSE_TARGET = 2.0            # every fp16 row against cuSPARSE CSR fp16
BF16_SLACK = 1.03                # bf16 within 3% of fp16
DLMC_FP32_GOAL = {0.9: (3.4, 2.5), 0.95: (5.4, 3.5)}   # sparsity: (goal, floor)
DLMC_BATCH = 8
TRANSFORMER_N = 256


@dataclass
class Problem:
    suite: str
    name: str
    m: int
    k: int
    n: int
    dtype: str
    density: float                    # of the pattern (measured for DLMC)
    make: object = None               # () -> SparseMatrix
    group: str = ""                   # rows that share a geomean / target
    target: float = math.nan          # vs cuBLAS
    row: dict = field(default_factory=dict)


def pruned_normal(m: int, k: int, density: float, dtype: str, seed: int, pattern: str = "csr"):
    """Standard normal weights, magnitude-pruned to `density` by the
    pattern's own pruning (csr's: the largest |w|; a block family keeps
    the blocks of largest |w|, and its permutation, if it finds one)."""
    import numpy as np
    from sparseforge.generator.families import family_of
    from sparseforge.generator.matrix import SparseMatrix
    fam, params = family_of(pattern)
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((m, k), dtype=np.float32)
    pruned = fam.prune(w, params, 1.0 - density, rng)
    w[~pruned.mask] = 0.0
    mat = SparseMatrix.from_dense(w, dtype=dtype)
    mat.perm = pruned.perm
    mat.name = f"normal {m}x{k} d={density:g}"
    return mat


def dlmc_dir() -> Path:
    import os
    env = os.environ.get("SPARSEFORGE_DLMC")
    return Path(env) if env else ROOT.parent / "shared" / "data" / "dlmc"


def problems(suites: list[str], small: bool = False) -> list[Problem]:
    """Every problem of the suites, in order (matrices made when asked)."""
    scale = 16 if small else 1
    out = []
    for (m, k) in SHAPES:
        m_, k_ = m // scale, k // scale
        for d in DECODE_DENSITIES if "decode" in suites else ():
            for n in DECODE_N:
                out.append(Problem("decode", f"{m_}x{k_}", m_, k_, n, "fp16", d,
                                   lambda m_=m_, k_=k_, d=d: pruned_normal(m_, k_, d, "fp16", 0),
                                   f"decode d={d:g}", DECODE_TARGET[d]))
        for d in PREFILL_DENSITIES if "prefill" in suites else ():
            out.append(Problem("prefill", f"{m_}x{k_}", m_, k_, PREFILL_N // scale, "fp16", d,
                               lambda m_=m_, k_=k_, d=d: pruned_normal(m_, k_, d, "fp16", 0),
                               f"prefill d={d:g}", PREFILL_TARGET))
    if "dlmc" in suites:
        out += dlmc_problems(small)
    out.sort(key=lambda p: ["decode", "prefill", "dlmc"].index(p.suite))
    return out


def dlmc_problems(small: bool) -> list[Problem]:
    """The DLMC subset, fp16 and fp32, at its N and 8 times it."""
    from sparseforge.generator.io import load_one
    base = dlmc_dir()
    if not base.is_dir():
        raise SystemExit(f"DLMC subset not found at {base} (set SPARSEFORGE_DLMC)")
    sizes = {}
    table = base / "rn50_batchsizes.txt"
    for line in table.read_text().splitlines():
        name, _, n = line.strip().partition(",")
        if n.strip().isdigit():
            sizes[name.strip()] = int(n)
    out = []
    for path in sorted(base.rglob("*.smtx")):
        model = path.relative_to(base).parts[0]
        sparsity = float(path.parent.name)
        head = path.read_text().split("\n", 1)[0]
        m, k, nnz = (int(v) for v in head.replace(",", " ").split())
        n1 = sizes.get(path.stem, TRANSFORMER_N) if model == "rn50" else TRANSFORMER_N
        for dtype in ("fp16", "fp32"):
            for n in (n1, n1 * DLMC_BATCH):
                n = max(1, n // 16) if small else n
                out.append(Problem("dlmc", f"{model}/{sparsity:g}/{path.stem}", m, k, n, dtype,
                                   nnz / (m * k),
                                   lambda path=path, dtype=dtype: load_one(str(path), seed=0,
                                                                           dtype=dtype),
                                   f"{model} {sparsity:g} {dtype}"))
    return out


# ---- measuring -----------------------------------------------------------------------------

def selected(args) -> list[Problem]:
    """The suites' problems, those named by --only where given."""
    probs = problems(args.suites.split(","), args.small)
    if args.densities:
        keep = {round(float(d), 3) for d in args.densities.split(",")}
        probs = [p for p in probs if p.suite == "dlmc" or round(p.density, 3) in keep]
    if args.dtypes:
        probs = [p for p in probs if p.dtype in args.dtypes.split(",")]
    if args.n:
        probs = [p for p in probs if p.n in {int(v) for v in args.n.split(",")}]
    return [p for p in probs if args.only in p.name] if args.only else probs


def run(args) -> int:
    from sparseforge import native
    from sparseforge.cache import Cache
    from sparseforge.generator.families import get_family
    from sparseforge.generator.kernel import Operation
    from sparseforge.tuner.driver import QUICK_TIMING, Tuner, timing_for
    from sparseforge.tuner.model import Progress
    from s1 import measure_copy_bandwidth

    ok, why = native.gpu_available()
    if not ok:
        print(f"no GPU: {why} (--dry-run checks the plan without one)", file=sys.stderr)
        return 1
    fam = get_family("csr")
    ctx = native.Context(0)
    dev = ctx.device_info()
    bw = measure_copy_bandwidth(ctx)
    print(f"{dev['name']}: copy {bw / 1e12:.2f} TB/s", flush=True)
    probs = selected(args)
    t0 = time.time()
    with Cache(args.db) as cache:
        tuner = Tuner(cache, strategy=args.strategy, budget=args.budget, timing=QUICK_TIMING,
                      progress=Progress(), seed=1)
        def _stop(signum, frame):  # `timeout` and the like: report the rows measured so far
            raise KeyboardInterrupt
        signal.signal(signal.SIGTERM, _stop)
        try:
            for p in probs:
                mat = p.make()
                op = Operation(p.dtype, args.layout)
                res = tuner.tune(mat, "csr", {}, op, [p.n], f"csr/{p.suite}/{p.name}/"
                                 f"d{p.density:.3g}/{p.dtype}")
                nr = res.per_n[p.n]
                row = dict(ms=nr.median_ms, cublas=nr.peer_ms, speedup=nr.speedup,
                           err=nr.max_error, trials=nr.trials, failed=nr.failed,
                           config=nr.config, cusparse=math.nan, bf16=math.nan)
                try:
                    if args.no_peer:
                        raise ValueError("not timed (--no-peer)")
                    t = fam.time_peer(ctx, mat, {}, op, p.n, timing_for(QUICK_TIMING, p.n, dev))
                    row["cusparse"] = t["median_ms"]
                except (native.SFError, ValueError) as e:
                    print(f"    cuSPARSE CSR on {p.name} N={p.n}: {e}", flush=True)
                if p.dtype == "fp16" and nr.config and not args.no_bf16:
                    status, info = tuner.measure(mat.astype("bf16"), "csr", {},
                                                 Operation("bf16", args.layout), p.n, nr.config)
                    row["bf16"] = info["median_ms"] if status == "ok" else math.nan
                    if status != "ok":
                        print(f"    bf16: {status} {str(info)[:200]}", flush=True)
                p.row = row
                print(f"  {p.suite:7s} {p.name:24s} d={p.density:.3f} N={p.n:5d} {p.dtype}: "
                      f"{row['ms']:.4f} ms, cuBLAS {row['cublas']:.4f} ms ({row['speedup']:.2f}x), "
                      f"cuSPARSE {row['cusparse']:.4f} ms, bf16 {row['bf16']:.4f} ms, "
                      f"{row['config']}", flush=True)
        except KeyboardInterrupt:
            done = sum(1 for p in probs if p.row)
            print(f"stopped after {done} of {len(probs)} problems: reporting those", flush=True)
            args.label = (args.label + " " if args.label else "") + \
                f"Cut short: {done} of {len(probs)} problems measured."
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            tuner.close()
            ctx.close()
    text = report(probs, dev["name"], bw, args)
    print(text)
    if args.results:
        with open(args.results, "a") as f:
            f.write(text + "\n")
    print(f"total {time.time() - t0:.0f} s", file=sys.stderr)
    return 0


# ---- the report ---------------------------------------------------------------------------

def _f(v: float, spec: str = ".4f", suffix: str = "") -> str:
    return "-" if v != v else f"{v:{spec}}{suffix}"


def report(probs: list[Problem], gpu: str, bw: float, args) -> str:
    from s1 import commit_id, geomean
    from sparseforge.generator.families.csr import speedup_limit
    date = datetime.date.today().isoformat()
    out = [f"\n## csr (unstructured) against cuBLAS and cuSPARSE CSR: {date}, {gpu}, "
           f"commit {commit_id()}", "",
           f"bench/csr.py, layout {args.layout}; tuner `{args.strategy}`, budget {args.budget} "
           f"per problem, quick timing; N <= 256 timed as graphs of 16 launches rotating W, X "
           f"and Y through twice the L2 (ours, cuBLAS and cuSPARSE alike). cuBLAS: GemmEx in "
           f"the same dtype (fp32: no TF32), its faster layout; cuSPARSE: SpMM CSR in the same "
           f"dtype, its fastest CSR algorithm. Decode and prefill: standard normal weights "
           f"magnitude-pruned (seed 0); DLMC: pattern from the file, values drawn (seed 0). "
           f"Copy bandwidth {bw / 1e12:.2f} TB/s. {args.label}", "",
           "| suite | matrix | density | N | dtype | ours ms | cuBLAS ms | vs cuBLAS | target "
           "| limit | cuSPARSE ms | vs cuSPARSE | bf16/fp16 | max err | trials (failed) | config |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- "
           "| --- | --- |"]
    for p in probs:
        r = p.row
        if not r:
            continue
        cfg = ",".join(f"{k}{v}" for k, v in sorted((r["config"] or {}).items()))
        # (the limit of the format the row's kernel uses)
        limit = speedup_limit(p.density, r["config"]) if p.suite == "decode" else math.nan
        out.append(f"| {p.suite} | {p.name} | {p.density:.3f} | {p.n} | {p.dtype} | "
                   f"{_f(r['ms'])} | {_f(r['cublas'])} | {_f(r['speedup'], '.2f', 'x')} | "
                   f"{_f(p.target, '.2f', 'x')} | {_f(limit, '.2f', 'x')} | {_f(r['cusparse'])} | "
                   f"{_f(r['cusparse'] / r['ms'], '.2f', 'x')} | {_f(r['bf16'] / r['ms'], '.3f')} | "
                   f"{_f(r['err'], '.1e')} | {r['trials']} ({r['failed']}) | {cfg} |")
    out += ["", "| group | rows | min vs cuBLAS | geomean vs cuBLAS | target | met "
            "| min vs cuSPARSE | max bf16/fp16 |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    groups: dict = {}
    for p in probs:
        if p.row:
            groups.setdefault(p.group, []).append(p)
    for g, ps in groups.items():
        sp = [p.row["speedup"] for p in ps]
        vs = [p.row["cusparse"] / p.row["ms"] for p in ps]
        bf = [p.row["bf16"] / p.row["ms"] for p in ps if p.row["bf16"] == p.row["bf16"]]
        target, met = ps[0].target, "-"
        gm = geomean(sp)
        sparsity = round(1 - ps[0].density, 2) if ps[0].suite == "dlmc" else None
        if ps[0].suite == "dlmc" and ps[0].dtype == "fp32" and sparsity in DLMC_FP32_GOAL:
            goal, floor = DLMC_FP32_GOAL[sparsity]
            target, met = goal, ("goal" if gm >= goal else "floor" if gm >= floor else "no")
        elif target == target:
            met = "yes" if min(sp) >= target else "no"
        out.append(f"| {g} | {len(ps)} | {_f(min(sp), '.2f', 'x')} | {_f(gm, '.2f', 'x')} | "
                   f"{_f(target, '.2f', 'x')} | {met} | "
                   f"{_f(min(v for v in vs) if vs else math.nan, '.2f', 'x')} | "
                   f"{_f(max(bf) if bf else math.nan, '.3f')} |")
    fp16 = [p for p in probs if p.row and p.dtype == "fp16"]
    if fp16:
        worst = min(p.row["cusparse"] / p.row["ms"] for p in fp16)
        out.append("")
        out.append(f"fp16 rows against cuSPARSE CSR fp16: min {_f(worst, '.2f', 'x')} "
                   f"(target >= {CUSPARSE_TARGET:g}x).")
    return "\n".join(out)


# ---- without a GPU ------------------------------------------------------------------------

def dry_run(args) -> int:
    """The problems, their matrices, the spaces, and the hint kernels
    compiled for --arch: what a GPU run builds."""
    from sparseforge import native
    from sparseforge.generator.families import get_family
    from sparseforge.generator.kernel import Operation
    from sparseforge.tuner.driver import target_of_arch
    fam = get_family("csr")
    ctx = native.Context(0)
    device = target_of_arch(args.arch)
    probs = selected(args)
    made: dict = {}
    compiled: set = set()
    total = 0
    print(f"{len(probs)} problems ({args.suites}), layout {args.layout}, kernels for {args.arch}")
    for p in probs:
        key = (p.suite if p.suite != "prefill" else "decode", p.name, p.dtype, p.density)
        if key not in made:
            made[key] = p.make()
        mat = made[key]
        op = Operation(p.dtype, args.layout)
        space = fam.search_space(mat, op, {}, device)
        hints = fam.hint_configs(mat, op, {}, device)
        t0 = time.time()
        built = 0
        for cfg in hints[:args.compile]:
            if (key, str(sorted(cfg.items()))) in compiled:
                continue                  # N does not change the kernel
            compiled.add((key, str(sorted(cfg.items()))))
            k = fam.generate(mat, op, {}, cfg)
            ctx.compile(k.source, arch=args.arch, name=k.name + ".cu", options=k.options)
            built += 1
        total += built
        print(f"  {p.suite:7s} {p.name:28s} {mat.rows}x{mat.cols} nnz {mat.nnz} "
              f"(d={mat.density:.3f}) N={p.n} {p.dtype}: space {len(space)}, "
              f"{len(hints)} hints, {built} compiled ({time.time() - t0:.1f} s)", flush=True)
    ctx.close()
    print(f"{total} kernels compiled; nothing was measured (dry run)")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suites", default="decode,prefill,dlmc")
    ap.add_argument("--layout", default="tm", choices=["fm", "tm"],
                    help="X and Y layout (tm: as a Linear layer sees them)")
    ap.add_argument("--db", default="/tmp/sparseforge-csr.db")
    ap.add_argument("--budget", default="24", help="trials per problem (tuner --budget)")
    ap.add_argument("--strategy", default="greedy")
    ap.add_argument("--results", help="append the tables to this markdown file")
    ap.add_argument("--label", default="", help="a note for the results heading")
    ap.add_argument("--no-bf16", action="store_true", help="skip the bf16 runs of fp16 rows")
    ap.add_argument("--no-peer", action="store_true",
                    help="skip cuSPARSE CSR (its column says so)")
    ap.add_argument("--small", action="store_true", help="decode/prefill shapes and N / 16")
    ap.add_argument("--only", default="",
                    help="run the problems whose name holds this text (e.g. 11008x4096, rn50)")
    ap.add_argument("--densities", default="",
                    help="decode and prefill: only these densities (e.g. 0.3,0.1)")
    ap.add_argument("--dtypes", default="", help="only these dtypes (e.g. fp32)")
    ap.add_argument("--n", default="", help="only these N (e.g. 64; comma-separated)")
    ap.add_argument("--dry-run", action="store_true", help="no GPU: make, count and compile")
    ap.add_argument("--arch", default="sm_90a", help="--dry-run: the architecture compiled for")
    ap.add_argument("--compile", type=int, default=2,
                    help="--dry-run: hint kernels compiled per problem")
    args = ap.parse_args(argv)
    unknown = set(args.suites.split(",")) - {"decode", "prefill", "dlmc"}
    if unknown:
        ap.error(f"unknown suites {sorted(unknown)}; expected decode, prefill, dlmc")
    return dry_run(args) if args.dry_run else run(args)


if __name__ == "__main__":
    sys.exit(main())
