"""The `sparseforge` command line."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2


def _ns(text: str) -> list[int]:
    try:
        ns = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--n takes comma-separated integers, got {text!r}") from None
    if not ns or any(n < 1 for n in ns):
        raise argparse.ArgumentTypeError("--n values must be positive")
    return ns


def _open_cache(path, create=True, readonly=False):
    from .cache import Cache, default_path
    p = Path(path) if path else default_path()
    if create and not readonly:
        p.parent.mkdir(parents=True, exist_ok=True)
    return Cache(str(p), create=create, readonly=readonly)


def _load(path: str, name=None, dtype=None):
    from .generator import io
    return io.load(path, name=name, dtype=dtype)


# ---- inspect / prune / generate ---------------------------------------------

def cmd_inspect(args) -> int:
    from .generator import analysis
    mats = _load(args.file, args.name, args.dtype)
    reports = []
    for name, m in mats:
        rep = analysis.analyze(m)
        if args.json:
            reports.append({"name": name, **rep.to_dict()})
        else:
            print(f"== {name}")
            if m.values_synthetic:
                print(f"   values: {m.meta.get('values', 'drawn from a seeded generator')}")
            print(rep.format())
    if args.json:
        print(json.dumps(reports, indent=2, default=str))
    return EXIT_OK


def cmd_prune(args) -> int:
    from .generator import io, prune
    mats = _load(args.file, args.name, args.dtype)
    out = []
    for name, m in mats:
        pruned, stats = prune.prune(m.to_dense(), args.pattern, args.sparsity, seed=args.seed)
        pruned = pruned.astype(m.dtype)
        pruned.name = name
        print(f"{name}: {stats.format()}")
        out.append((name, pruned))
    io.save(args.output, out)
    print(f"wrote {args.output}")
    return EXIT_OK


def cmd_generate(args) -> int:
    from . import native
    from .generator.families import family_of
    from .generator.kernel import ConfigError, Epilogue, Operation
    from .tuner.driver import target_of_arch
    from .tuner.model import op_for
    fam, params = family_of(args.pattern)
    outdir = Path(args.output)
    outdir.mkdir(parents=True, exist_ok=True)
    ctx = native.Context(0)
    for name, m in _load(args.file, args.name, args.dtype):
        op = op_for(args.pattern, m, args.activation, args.layout)
        if args.bias:
            op = Operation(op.dtype, op.layout, Epilogue(True, args.activation))
        target = target_of_arch(args.arch)
        if args.config:
            config = json.loads(args.config)
            fam.check_config(config, m, op, params, target)
        else:
            try:
                config = fam.default_config(m, op, params, target)
            except ConfigError as e:
                raise ValueError(f"{e} for {name}") from None
        import numpy as np
        bias = np.zeros(m.rows, dtype=np.float32) if args.bias else None
        kernel = fam.generate(m, op, params, config, bias=bias)
        stem = outdir / _safe(name or Path(args.file).stem)
        stem.with_suffix(".cu").write_text(kernel.source)
        binary = ctx.compile(kernel.source, name=kernel.name + ".cu", arch=args.arch,
                             options=kernel.options)
        stem.with_suffix(".cubin").write_bytes(binary.data)
        stem.with_suffix(".packed").write_bytes(kernel.packed)
        meta = {"kernel": kernel.name, "arch": args.arch, "launch": kernel.launch,
                "config": kernel.config, "op": op.tag(fam.tag(params)),
                "rows": m.rows, "cols": m.cols,
                "params": "(const unsigned char* packed, const void* X, void* Y, int N)"}
        stem.with_suffix(".json").write_text(json.dumps(meta, indent=2))
        print(f"{name}: {kernel.name} -> {stem}.cu, .cubin ({len(binary.data)} bytes, {args.arch}), "
              f".packed ({len(kernel.packed)} bytes), .json")
    return EXIT_OK


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


# ---- tune / sweep / report --------------------------------------------------

def _make_tuner(args, cache):
    from .tuner.driver import DEFAULT_TIMING, QUICK_TIMING, Tuner
    from .tuner.model import Progress
    return Tuner(cache, arch=args.arch, strategy=args.strategy, budget=args.budget, jobs=args.jobs,
                 timing=QUICK_TIMING if args.quick else DEFAULT_TIMING, progress=Progress(),
                 seed=args.seed)


def cmd_tune(args) -> int:
    from .tuner.model import format_table, tune_model
    mats = _load(args.file, args.name, args.dtype)
    with _open_cache(args.db) as cache:
        tuner = _make_tuner(args, cache)
        try:
            if not tuner.gpu:
                print(f"no GPU: {tuner.gpu_reason}. Generating and compiling for {tuner.arch}; "
                      "nothing is measured.", file=sys.stderr)
            rows = tune_model(mats, tuner, args.n, args.pattern, args.activation, args.layout,
                              force=args.force)
        finally:
            tuner.close()
        print(format_table(rows, tuner.device["name"] if tuner.device else f"none (arch {tuner.arch})"))
        print(f"\ndatabase: {cache.path}; kernels compiled in this run: {tuner.compiled}")
    return EXIT_OK


def cmd_sweep(args) -> int:
    from .tuner.sweep import load_spec, run_sweep
    spec = load_spec(args.spec)
    with _open_cache(args.db) as cache:
        tuner = _make_tuner(args, cache)
        try:
            run_sweep(spec, tuner, log=sys.stderr)
        finally:
            tuner.close()
    return EXIT_OK


def cmd_report(args) -> int:
    from .tuner.report import write_report
    with _open_cache(args.db, create=False, readonly=True) as cache:
        for line in write_report(cache, Path(args.output), plots=not args.no_plots):
            print(line)
    return EXIT_OK


# ---- cache ------------------------------------------------------------------

def cmd_cache(args) -> int:
    if args.action == "ls":
        with _open_cache(args.db, create=False, readonly=True) as cache:
            print(f"database: {cache.path}")
            for k, v in cache.summary().items():
                print(f"  {k:12s} {v}")
            layers = cache.layers()
            if layers:
                print(f"{'layer':40s} {'gpu':28s} {'op':32s} {'shape':>12s} buckets")
            for rec in layers:
                buckets = ",".join(str(v["n_bucket"]) for v in rec["variants"])
                print(f"{rec['name'][:40]:40s} {rec['gpu_name'][:28]:28s} {rec['op'][:32]:32s} "
                      f"{rec['rows']:>5d}x{rec['cols']:<6d} {buckets}")
        return EXIT_OK
    if args.action == "show":
        with _open_cache(args.db, create=False, readonly=True) as cache:
            recs = cache.layers(args.name)
            if not recs:
                print(f"no layer named {args.name!r}", file=sys.stderr)
                return EXIT_ERROR
            for rec in recs:
                print(f"layer {rec['name']} on {rec['gpu_name']}: {rec['op']}, {rec['rows']}x{rec['cols']}")
                for v in rec["variants"]:
                    print(f"  N={v['n_bucket']:<6d} {v['kernel_name']}  grid={tuple(v['grid'])} "
                          f"block={tuple(v['block'])} smem={v['shared_bytes']} "
                          f"packed={len(v['packed'])} B  config={v['config']}")
                trials = cache.trials(matrix_fp=rec["matrix_fp"], op=rec["op"])
                ok = sum(1 for t in trials if t["status"] == "ok")
                print(f"  trials: {len(trials)} ({ok} ok)")
        return EXIT_OK
    if args.action == "rm":
        with _open_cache(args.db, create=False) as cache:
            for name in args.names:
                cache.delete_layer(name)
                print(f"removed {name}")
        return EXIT_OK
    if args.action == "export":
        with _open_cache(args.db, create=False, readonly=True) as cache:
            cache.export_to(args.output, args.layer or None)
        print(f"wrote {args.output}")
        return EXIT_OK
    if args.action in ("import", "merge"):
        with _open_cache(args.db) as cache:
            for f in args.files:
                added = cache.merge(f)
                print(f"{f}: {added} records added")
        return EXIT_OK
    raise AssertionError(args.action)


# ---- parser -----------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="sparseforge",
        description="Generate, tune and cache sparse GPU kernels for pruned weight matrices.")
    p.add_argument("--version", action="version", version=f"sparseforge {_version()}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    from .generator.families import pattern_syntax
    patterns = pattern_syntax()

    def add_file(sp):
        sp.add_argument("file", help="weights: .npy .npz .safetensors .mtx .smtx")
        sp.add_argument("--name", help="one tensor of the file (default: every 2-D tensor)")
        sp.add_argument("--dtype", choices=["fp32", "fp16", "bf16"],
                        help="round the values to this type (default: the file's)")

    sp = sub.add_parser("inspect", help="analyze a pruned matrix: which families it fits, at what cost")
    add_file(sp)
    sp.add_argument("--json", action="store_true", help="machine-readable output")
    sp.set_defaults(func=cmd_inspect)

    sp = sub.add_parser("prune", help="magnitude-prune dense weights to a pattern")
    add_file(sp)
    sp.add_argument("--pattern", required=True, help=patterns)
    sp.add_argument("--sparsity", required=True, type=float, help="fraction of zeros, e.g. 0.75")
    sp.add_argument("-o", "--output", required=True, help="output file (.npz .safetensors .mtx)")
    sp.add_argument("--seed", type=int, default=0)
    sp.set_defaults(func=cmd_prune)

    sp = sub.add_parser("generate", help="write the specialized .cu and its cubin (no GPU needed)")
    add_file(sp)
    sp.add_argument("--pattern", required=True, help=patterns)
    sp.add_argument("--arch", required=True, help="e.g. sm_80, sm_90a")
    sp.add_argument("-o", "--output", required=True, help="output directory")
    sp.add_argument("--config", help="configuration as JSON (default: the first valid one)")
    sp.add_argument("--activation", choices=["none", "relu", "gelu"], default="none")
    sp.add_argument("--bias", action="store_true", help="fuse a bias (zeros; fill the packed section)")
    sp.add_argument("--layout", choices=["fm", "tm"], default="fm",
                    help="activations feature-major (K x N) or token-major (N x K)")
    sp.set_defaults(func=cmd_generate)

    def add_tuning(sp):
        sp.add_argument("--db", help="cache database (default: ~/.cache/sparseforge/sparseforge.db)")
        sp.add_argument("--arch", help="target arch (default: the GPU present; required without one)")
        sp.add_argument("--strategy", default="auto",
                        help="auto | exhaustive | greedy | random (auto: exhaustive for small spaces)")
        sp.add_argument("--budget", help="all | N trials | P%% of the space | Ns | Nm")
        sp.add_argument("--jobs", type=int, help="parallel NVRTC compilations (default: all cores)")
        sp.add_argument("--quick", action="store_true", help="shorter timing (fewer repetitions)")
        sp.add_argument("--seed", type=int, help="seed of the verification inputs (default: fresh)")

    sp = sub.add_parser("tune", help="tune every sparse layer of a weights file (the main job)")
    add_file(sp)
    sp.add_argument("--pattern", help="family for every layer (default: the one each layer fits)")
    sp.add_argument("--n", type=_ns, default=[16, 256, 4096],
                    help="N values (tokens) to tune for, comma-separated (default 16,256,4096)")
    sp.add_argument("--activation", choices=["none", "relu", "gelu"], default="none")
    sp.add_argument("--layout", choices=["fm", "tm"], default="fm")
    sp.add_argument("--force", action="store_true", help="tune again even if the database has the layer")
    add_tuning(sp)
    sp.set_defaults(func=cmd_tune)

    sp = sub.add_parser("sweep", help="research sweep described by a TOML spec; every trial recorded")
    sp.add_argument("spec", help="sweep spec (.toml); see bench/sweeps/ for examples")
    add_tuning(sp)
    sp.set_defaults(func=cmd_sweep)

    sp = sub.add_parser("report", help="CSV tables and plots from a database")
    sp.add_argument("--db", help="cache database (default: the user's)")
    sp.add_argument("-o", "--output", default="sparseforge-report", help="output directory")
    sp.add_argument("--no-plots", action="store_true", help="CSV only")
    sp.set_defaults(func=cmd_report)

    sp = sub.add_parser("cache", help="see and manage what is stored")
    sp.add_argument("--db", help="cache database (default: the user's)")
    csub = sp.add_subparsers(dest="action", required=True, metavar="ACTION")
    csub.add_parser("ls", help="counts and tuned layers")
    c = csub.add_parser("show", help="one layer: its kernels per N and its trials")
    c.add_argument("name")
    c = csub.add_parser("rm", help="delete layers")
    c.add_argument("names", nargs="+")
    c = csub.add_parser("export", help="write the layers (all, or --layer ...) to a new database")
    c.add_argument("output")
    c.add_argument("--layer", action="append", help="a layer to export (repeatable)")
    c = csub.add_parser("import", help="merge databases into this one (same as merge)")
    c.add_argument("files", nargs="+")
    c = csub.add_parser("merge", help="merge databases tuned elsewhere, without duplicates")
    c.add_argument("files", nargs="+")
    sp.set_defaults(func=cmd_cache)
    return p


def _version() -> str:
    from . import __version__
    return __version__


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("interrupted: every trial recorded so far is kept; run again to resume", file=sys.stderr)
        return 130
    except (ValueError, KeyError, FileNotFoundError, OSError) as e:
        print(f"sparseforge {args.command}: error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except Exception as e:  # library errors carry their own message
        from ._lib import SFError
        if isinstance(e, SFError):
            print(f"sparseforge {args.command}: error: {e}", file=sys.stderr)
            return EXIT_ERROR
        raise


if __name__ == "__main__":
    sys.exit(main())
