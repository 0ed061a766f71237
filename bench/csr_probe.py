"""Configurations of one family measured side by side on one problem:
each built once, one X, then ROUNDS rounds in which every configuration is
a trial in turn (verified against float64, then timed by the tuner's
protocol: N <= 256 as CUDA graphs rotating through operands twice the L2);
medians over the rounds.  Matrices: standard-normal weights pruned to
each density by the pattern's own pruning (--pattern, default csr: then
bench/csr.py's decode and prefill matrices; shflbw:64, bsr:64x64, nm24,
...).

    python3 bench/csr_probe.py 4096 4096 16 --densities 0.5,0.1 \\
        --configs '[{"mf":1,"wm":2,"wk":4,"ksw":4,"bn":16,"stages":4,"ck":2}, ...]'
    python3 bench/csr_probe.py 4096 4096 16 --pattern shflbw:64 --densities 0.25 \\
        --configs '[{"bk":64,"bn":16,"stages":4,"wm":4,"wn":1,"ks":2}]'

--two-of-four cuts each matrix to the two largest of every group of 4
along K: the split 2:4 format's residual empty, the rest of the matrix
as it was (what the residual costs a split 2:4 tile: bench/RESULTS.md,
2026-11-28).

The kernels come from the checkout this script sits in (it puts the
checkout first on sys.path, before any installed copy): to probe a variant
of a template or header, edit the checkout's file, not the installed
package's (bench/RESULTS.md, 2026-11-28: probes that patched the installed
headers measured the unpatched kernels).

--matrix FILE measures the one matrix of a weights file instead (a DLMC
.smtx: its pattern, values drawn with seed 0; M and K must be its shape,
--densities is not used):

    python3 bench/csr_probe.py 2048 1024 392 --dtype fp32 --layout fm \\
        --matrix ../shared/data/dlmc/rn50/magnitude_pruning/0.9/bottleneck_projection_block_group_projection_block_group4.smtx \\
        --configs '[{"tables":"global","vec":4,"rows":4,"split":1,"unroll":8}]'
"""
import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from csr import pruned_normal  # noqa: E402
from sparseforge.cache import Cache  # noqa: E402
from sparseforge.generator.families import family_of  # noqa: E402
from sparseforge.generator.io import load_one  # noqa: E402
from sparseforge.generator.kernel import (ACTIVATIONS, ConfigError, Epilogue, Operation,  # noqa: E402
                                         canonical_config)
from sparseforge.tuner.driver import QUICK_TIMING, Tuner, timing_for  # noqa: E402
from sparseforge.tuner.worker import PeerJob  # noqa: E402


def two_of_four(mat):
    """The matrix cut to the two largest |w| of every aligned group of 4
    along K (csr's split 2:4 part, its permutation kept)."""
    from sparseforge.generator.families.csr import split24
    part = split24.split(mat)[0]
    part.perm = mat.perm
    part.name = mat.name
    return part


def main(argv=None, worker=None) -> int:
    """`worker`: the tuner's (tests pass a replaying one); default the GPU's."""
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("m", type=int)
    ap.add_argument("k", type=int)
    ap.add_argument("n", type=int)
    ap.add_argument("--configs", required=True,
                    help="a JSON list of configurations (or @FILE holding one)")
    ap.add_argument("--pattern", default="csr",
                    help="the family and its parameters (default csr; e.g. shflbw:64, bsr:64x64)")
    ap.add_argument("--densities", default="0.5,0.1")
    ap.add_argument("--layout", default="tm", choices=["fm", "tm"])
    ap.add_argument("--dtype", default="fp16", choices=["fp16", "bf16", "fp32"])
    ap.add_argument("--bias", action="store_true", help="fuse a bias (seeded values)")
    ap.add_argument("--activation", choices=ACTIVATIONS, default="none",
                    help="fuse an activation into the epilogue")
    ap.add_argument("--matrix", help="a weights file holding one M x K matrix (e.g. a DLMC "
                                     ".smtx) instead of pruned normal weights")
    ap.add_argument("--two-of-four", action="store_true",
                    help="keep only the two largest of every group of 4 along K (csr's split "
                         "2:4 part): the same matrix with the split 2:4 format's residual empty")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--peer", action="store_true",
                    help="also time cuBLAS (dense, same dtype and layout) by the same protocol, "
                         "once per shape, and print each configuration's speedup over it")
    args = ap.parse_args(argv)
    text = Path(args.configs[1:]).read_text() if args.configs.startswith("@") else args.configs
    cfgs = json.loads(text)
    if not isinstance(cfgs, list) or not cfgs:
        ap.error("--configs: a non-empty JSON list of configurations")
    op = Operation(args.dtype, args.layout, Epilogue(args.bias, args.activation))
    fam, params = family_of(args.pattern)
    fixed = None
    if args.matrix:
        fixed = load_one(args.matrix, dtype=args.dtype, seed=0)
        if (fixed.rows, fixed.cols) != (args.m, args.k):
            ap.error(f"--matrix {args.matrix} is {fixed.rows} x {fixed.cols}, "
                     f"not {args.m} x {args.k}")
    bad = 0
    with tempfile.TemporaryDirectory() as tmp, Cache(str(Path(tmp) / "probe.db")) as cache:
        tuner = Tuner(cache, strategy="greedy", budget=1, timing=QUICK_TIMING, seed=1,
                      worker=worker)
        try:
            densities = ([fixed.nnz / max(1, fixed.rows * fixed.cols)] if fixed is not None
                         else [float(x) for x in args.densities.split(",")])
            for d in densities:
                t0 = time.time()
                mat = fixed if fixed is not None else pruned_normal(args.m, args.k, d, args.dtype,
                                                                    0, args.pattern)
                if args.two_of_four:
                    mat = two_of_four(mat)
                bias = (np.random.default_rng(1).standard_normal(mat.rows).astype(np.float32)
                        if op.epilogue.bias else None)
                head = (f"{args.pattern} {args.m}x{args.k} N={args.n} {args.layout} {args.dtype} "
                        + ("" if op.epilogue.tag == "plain" else f"{op.epilogue.tag} ")
                        + f"d={d:.3g}" + (f" {Path(args.matrix).name}" if fixed is not None else "")
                        + (f" two of four (d={mat.density:.3g})" if args.two_of_four else ""))
                # a configuration that fails (its status printed) leaves the rest to
                # be measured side by side again
                run = list(cfgs)
                while run:
                    status, infos = tuner.measure_rounds(mat, fam.name, params, op, args.n, run,
                                                         args.rounds, bias)
                    if status == "ok":
                        break
                    print(f"{head}: {status} {str(infos)[:600]}", flush=True)
                    bad += 1
                    failed = [c for c in run if canonical_config(c) == infos.get("config")]
                    if not failed:
                        break
                    run.remove(failed[0])
                if status != "ok":
                    continue
                peer_ms = None
                if args.peer:
                    pstatus, pinfo = tuner.worker.peer(PeerJob(
                        op.dtype, op.layout, args.m, args.n, args.k,
                        timing_for(QUICK_TIMING, args.n, tuner.device)))
                    if pstatus == "ok":
                        peer_ms = pinfo["median_ms"]
                        print(f"{head} cuBLAS: {peer_ms * 1000:.2f} us", flush=True)
                    else:
                        print(f"{head} cuBLAS: {pstatus} {str(pinfo)[:300]}", flush=True)
                for cfg, inf in zip(run, infos):
                    med = statistics.median(i["median_ms"] for i in inf)
                    err = max(i.get("max_rel_err", 0.0) for i in inf)
                    ratio = f", {peer_ms / med:.2f}x cuBLAS" if peer_ms else ""
                    print(f"{head} {json.dumps(cfg, sort_keys=True)}: {med * 1000:.2f} us "
                          f"(max rel err {err:.1e}{ratio})", flush=True)
                print(f"  ({time.time() - t0:.0f} s)", flush=True)
        finally:
            tuner.close()
    return 1 if bad else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (ConfigError, RuntimeError) as e:
        print(f"csr_probe: {e}", file=sys.stderr)
        sys.exit(2)
