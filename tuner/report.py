"""`sparseforge report`: CSV tables and plots from a cache database."""
from __future__ import annotations

import csv
import json
import math
from collections import defaultdict
from pathlib import Path

TRIAL_FIELDS = ["env_key", "matrix_fp", "op", "n", "config", "status", "median_ms", "p20_ms",
                "p80_ms", "min_ms", "reps", "max_error", "message"]


def write_report(cache, outdir: Path, plots: bool = True):
    """Writes trials.csv, winners.csv and (with matplotlib) the plots;
    yields a line per file written."""
    outdir.mkdir(parents=True, exist_ok=True)
    trials = cache.trials()
    matrices = {m["fingerprint"]: m for m in cache.matrices()}
    with open(outdir / "trials.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=TRIAL_FIELDS + ["density"], extrasaction="ignore")
        w.writeheader()
        for t in trials:
            m = matrices.get(t["matrix_fp"])
            dens = m["nnz"] / (m["rows"] * m["cols"]) if m and m["rows"] * m["cols"] else ""
            w.writerow({**t, "density": dens})
    yield f"wrote {outdir / 'trials.csv'} ({len(trials)} trials)"

    # best trial per (env, matrix, op, n), with the cuBLAS time of the same
    # env, shape, dtype and N where one was measured
    peers = {}
    for t in trials:
        if t["op"].startswith("cublas.") and t["status"] == "ok":
            cfg = json.loads(t["config"])
            dtype, layout = t["op"].split(".")[1:3]
            peers[(t["env_key"], cfg["m"], cfg["k"], t["n"], dtype, layout)] = t["median_ms"]
    best = {}
    for t in trials:
        if t["status"] != "ok" or t["op"].startswith("cublas."):
            continue
        k = (t["env_key"], t["matrix_fp"], t["op"], t["n"])
        if k not in best or t["median_ms"] < best[k]["median_ms"]:
            best[k] = t
    rows = []
    for (env, fp, op, n), t in sorted(best.items(), key=lambda kv: kv[0][2:]):
        m = matrices.get(fp, {})
        fam, dtype, layout = op.split(".")[:3]
        peer = peers.get((env, m.get("rows"), m.get("cols"), n, dtype, layout), math.nan)
        dens = m["nnz"] / (m["rows"] * m["cols"]) if m else math.nan
        rows.append({"family": fam, "op": op, "rows": m.get("rows"), "cols": m.get("cols"),
                     "density": dens, "n": n, "median_ms": t["median_ms"], "cublas_ms": peer,
                     "speedup": peer / t["median_ms"] if peer == peer else math.nan,
                     "config": t["config"], "env_key": env})
    with open(outdir / "winners.csv", "w", newline="") as f:
        fields = ["family", "op", "rows", "cols", "density", "n", "median_ms", "cublas_ms",
                  "speedup", "config", "env_key"]
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    yield f"wrote {outdir / 'winners.csv'} ({len(rows)} winners)"
    if not plots:
        return
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        yield "plots skipped: matplotlib is not installed (pip install 'sparseforge[plots]')"
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    by_fam = defaultdict(list)
    for r in rows:
        if r["speedup"] == r["speedup"]:
            by_fam[r["family"]].append((1 - r["density"], r["speedup"]))
    for fam, pts in sorted(by_fam.items()):
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=fam)
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xlabel("sparsity")
    ax.set_ylabel("speedup over cuBLAS (same run)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(outdir / "speedup_vs_sparsity.png", dpi=120)
    plt.close(fig)
    yield f"wrote {outdir / 'speedup_vs_sparsity.png'}"
    fig, ax = plt.subplots(figsize=(6, 4))
    groups = defaultdict(list)
    for t in trials:
        if t["status"] == "ok" and not t["op"].startswith("cublas."):
            groups[(t["op"], t["n"], t["matrix_fp"][:8])].append(t["median_ms"])
    for (op, n, fp), times in sorted(groups.items())[:12]:
        ax.plot(sorted(times), ".-", label=f"{op} N={n} {fp}")
    ax.set_xlabel("configurations (sorted)")
    ax.set_ylabel("median time (ms)")
    ax.set_yscale("log")
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(outdir / "time_across_configs.png", dpi=120)
    plt.close(fig)
    yield f"wrote {outdir / 'time_across_configs.png'}"
