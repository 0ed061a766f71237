"""Probe: does a bucket that sparsify serves by cuBLAS (a "dense" variant,
sparseforge/torch/convert.py) cost what the model's own nn.Linear does?

For each shape, an nn.Linear with a magnitude-pruned weight (density
--density) and a SparseLinear of the same weight whose bucket for N tokens
is cuBLAS (tuned with min_speedup=inf), and F.linear on a plain copy of the
weight.  Each is a CUDA graph of --calls calls on its own inputs, the graphs
replayed in alternating rounds (so that clocks and temperature drift alike),
medians of the rounds (bench/torch_models.py's
alternating_medians).  Prints a markdown table (us a call).

    python3 bench/dense_bucket_probe.py --shapes 4096x4096,11008x4096 --n 2048
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from torch_models import alternating_medians, capture  # noqa: E402


def main(argv=None) -> int:
    from sparseforge.torch import SparseLinear
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="4096x4096,11008x4096,4096x11008",
                    help="comma-separated OUTxIN")
    ap.add_argument("--n", type=int, default=2048, help="tokens a call")
    ap.add_argument("--density", type=float, default=0.3)
    ap.add_argument("--calls", type=int, default=7, help="calls a graph")
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    db = tempfile.mkdtemp() + "/probe.db"
    rows = []
    for spec in args.shapes.split(","):
        m, k = map(int, spec.split("x"))
        w = torch.randn(m, k)
        thr = w.abs().flatten().kthvalue(int((1 - args.density) * w.numel())).values
        w = (w * (w.abs() > thr)).half().cuda()
        lin = nn.Linear(k, m, bias=False).half().cuda()
        with torch.no_grad():
            lin.weight.copy_(w)
        sl = SparseLinear.from_dense(w.cpu(), None, pattern="csr", name=f"probe.{spec}")
        sl.load_kernels(db, n=(args.n,), budget="1", quick=True, progress=False,
                        min_speedup=float("inf")).cuda()
        layouts = [v["layout"] for k_ in sl.kernels.values() for v in k_["variants"]]
        assert layouts == ["dense"], layouts
        plain = w.clone()
        xs = [torch.randn(1, args.n, k, device="cuda").half() for _ in range(args.calls)]
        with torch.no_grad():
            err = float((sl(xs[0]).float() - lin(xs[0]).float()).abs().max())
        graphs = {"nn.Linear": capture(lambda: [lin(x) for x in xs]),
                  "SparseLinear, cuBLAS bucket": capture(lambda: [sl(x) for x in xs]),
                  "F.linear, plain weight": capture(lambda: [F.linear(x, plain) for x in xs])}
        ms = alternating_medians(graphs, args.rounds)
        rows.append((spec, err, {n: t * 1e3 / args.calls for n, t in ms.items()}))
        graphs.clear()
        torch.cuda.empty_cache()
    names = list(rows[0][2])
    print(f"| M x K (N = {args.n}) | " + " | ".join(names) + " | max |difference| |")
    print("| --- | " + " | ".join("---:" for _ in names) + " | ---: |")
    for spec, err, t in rows:
        print(f"| {spec} | " + " | ".join(f"{t[n]:.1f}" for n in names) + f" | {err:.1e} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
