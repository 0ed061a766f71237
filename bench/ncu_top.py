"""Where a kernel's warps wait, instruction by instruction: reads the source
page Nsight Compute exports for one profiled launch and prints the totals
(warp stall samples by reason, warp instructions executed) and the SASS
instructions with the most samples.  With two files (the same kernel
built two ways, say with and without some work), the totals side by side.

    ncu -k regex:sf_ -c 1 --section SourceCounters --section WarpStateStats \\
        -o /tmp/a python3 bench/csr_probe.py 4096 4096 64 --configs @cfg.json --rounds 1
    ncu -i /tmp/a.ncu-rep --page source --csv --print-source sass > a.csv
    python3 bench/ncu_top.py a.csv [b.csv] [--top 30]

(bench/RESULTS.md, 2026-11-28: what the split 2:4 residual's records cost.)
"""
import argparse
import csv
import sys
from pathlib import Path

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def read(path) -> tuple[list[str], list[dict]]:
    """The header and one dict a SASS instruction.  The export starts with
    a "Kernel Name" line, then the header."""
    rows = list(csv.reader(Path(path).read_text().splitlines()))
    start = next((i for i, r in enumerate(rows) if r and r[0] == "Address"), None)
    if start is None:
        raise ValueError(f"{path}: no 'Address' header: not an ncu source page "
                         "(--page source --csv --print-source sass)")
    head = rows[start]
    return head, [dict(zip(head, r)) for r in rows[start + 1:] if len(r) == len(head)]


def number(s) -> float:
    try:
        return float(str(s).replace(",", ""))
    except ValueError:
        return 0.0


def reasons(head: list[str]) -> list[str]:
    """The stall-reason columns (all samples; not the "Not Issued" ones)."""
    return [h for h in head if h.startswith("stall_") and "Not Issued" not in h]


def totals(head: list[str], rows: list[dict]) -> dict:
    """Samples, instructions executed and samples by stall reason."""
    out = {"samples": sum(number(r.get(SAMPLES)) for r in rows),
           "executed": sum(number(r.get(EXECUTED)) for r in rows)}
    for h in reasons(head):
        out[h] = sum(number(r[h]) for r in rows)
    # samples the export names no reason for (on Hopper: warps of a
    # warpgroup waiting at a wgmma for the others)
    out["unnamed"] = out["samples"] - sum(v for k, v in out.items() if k.startswith("stall_"))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+", help="one or two source-page CSV exports")
    ap.add_argument("--top", type=int, default=25, help="instructions listed (first file)")
    args = ap.parse_args(argv)
    if len(args.files) > 2:
        ap.error("one or two files")
    try:
        tables = [read(f) for f in args.files]
    except (OSError, ValueError) as e:
        print(f"ncu_top: {e}", file=sys.stderr)
        return 2
    sums = [totals(h, r) for h, r in tables]
    keys = [k for k in sums[0] if any(s.get(k) for s in sums)]
    print("| " + " | ".join(["total"] + [Path(f).name for f in args.files]) + " |")
    print("| --- |" + " ---: |" * len(args.files))
    for k in keys:
        print("| " + " | ".join([k] + [f"{s.get(k, 0):,.0f}" for s in sums]) + " |")
    head, rows = tables[0]
    base = int(rows[0]["Address"], 16) if rows and rows[0]["Address"].startswith("0x") else 0
    total = sums[0]["samples"] or 1.0
    print(f"\n{Path(args.files[0]).name}: the {args.top} instructions with the most samples")
    for r in sorted(rows, key=lambda r: -number(r.get(SAMPLES)))[:args.top]:
        off = int(r["Address"], 16) - base if r["Address"].startswith("0x") else r["Address"]
        samples = number(r.get(SAMPLES))
        named = [(h[6:], number(r[h])) for h in reasons(head) if number(r[h])]
        rest = samples - sum(v for _, v in named)
        why = ", ".join(f"{h} {v:.0f}" for h, v in named + ([("unnamed", rest)] if rest else []))
        print(f"{samples:6.0f} {100 * samples / total:5.1f}% "
              f"+{off:05x} x{number(r.get(EXECUTED)):<8.0f} {r['Source'].strip()[:70]}"
              + (f"  ({why})" if why else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
