"""How long opening a tuned layer takes: `sf_layer_open` from the database
(its cubins already stored: no compilation), per layer, median of several
opens; beside it, the deployment bundle's open as deploy_check prints it.

    python3 bench/open_time.py --db DB [--reps 20]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", required=True)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args(argv)
    from sparseforge import native
    from sparseforge.cache import Cache
    ok, why = native.gpu_available()
    if not ok:
        print(f"no GPU: {why}", file=sys.stderr)
        return 1
    with Cache(args.db, readonly=True) as cache, native.Context(0) as ctx:
        gpu = ctx.device_info()["name"]
        names = sorted({r["name"] for r in cache.layers() if r["gpu_name"] == gpu})
        print(f"sf_layer_open from {args.db} on {gpu} (median of {args.reps}; cubins from "
              "the database)")
        total = []
        for name in names:
            ctx.open_layer(cache, name).close()          # compiles and stores a missing cubin once
            times = []
            for _ in range(args.reps):
                t0 = time.perf_counter()
                layer = ctx.open_layer(cache, name)
                times.append((time.perf_counter() - t0) * 1e3)
                assert layer.compiled_count == 0
                layer.close()
            total.append(statistics.median(times))
            print(f"  {name:32s} {statistics.median(times):8.3f} ms  (min {min(times):.3f})")
        print(f"  all {len(names)} layers: {sum(total):.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
