"""How long opening a tuned layer takes: `sf_layer_open` from the database
(its cubins already stored: no compilation), per layer, median of several
opens; beside it, the deployment bundle's open as deploy_check prints it.
--breakdown also times the pieces of an open one by one: the sha256 of each
cubin and packed blob, cuModuleLoadData, the kernel lookup, and the packed
weights' allocation and upload.

    python3 bench/open_time.py --db DB [--reps 20] [--breakdown]
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
    ap.add_argument("--breakdown", action="store_true")
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
        if args.breakdown:
            breakdown(ctx, cache, gpu, names)
    return 0


def breakdown(ctx, cache, gpu, names):
    """The pieces of an open, timed one by one (ms, medians of 5)."""
    import ctypes
    from sparseforge import native
    from sparseforge.tuner.compiler import binary_key

    def ms(fn, reps=5):
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(ts)

    arch = ctx.device_info()["arch"]
    nvrtc = "%d.%d" % native.nvrtc_version()
    hexbuf = (ctypes.c_char * 65)()
    print("breakdown (ms): sha256 cubin | sha256 packed | module load | kernel get | "
          "alloc+upload packed   (sizes)")
    for name in names:
        rec = next(r for r in cache.layers(name) if r["gpu_name"] == gpu)
        for v in rec["variants"]:
            extra = [o for o in v["options"].split("\n") if o.strip()]
            key = binary_key(v["source"], ctx.canonical_options(arch, options=extra), arch,
                              nvrtc)
            key["generator_version"] = v["generator_version"]
            cubin = cache.get_binary(key)
            sha_c = ms(lambda: native._clib().sf_sha256_hex(cubin, len(cubin), hexbuf))
            sha_p = ms(lambda: native._clib().sf_sha256_hex(v["packed"], len(v["packed"]), hexbuf))
            binary = native.Binary.from_bytes(cubin)
            mods = []
            load = ms(lambda: mods.append(ctx.load(binary)))
            get = ms(lambda: mods[-1]._kernels.clear() or mods[-1].kernel(v["kernel_name"]))
            bufs = []
            up = ms(lambda: bufs.append(ctx.upload(v["packed"])))
            print(f"  {name[:24]:24s} N={v['n_bucket']:<5d} {sha_c:6.3f} | {sha_p:6.3f} | "
                  f"{load:6.3f} | {get:6.3f} | {up:6.3f}   ({len(cubin)} B cubin, "
                  f"{len(v['packed'])} B packed)")
            for m in mods:
                m.unload()
            for b in bufs:
                b.free()


if __name__ == "__main__":
    sys.exit(main())
