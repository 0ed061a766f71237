"""The `sparseforge` command line.

Every failure is one line on stderr ("sparseforge CMD: error: ...") and a
nonzero exit; `--debug` (before or after the command) shows the trace too.
A command that fails leaves no database it created behind.  Ctrl-C stops
within a couple of seconds and keeps everything stored so far.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from contextlib import ExitStack, contextmanager
from pathlib import Path

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


def _ns(text: str) -> list[int]:
    try:
        ns = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--n takes comma-separated integers, got {text!r}") from None
    if not ns or any(n < 1 for n in ns):
        raise argparse.ArgumentTypeError("--n values must be positive")
    return ns


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v < 1:
        raise argparse.ArgumentTypeError(f"a positive whole number, got {text!r}")
    return v


def _budget(text: str) -> str:
    from .tuner.strategies import Budget
    try:
        Budget.parse(text, 1)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def _pattern(text: str) -> str:
    from .generator.families import parse_pattern
    try:
        parse_pattern(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def _archs(text: str) -> str:
    import re
    archs = [a.strip() for a in text.split(",")]
    bad = [a for a in archs if not re.fullmatch(r"sm_\d{2,3}[af]?", a)]
    if bad or not archs:
        raise argparse.ArgumentTypeError(f"architectures such as sm_80 or sm_90a, "
                                         f"comma-separated; got {text!r}")
    return ",".join(archs)


def _gpus(text: str):
    from .tuner.gpus import parse_gpus
    try:
        return parse_gpus(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


@contextmanager
def _open_cache(path, create=True, readonly=False):
    """The cache at `path` (default: the user's).  A database this command
    creates is removed again when the command fails before storing any work
    (kernels, trials, layers), so a failing command leaves none behind.  A database that cannot be written is named as such
    (a read-only file or folder), with the commands that only read it."""
    from .cache import Cache, default_path
    from ._lib import SFError
    p = Path(path) if path else default_path()
    new = not p.exists()
    made_dir = None
    if create and not readonly and not p.parent.exists():
        made_dir = next(d for d in [p.parent, *p.parent.parents] if d.parent.exists())
        p.parent.mkdir(parents=True, exist_ok=True)
    try:
        cache = Cache(str(p), create=create, readonly=readonly)
    except SFError as e:
        if not readonly and p.exists() and not os.access(p if p.is_file() else p.parent, os.W_OK):
            raise ValueError(f"{p} is read-only (the file or its folder cannot be written): "
                             "copy it somewhere writable, or use a command that only reads "
                             "it (cache ls, cache show, cache export, report)") from None
        raise e
    try:
        yield cache
    except Exception:
        # a command that failed before it stored any work leaves no
        # database it created (an interrupt keeps it: it holds the work)
        empty = new and not readonly and not any(
            v for k, v in cache.summary().items() if k in ("binaries", "trials", "layers"))
        cache.close()
        if empty:
            for side in ("", "-wal", "-shm", "-journal"):
                Path(str(p) + side).unlink(missing_ok=True)
            if made_dir is not None:
                import shutil
                shutil.rmtree(made_dir, ignore_errors=True)
        raise
    finally:
        cache.close()


def _load(path: str, name=None, dtype=None, lazy: bool = False):
    """The matrices of a weights file, or of a model recipe (.toml: made,
    then kept, at first use); `lazy`: a file's read one at a time as they
    are taken (io.iterate)."""
    from .generator import io, recipe
    if recipe.is_recipe(path):
        return recipe.load(path, name=name, dtype=dtype)
    return (io.iterate if lazy else io.load)(path, name=name, dtype=dtype)


# ---- inspect / prune / generate ---------------------------------------------

def cmd_inspect(args) -> int:
    from .generator import analysis
    reports = []
    for name, m in _load(args.file, args.name, args.dtype, lazy=True):
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
    mats = _load(args.file, args.name, args.dtype, lazy=True)
    if isinstance(mats, list):   # a recipe's matrices
        entries, count = sum(m.rows * m.cols for _, m in mats), len(mats)
    else:   # a file's, one at a time: a model's layers are not all held at once
        entries, count = os.path.getsize(args.file) // 2, None   # 16-bit weights, or fewer
    jobs = args.jobs or prune.auto_jobs(entries, count)
    taken = []   # (name, dtype) of each matrix, in order

    def denses():
        for name, m in mats:
            if m.values_synthetic:
                print(f"note: {name} holds a pattern only; its values were drawn from a "
                      "seeded generator, so pruning ranks those drawn values", file=sys.stderr)
            taken.append((name, m.dtype))
            yield m.to_dense()

    out = []
    results = prune.prune_many(denses(), args.pattern, args.sparsity, seed=args.seed, jobs=jobs)
    for i, (pruned, stats) in enumerate(results):
        name, dtype = taken[i]
        pruned = pruned.astype(dtype)
        pruned.name = name
        print(f"{name}: {stats.format()}", flush=True)
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
    for name, m in _load(args.file, args.name, args.dtype, lazy=True):
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
        if not fam.fits(m, params):
            stored = getattr(fam.plan(m, op, params, config, bias=bias), "stored_entries", None)
            extra = (f": the kernel stores {stored - m.nnz} explicit zeros beside the "
                     f"{m.nnz} nonzeros ({100 * (stored - m.nnz) / max(1, m.nnz):.0f}% more "
                     f"work)") if stored else ""
            print(f"note: {name} does not fit {args.pattern} exactly{extra}; `sparseforge "
                  f"prune --pattern {args.pattern}` makes it fit", file=sys.stderr)
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

def _make_tuner(args, cache, device: int = 0, compiler=None, log=None, jobs=None):
    from .tuner.driver import DEFAULT_TIMING, EARLY_STOP, QUICK_TIMING, Tuner
    from .tuner.model import Progress
    return Tuner(cache, arch=args.arch, strategy=args.strategy, budget=args.budget,
                 jobs=args.jobs or jobs,
                 timing=QUICK_TIMING if args.quick else DEFAULT_TIMING,
                 progress=Progress(log or sys.stderr), seed=args.seed,
                 early_stop=None if args.no_early_stop else EARLY_STOP, compiler=compiler,
                 device=device, retime=getattr(args, "retime", False))


def _device_label(tuner) -> str:
    return tuner.device["name"] if tuner.device else f"none (compiled for {', '.join(tuner.archs)})"


def cmd_tune(args) -> int:
    from .tuner.model import plan_model
    mats = _load(args.file, args.name, args.dtype)
    entries = plan_model(mats, args.pattern, args.activation, args.layout)
    return _run(args, entries, args.n, args.force)


def cmd_sweep(args) -> int:
    from .tuner.sweep import load_spec, sweep_entries
    spec = load_spec(args.spec)
    return _run(args, sweep_entries(spec), spec["n"], False)


def _run(args, entries, ns, force) -> int:
    """Tunes the entries: under MPI as one rank of the job; with --gpus on
    those GPUs; else on the GPU present (or compiling only, without one)."""
    from .tuner import mpi
    from .tuner.model import tune_entries
    _default_lanes(args)
    ranks = mpi.join()
    if ranks is not None:
        return _run_ranks(args, ranks, entries, ns, force)
    with _open_cache(args.db) as cache:
        if args.gpus is not None or args.lanes > 1:
            tables, phases, lanes, compiled, corrupt = _run_gpus(args, cache, entries, ns, force)
            measured = True
        else:
            tuner = _make_tuner(args, cache)
            with _closing(tuner):
                if not tuner.gpu:
                    print(f"no GPU ({tuner.gpu_reason}): compiling for {', '.join(tuner.archs)} "
                          "and storing the kernels, untuned; nothing is measured.",
                          file=sys.stderr)
                rows = tune_entries(entries, tuner, ns, force)
            tables = {_device_label(tuner): rows}
            phases, lanes, measured = tuner.phases, 1, tuner.gpu
            compiled, corrupt = tuner.compiled, tuner.recompiled_corrupt
        _report(args, tables, f"{cache.path}", compiled, corrupt, measured,
                phases.format(threads=args.jobs or os.cpu_count(), lanes=lanes,
                              over="lanes" if args.lanes > 1 else "GPUs"))
    return EXIT_OK


def _run_gpus(args, cache, entries, ns, force):
    """--gpus, --lanes: --lanes tuners per GPU, sharing the compile pool
    (tuner/gpus.py)."""
    from . import native
    from .tuner.gpus import gpu_count, resolve_gpus
    if args.gpus is None:
        _lanes_need_a_gpu(*native.gpu_available())
    ordinals = resolve_gpus(args.gpus or [0], gpu_count, native.gpu_available)
    pool = _gpu_pool(args, cache, ordinals, args.jobs or os.cpu_count() or 2)
    lanes = f" ({args.lanes} lanes each)" if args.lanes > 1 else ""
    print(f"tuning on GPU{'s' if len(ordinals) > 1 else ''} {', '.join(map(str, ordinals))}"
          f"{lanes}: " + "; ".join(f"{name} x{len(ts) // args.lanes}"
                                   for name, ts in pool.groups.items()), file=sys.stderr)
    try:
        tables = pool.run(entries, ns, force)
    except BaseException:
        pool.close(kill=True)      # no waiting for a kernel being timed
        raise
    pool.close()
    return tables, pool.phases, len(pool.tuners), pool.compiled, pool.recompiled_corrupt


def _report(args, tables: dict, db: str, compiled: int, corrupt: int, measured: bool,
            phases_line: str) -> None:
    """The tables (one per GPU model), the database, what was compiled and
    where the time went; with --profile, each layer's searches."""
    from .tuner.model import format_profile, format_table
    for model, rows in tables.items():
        print(format_table(rows, model))
        if args.profile:
            print(format_profile(rows))
    print(f"\ndatabase: {db}; kernels compiled in this run: {compiled}")
    print(phases_line)
    if corrupt:
        print(f"note: {corrupt} stored kernel(s) failed their checksum and were compiled again "
              "and replaced", file=sys.stderr)
    if not measured:
        print("nothing was measured (no GPU): the layers are stored untuned; `sparseforge "
              "cache ls` lists them; tune on the GPU to measure")


def _run_ranks(args, ranks, entries, ns, force) -> int:
    """One rank of an MPI job (tuner/mpi.py): its share into its own
    database; rank 0 merges them all and prints the table.  Every rank
    returns the same exit code."""
    from .cache import default_path
    from .tuner import mpi
    from .tuner.model import tune_each
    db = Path(args.db) if args.db else default_path()
    log = RankLog(sys.stderr, ranks.rank)
    report = mpi.RankReport(ranks.rank, str(mpi.rank_db(db, ranks.rank)), "")
    with ExitStack() as stack:
        tuner = None
        try:
            cache = stack.enter_context(_open_cache(report.db))
            tuner = _rank_tuner(args, cache, ranks, log)
            stack.enter_context(_closing(tuner))
            report.model = _device_label(tuner)
        except Exception as e:  # noqa: BLE001 - every rank learns of it below
            report.error = _sentence(e)
        _fail_together(ranks, ranks.allgather(report.error))
        models = ranks.allgather(report.model)
        _fail_together(ranks, [_mixed_refusal(models, args.mixed_gpus)])
        share = mpi.my_share(entries, ranks, models)
        lanes = f", {args.lanes} lanes" if args.lanes > 1 else ""
        print(f"rank {ranks.rank} of {ranks.size} ({report.model}{lanes}): {len(share)} of "
              f"{len(entries)} entries, database {report.db}", file=log)
        try:
            rows = tuner.run(share, ns, force, log)[report.model] if args.lanes > 1 else \
                tune_each(share, tuner, ns, force, log)
            for row in rows:
                report.rows.append(row.light())
                if not row.skipped:
                    report.names.append(row.name)
        except Exception as e:  # noqa: BLE001 - reported by rank 0, the work so far merged
            report.error = _sentence(e)
        report.compiled, report.corrupt = tuner.compiled, tuner.recompiled_corrupt
        report.lanes = args.lanes
        report.phases = tuner.phases.as_dict()
    reports = ranks.gather(report)     # each rank's database is closed by now
    code = EXIT_OK
    if ranks.rank == 0:
        code = _merge_ranks(args, db, reports)
    return ranks.bcast(code)


def _rank_tuner(args, cache, ranks, log):
    """This rank's tuner: on the local GPU its place on the host picks, or
    compiling only where there is none; with --lanes, a GpuPool of that
    many tuners on its GPU."""
    from . import native
    from .tuner import mpi
    from .tuner.gpus import gpu_count, resolve_gpus
    device = 0
    gpu, reason = native.gpu_available()
    if gpu:
        device = mpi.local_device(ranks, resolve_gpus(args.gpus or "all", gpu_count,
                                                      native.gpu_available))
    elif args.gpus is not None:
        resolve_gpus(args.gpus, gpu_count, native.gpu_available)   # says why not
    if args.lanes == 1:
        return _make_tuner(args, cache, device=device, log=log, jobs=mpi.compile_jobs(ranks))
    _lanes_need_a_gpu(gpu, reason)
    return _gpu_pool(args, cache, [device], args.jobs or mpi.compile_jobs(ranks), log)


def _default_lanes(args) -> None:
    """--lanes left out: 2 where a GPU is present (one search measures while
    the other's kernels compile: the BERT-base-sized model tuned 1.42x
    faster on an H100, the same trials measured; bench/RESULTS.md), else 1
    (compiling only)."""
    if args.lanes is None:
        from . import native
        args.lanes = 2 if native.gpu_available()[0] else 1


def _lanes_need_a_gpu(gpu: bool, reason: str) -> None:
    if not gpu:
        raise ValueError(f"--lanes: no GPU here ({reason}); without a GPU tuning compiles only: "
                         "leave --lanes out")


def _gpu_pool(args, cache, ordinals: list[int], jobs: int, log=None):
    """--lanes tuners on each of `ordinals`, sharing one compile pool of
    `jobs` processes (tuner/gpus.py)."""
    from .tuner.compiler import Compiler
    from .tuner.gpus import GpuPool
    return GpuPool(ordinals, lambda o, c: _make_tuner(args, cache, device=o, compiler=c, log=log),
                   Compiler(cache, jobs), mixed=args.mixed_gpus, lanes=args.lanes)


def _mixed_refusal(models: list, mixed: bool) -> str:
    from .tuner.gpus import check_models
    try:
        check_models({f"rank {r}": m for r, m in enumerate(models)}, mixed)
    except ValueError as e:
        return str(e)
    return ""


def _fail_together(ranks, errors: list) -> None:
    """Where any rank failed, every rank stops: rank 0 with the reasons,
    the others quietly (exit 1)."""
    bad = [(r, e) for r, e in enumerate(errors) if e]
    if not bad:
        return
    if ranks.rank != 0:
        raise SystemExit(EXIT_ERROR)
    if len(errors) == 1:
        raise ValueError(bad[0][1])
    raise ValueError("; ".join(f"rank {r}: {e}" for r, e in bad))


def _merge_ranks(args, db: Path, reports) -> int:
    """Rank 0: the rank databases merged into `db`, the table of every
    rank's rows, the summary; the job's exit code."""
    from .tuner import mpi
    from .tuner.phases import Phases
    with _open_cache(db) as cache:
        added = mpi.merge_ranks(cache, reports)
        path = cache.path
    tables: dict = {}
    for rep in reports:
        tables.setdefault(rep.model, []).extend(rep.rows)
    tables = {m: sorted(rows, key=lambda r: r.index) for m, rows in tables.items()}
    total = Phases()
    for rep in reports:
        total.merge({k: v for k, v in rep.phases.items() if k not in ("wall", "other")})
    wall = max(rep.phases.get("wall", 0.0) for rep in reports)
    _report(args, tables, f"{path} (merged from {len(reports)} rank databases "
            f"{mpi.rank_db(db, 0).name} .. .rank{len(reports) - 1}, kept beside it for "
            f"resuming; {added} records added)", sum(r.compiled for r in reports),
            sum(r.corrupt for r in reports), not all(m.startswith("none") for m in tables),
            total.format(wall=wall, lanes=sum(r.lanes for r in reports),
                         over="ranks" if all(r.lanes == 1 for r in reports) else "ranks' lanes"))
    print("each rank's time: " + ", ".join(f"rank {r.rank} {r.phases.get('wall', 0.0):.1f} s "
                                          f"({len(r.names)} layers)" for r in reports))
    failed = [r for r in reports if r.error]
    for r in failed:
        print(f"sparseforge {args.command}: error: rank {r.rank}: {r.error} (its work so far "
              "is merged; run the job again to resume)", file=sys.stderr)
    return EXIT_ERROR if failed else EXIT_OK


class RankLog:
    """A stream that starts every line with '[rank R] ' (MPI ranks share
    the terminal)."""

    def __init__(self, stream, rank: int):
        self.stream, self.prefix, self._bol = stream, f"[rank {rank}] ", True

    def write(self, text: str) -> int:
        out = []
        for piece in text.splitlines(keepends=True):
            if self._bol:
                out.append(self.prefix)
            out.append(piece)
            self._bol = piece.endswith("\n")
        self.stream.write("".join(out))
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return False


@contextmanager
def _closing(tuner):
    """Closes the tuner's worker: at once on an interrupt (no waiting for a
    kernel being timed), else after it finishes."""
    try:
        yield tuner
    except KeyboardInterrupt:
        tuner.close(kill=True)
        raise
    else:
        tuner.close()


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
                      f"{rec['rows']:>5d}x{rec['cols']:<6d} {buckets or 'unusable'}")
            for rec in layers:
                if rec["problem"]:
                    print(f"warning: layer {rec['name']!r} ({rec['gpu_name']}) is unusable: "
                          f"{rec['problem']}; tune it again to replace it", file=sys.stderr)
        return EXIT_OK
    if args.action == "show":
        with _open_cache(args.db, create=False, readonly=True) as cache:
            recs = cache.layers(args.name)
            if not recs:
                print(f"no layer named {args.name!r}", file=sys.stderr)
                return EXIT_ERROR
            for rec in recs:
                print(f"layer {rec['name']} on {rec['gpu_name']}: {rec['op']}, {rec['rows']}x{rec['cols']}")
                if rec["problem"]:
                    print(f"  unusable: {rec['problem']}")
                for v in rec["variants"]:
                    launch = v["launch"]
                    print(f"  N={v['n_bucket']:<6d} {v['kernel_name']}  grid={launch['grid']} "
                          f"block={launch['block']} smem={launch['shared_bytes']} "
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
            added, skipped = cache.export_report(args.output, args.layer or None)
        for msg in skipped:
            print(f"warning: {msg}", file=sys.stderr)
        print(f"wrote {args.output}: {added} records" +
              (f"; {len(skipped)} damaged record(s) left out (above)" if skipped else ""))
        return EXIT_OK
    if args.action in ("import", "merge"):
        with _open_cache(args.db) as cache:
            for f in args.files:
                added, skipped = cache.merge_report(f)
                for msg in skipped:
                    print(f"warning: {msg}", file=sys.stderr)
                print(f"{f}: {added} records added" +
                      (f"; {len(skipped)} damaged record(s) skipped (above)" if skipped else ""))
        return EXIT_OK
    raise AssertionError(args.action)


# ---- export -----------------------------------------------------------------

def cmd_export(args) -> int:
    from .export import export
    out = Path(args.output)
    if out.exists() and any(out.iterdir()) and not args.force:
        raise ValueError(f"{out} exists and is not empty; pass --force to write into it")
    with _open_cache(args.db, create=False, readonly=True) as cache:
        bundle, files = export(cache, out, args.layers, args.arch.split(",") if args.arch else None,
                               args.weights, args.bundle, args.vectors)
    for msg in bundle.skipped:
        print(f"warning: {msg}", file=sys.stderr)
    print(f"wrote {out}: bundle {bundle.name} of {len(bundle.layers)} layer(s) for "
          f"{', '.join(bundle.archs)} ({len(bundle.cubins)} cubins, {len(bundle.packed)} packed "
          f"blobs, weights {'embedded' if args.weights == 'embed' else 'in ' + bundle.name + '.weights'})")
    print(f"build it: cmake -S {out} -B {out}/build && cmake --build {out}/build "
          f"(or add_subdirectory({out}) and link {bundle.name}::{bundle.name})")
    return EXIT_OK


# ---- parser -----------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    from .generator.families import pattern_syntax
    from .tuner.driver import NO_GPU_ARCHS
    from .tuner.strategies import strategy_names
    patterns = pattern_syntax()
    # options a user may give before or after the (sub)command: every parser
    # takes them, and a default only where none was given
    debug = argparse.ArgumentParser(add_help=False)
    debug.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="show the trace of an error")
    p = argparse.ArgumentParser(
        prog="sparseforge", parents=[debug],
        description="Generate, tune and cache sparse GPU kernels for pruned weight matrices.")
    p.add_argument("--version", action="version", version=f"sparseforge {_version()}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_parser = sub.add_parser

    def add_parser(*a, **kw):
        return _add_parser(*a, parents=[debug], **kw)
    sub.add_parser = add_parser

    def add_file(sp):
        sp.add_argument("file", help="weights: .npy .npz .safetensors .mtx .smtx, or a model "
                                     "recipe .toml (examples/llama_block.toml)")
        sp.add_argument("--name", help="one tensor of the file (default: every 2-D tensor)")
        sp.add_argument("--dtype", choices=["fp32", "fp16", "bf16"],
                        help="round the values to this type (default: the file's)")

    sp = sub.add_parser("inspect", help="analyze a pruned matrix: which families it fits, at what cost")
    add_file(sp)
    sp.add_argument("--json", action="store_true", help="machine-readable output")
    sp.set_defaults(func=cmd_inspect)

    sp = sub.add_parser("prune", help="magnitude-prune dense weights to a pattern")
    add_file(sp)
    sp.add_argument("--pattern", required=True, type=_pattern, help=patterns)
    sp.add_argument("--sparsity", required=True, type=float, help="fraction of zeros, e.g. 0.75")
    sp.add_argument("-o", "--output", required=True, help="output file (.npz .safetensors .mtx)")
    sp.add_argument("--seed", type=int, default=0)
    sp.add_argument("--jobs", type=_positive_int,
                    help="matrices pruned at once, in worker processes (default: every core, "
                         "where the file holds 4 M entries or more; the file is read a matrix "
                         "at a time)")
    sp.set_defaults(func=cmd_prune)

    sp = sub.add_parser("generate", help="write the specialized .cu and its cubin (no GPU needed)")
    add_file(sp)
    sp.add_argument("--pattern", required=True, type=_pattern, help=patterns)
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
        sp.add_argument("--arch", type=_archs,
                        help="target arch (default: the GPU present; without one "
                             f"{','.join(NO_GPU_ARCHS)}, and a comma-separated list is taken)")
        sp.add_argument("--strategy", default="auto", choices=["auto"] + strategy_names(),
                        help="auto: exhaustive for small spaces, else greedy")
        sp.add_argument("--budget", type=_budget, help="all | N trials | P%% of the space | Ns | Nm")
        sp.add_argument("--jobs", type=_positive_int,
                        help="parallel NVRTC compilations (default: all cores)")
        sp.add_argument("--quick", action="store_true", help="shorter timing (fewer repetitions)")
        sp.add_argument("--seed", type=int, help="seed of the verification inputs (default: fresh)")
        sp.add_argument("--gpus", type=_gpus,
                        help="measure on several GPUs of this host: all, or ordinals such as "
                             "0,1 (one worker each; under MPI, the GPUs the ranks of a host "
                             "take one each)")
        sp.add_argument("--lanes", type=_positive_int,
                        help="searches in flight on each GPU, taking turns on it: one measures "
                             "while another waits for its kernels to compile (default: 2 where "
                             "a GPU is present, else 1)")
        sp.add_argument("--mixed-gpus", action="store_true",
                        help="allow GPUs of different models (every layer is tuned on each "
                             "model, stored under each GPU's name)")
        sp.add_argument("--no-early-stop", action="store_true",
                        help="time every candidate in full (default: stop after a short probe "
                             "one that is clearly slower than the best so far)")
        sp.add_argument("--profile", action="store_true",
                        help="also print each layer's searches and where their time went")
        sp.add_argument("--retime", action="store_true",
                        help="verify and time again the winners the database holds (default: "
                             "report the times recorded when they were tuned on this GPU)")

    sp = sub.add_parser("tune", help="tune every sparse layer of a weights file (the main job)")
    add_file(sp)
    sp.add_argument("--pattern", type=_pattern,
                    help=f"family for every layer ({patterns}; default: the one each layer fits)")
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

    sp = sub.add_parser("export", help="write tuned layers as a C deployment bundle (needs "
                                       "the CUDA driver alone)")
    sp.add_argument("db", help="the database the layers were tuned into")
    sp.add_argument("-o", "--output", required=True, help="the bundle's folder")
    sp.add_argument("--layers", nargs="+", help="the layers to export (default: every one)")
    sp.add_argument("--arch", type=_archs, help="architectures to export, comma-separated "
                    "(default: those the layers were tuned or compiled for)")
    sp.add_argument("--weights", choices=["embed", "file"], default="embed",
                    help="packed weights in the C source (default) or in one side file")
    sp.add_argument("--bundle", default="sfmodel", help="the bundle's C name (default sfmodel)")
    sp.add_argument("--vectors", metavar="WEIGHTS",
                    help="also write test vectors from the weights file the layers came from")
    sp.add_argument("--force", action="store_true", help="write into a non-empty folder")
    sp.set_defaults(func=cmd_export)

    sp = sub.add_parser("cache", help="see and manage what is stored")
    db = argparse.ArgumentParser(add_help=False)
    db.add_argument("--db", default=argparse.SUPPRESS,
                    help="cache database (default: the user's); before or after the action")
    sp.add_argument("--db", help="cache database (default: the user's)")
    csub = sp.add_subparsers(dest="action", required=True, metavar="ACTION")
    _add_action = csub.add_parser

    def add_action(*a, **kw):
        return _add_action(*a, parents=[db, debug], **kw)
    csub.add_parser = add_action
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
    debug = getattr(args, "debug", False)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print(f"sparseforge {args.command}: interrupted; every kernel compiled and every trial "
              "measured so far is stored: run the same command again to resume",
              file=sys.stderr)
        sys.stderr.flush()
        sys.stdout.flush()
        # compilations still running in their threads must not hold the
        # exit (they finish into nothing); the database is already committed
        os._exit(EXIT_INTERRUPTED)
    except Exception as e:  # noqa: BLE001 - every failure is one line (the trace with --debug)
        if debug:
            import traceback
            traceback.print_exc()
        print(f"sparseforge {args.command}: error: {_sentence(e)}", file=sys.stderr)
        return EXIT_ERROR


def _sentence(e: BaseException) -> str:
    """The error as a user reads it: the library's, the reader's or the
    checker's own sentence; anything unexpected named as such."""
    from ._lib import SFError
    if isinstance(e, (SFError, ValueError, KeyError, OSError)):
        text = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        if isinstance(e, OSError) and e.filename and str(e.filename) not in text:
            text = f"{e.filename}: {e.strerror or text}"
        return text
    if isinstance(e, MemoryError):
        return "out of memory (the input may be larger than this machine holds)"
    return (f"unexpected {type(e).__name__}: {e} (a defect: run again with --debug for the "
            "trace and report it)")


if __name__ == "__main__":
    sys.exit(main())
