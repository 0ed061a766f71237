"""Runs every family's kernels once on small, awkward shapes (tails, empty
rows and groups, bias + GELU) so that compute-sanitizer can watch them:
    compute-sanitizer --tool memcheck python3 bench/sanitize.py
`--small`: smaller shapes and fewer kernels (racecheck); `--layout fm|tm`:
only the cases of that layout; `--pattern P`: only the cases of that
pattern; `--shape MxKxN`: that problem instead of the small awkward
ones; `--density D`: the matrices' density (default 0.3; csr's split 2:4
tiles in steps need a short residual, e.g. 0.1); `--configs JSON` (or
@FILE): exactly these configurations, each on
every case whose family accepts it, instead of a spread of the space:
    compute-sanitizer --tool racecheck python3 bench/sanitize.py --small \
        --pattern nm24 --configs '[{"bm": 256, ...}]'
Exits non-zero if any result is wrong."""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sparseforge.generator.families import family_of  # noqa: E402
from sparseforge.generator.kernel import Epilogue, Operation  # noqa: E402
from sparseforge.generator.synth import random_matrix  # noqa: E402
from sparseforge.tuner.execute import default_context, verify  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__,
                             formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--small", action="store_true", help="smaller shapes, fewer kernels (racecheck)")
ap.add_argument("--layout", choices=["fm", "tm"], help="only the cases of this layout")
ap.add_argument("--pattern", help="only the cases of this pattern (e.g. nm24)")
ap.add_argument("--shape", type=lambda v: tuple(int(x) for x in v.split("x")),
                help="MxKxN instead of the small awkward shapes")
ap.add_argument("--density", type=float, default=0.3, help="the matrices' density (0.3)")
ap.add_argument("--configs", help="a JSON list of configurations (or @FILE holding one)")
args = ap.parse_args()
small, only_layout, only_pattern, shape = args.small, args.layout, args.pattern, args.shape
configs = None if args.configs is None else json.loads(
    Path(args.configs[1:]).read_text() if args.configs.startswith("@") else args.configs)
device = default_context().device_info()  # on sm_90a the spaces hold the wgmma kernels


def spread(space, per):
    """A spread of each compute path's kernels (wgmma, its streamed tiles,
    shared gather, clusters, the rest): `per` of each."""
    paths: dict = {}
    for cfg in space:
        key = ("tn" if "tn" in cfg else "tma" if "tma" in cfg else "wg" if "wg" in cfg
               else "xr" if "xr" in cfg else "ck" if cfg.get("ck", 1) > 1 else "")
        paths.setdefault(key, []).append(cfg)
    return [c for group in paths.values() for c in group[::max(1, len(group) // per)][:per]]


CASES = [("csr", "fp32", "fm"), ("csr", "fp32", "tm"), ("csr", "fp16", "fm"), ("csr", "bf16", "tm"),
         ("bsr:32x32", "fp16", "fm"),
         ("bsr:64x64", "bf16", "fm"), ("shflbw:64", "fp16", "fm"), ("shflbw:32", "bf16", "fm"),
         ("shflbw:64", "fp16", "tm"), ("bsr:16x8", "bf16", "tm"), ("bsr:64x64", "fp16", "tm"),
         ("nm24", "fp16", "fm"), ("nm24", "bf16", "tm")]
bad = 0
for pattern, dtype, layout in CASES:
    fam, params = family_of(pattern)
    if layout not in fam.layouts or only_layout not in (None, layout) or \
            only_pattern not in (None, pattern):
        continue
    m, k, n = shape or ((130, 136, 72) if small else (200, 264, 72))  # 72: two tiles of 64 (tn)
    mat = random_matrix(pattern, m, k, args.density, dtype, seed=1)
    op = Operation(dtype, layout, Epilogue(bias=True, activation="gelu"))
    picks = (fam.accepted(configs, mat, op, params, device) if configs is not None
             else spread(fam.search_space(mat, op, params, device), 2 if small else 4))
    for cfg in picks:
        res = verify(fam, mat, op, params, cfg, n, seed=2)
        bad += not res["ok"]
        print(f"{pattern:10s} {dtype} {layout} {res['kernel'][:70]:70s} err {res['norm_rel_err']:.1e} "
              f"{'ok' if res['ok'] else 'WRONG'}")
print(f"{bad} wrong")
sys.exit(1 if bad else 0)
