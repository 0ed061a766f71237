"""bench/csr.py without a GPU: the suites' problems (shapes, N, densities,
dtypes, targets), the pruned matrices, the report's tables and target
verdicts, and --dry-run (matrices made, spaces counted, hint kernels
compiled)."""
from __future__ import annotations

import math
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import csr as bench  # noqa: E402


def test_the_suites_problems():
    probs = bench.problems(["decode", "prefill"])
    decode = [p for p in probs if p.suite == "decode"]
    prefill = [p for p in probs if p.suite == "prefill"]
    assert len(decode) == 3 * 2 * 3 and len(prefill) == 3 * 2
    assert {(p.m, p.k) for p in probs} == {(4096, 4096), (11008, 4096), (4096, 11008)}
    assert {p.n for p in decode} == {16, 64} and {p.n for p in prefill} == {4096}
    assert {(p.density, p.target) for p in decode} == {(0.5, 1.25), (0.3, 1.9), (0.1, 3.5)}
    assert {(p.density, p.target) for p in prefill} == {(0.3, 1.0), (0.1, 1.0)}
    assert all(p.dtype == "fp16" for p in probs)
    assert [p.suite for p in probs] == ["decode"] * 18 + ["prefill"] * 6


def test_the_problems_selected():
    """--densities, --n and --only narrow the suites; they combine."""
    def pick(**kw):
        args = SimpleNamespace(**dict(dict(suites="decode,prefill", small=False, densities="",
                                           dtypes="", n="", only=""), **kw))
        return bench.selected(args)
    assert len(pick()) == 24
    got = pick(densities="0.5", n="64", only="4096x11008")
    assert [(p.suite, p.name, p.density, p.n) for p in got] == [("decode", "4096x11008", 0.5, 64)]
    assert {p.n for p in pick(n="16,4096")} == {16, 4096}
    assert pick(n="32") == []


def test_dlmc_problems(dlmc_dir, monkeypatch):
    monkeypatch.setenv("SPARSEFORGE_DLMC", str(dlmc_dir))
    probs = bench.problems(["dlmc"])
    files = sorted(dlmc_dir.rglob("*.smtx"))
    assert len(probs) == len(files) * 2 * 2
    assert {p.dtype for p in probs} == {"fp16", "fp32"}
    rn50 = [p for p in probs if p.name.startswith("rn50/")]
    tf = [p for p in probs if p.name.startswith("transformer/")]
    assert {p.n for p in tf} == {256, 2048}
    sizes = dict(line.split(",") for line in
                 (dlmc_dir / "rn50_batchsizes.txt").read_text().split())
    for p in rn50:
        n1 = int(sizes[p.name.split("/")[-1]])
        assert p.n in (n1, 8 * n1)
    m = tf[0].make()
    assert m.shape == (tf[0].m, tf[0].k) and m.dtype == tf[0].dtype
    assert m.density == pytest.approx(tf[0].density)


def test_pruned_normal_has_the_density_and_keeps_the_largest():
    m = bench.pruned_normal(64, 80, 0.3, "fp16", 0)
    assert m.nnz == round(0.3 * 64 * 80) and m.dtype == "fp16"
    import numpy as np
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 80), dtype=np.float32)
    kept = np.abs(w[m.mask()])
    assert kept.min() >= np.abs(w[~m.mask()]).max()


def _row(ms, cublas, cusparse, bf16=math.nan):
    return dict(ms=ms, cublas=cublas, speedup=cublas / ms, err=1e-3, trials=5, failed=0,
                config={"bn": 16}, cusparse=cusparse, bf16=bf16)


def test_report_tables_and_verdicts():
    probs = bench.problems(["decode"])[:4]        # 4096 x 4096 at d = 0.5 (N 16, 64) and 0.3
    probs[0].row = _row(0.008, 0.011, 0.05, 0.0081)
    probs[1].row = _row(0.009, 0.0112, 0.06)
    probs[2].row = _row(0.005, 0.011, 0.03)
    probs[3].row = _row(0.0055, 0.0115, 0.01)
    fp32 = bench.Problem("dlmc", "rn50/0.9/x", 64, 256, 3136, "fp32", 0.1, group="rn50 0.9 fp32")
    fp32.row = _row(0.01, 0.026, 0.05)
    args = SimpleNamespace(layout="tm", strategy="greedy", budget="24", label="note")
    text = bench.report(probs + [fp32], "H100", 3.0e12, args)
    assert "| decode | 4096x4096 | 0.500 | 16 | fp16 | 0.0080 | 0.0110 | 1.38x | 1.25x | 1.68x |" in text
    assert "| decode d=0.5 | 2 | 1.24x | 1.31x | 1.25x | no |" in text    # 1.24x < 1.25x
    assert "| decode d=0.3 | 2 | 2.09x | 2.14x | 1.90x | yes |" in text
    assert "| rn50 0.9 fp32 | 1 | 2.60x | 2.60x | 3.40x | floor |" in text
    assert "fp16 rows against cuSPARSE CSR fp16: min 1.82x (target >= 2x)." in text
    assert "1.012" in text and "note" in text


def test_dry_run_makes_counts_and_compiles(capsys):
    assert bench.main(["--dry-run", "--small", "--suites", "prefill", "--compile", "1"]) == 0
    out = capsys.readouterr().out
    assert "6 problems (prefill), layout tm, kernels for sm_90a" in out
    assert "prefill 256x256" in out and "N=256 fp16" in out
    assert "6 kernels compiled; nothing was measured (dry run)" in out
    with pytest.raises(SystemExit):
        bench.main(["--dry-run", "--suites", "bogus"])
    assert bench.main(["--dry-run", "--small", "--suites", "decode", "--only", "688x256",
                       "--compile", "0"]) == 0
    out = capsys.readouterr().out
    assert "6 problems (decode)" in out and "256x688 " not in out


def test_probe_measures_side_by_side(capsys):
    """bench/csr_probe.py with a replaying worker: one line per
    configuration and density, verified trials, a bad configuration named."""
    sys.path.insert(0, str(ROOT / "tests" / "py"))
    import csr_probe
    from replay import ReplayWorker
    from sparseforge.generator.kernel import ConfigError
    cfgs = '[{"mf":1,"wm":2,"wk":2,"ksw":2,"bn":16,"stages":4,"ck":1},' \
           ' {"mf":1,"wm":2,"wk":1,"ksw":4,"bn":16,"stages":3,"ck":1}]'
    w = ReplayWorker()
    assert csr_probe.main(["64", "96", "16", "--densities", "0.5,0.2", "--rounds", "2",
                           "--configs", cfgs], worker=w) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if " us " in x]
    assert len(lines) == 4 and all("csr 64x96 N=16 tm fp16" in x for x in lines)
    assert len(w.trials) == 2 * 2 * 2
    # a configuration that fails is named, and the other is measured without it
    w = ReplayWorker(fail_names={"ksw2"})
    assert csr_probe.main(["64", "96", "16", "--densities", "0.5", "--rounds", "2",
                           "--configs", cfgs], worker=w) == 1
    out = capsys.readouterr().out
    failed = [x for x in out.splitlines() if "launch_fail" in x]
    assert len(failed) == 1 and '"ksw":2' in failed[0]
    lines = [x for x in out.splitlines() if " us " in x]
    assert len(lines) == 1 and '"ksw": 4' in lines[0]
    # the same matrices cut to two of every four along K (the split 2:4 residual empty)
    w = ReplayWorker()
    assert csr_probe.main(["64", "96", "16", "--densities", "0.5", "--rounds", "1",
                           "--two-of-four", "--configs", cfgs], worker=w) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if " us " in x]
    assert len(lines) == 2 and all("two of four (d=0.4" in x for x in lines)
    from csr import pruned_normal
    from sparseforge.generator.families.nm24.pack import first_violation
    cut = csr_probe.two_of_four(pruned_normal(64, 96, 0.5, "fp16", 0))
    assert first_violation(cut) is None and 0.4 < cut.density < 0.5
    # another family: its own pattern and parameters
    w = ReplayWorker()
    assert csr_probe.main(["128", "96", "16", "--pattern", "bsr:32x32", "--densities", "0.5",
                           "--rounds", "2", "--configs",
                           '[{"bk":32,"bn":16,"stages":2,"wm":2,"wn":1}]'], worker=w) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if " us " in x]
    assert len(lines) == 1 and lines[0].startswith("bsr:32x32 128x96 N=16 tm fp16 d=0.5")
    assert len(w.trials) == 2
    # a fused epilogue (bias and GELU: verified against the reference with a bias)
    w = ReplayWorker()
    assert csr_probe.main(["128", "96", "16", "--pattern", "bsr:32x32", "--densities", "0.5",
                           "--rounds", "1", "--bias", "--activation", "gelu", "--configs",
                           '[{"bk":32,"bn":16,"stages":2,"wm":2,"wn":1}]'], worker=w) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if " us " in x]
    assert len(lines) == 1 and lines[0].startswith("bsr:32x32 128x96 N=16 tm fp16 bias_gelu d=0.5")
    assert len(w.trials) == 1 and "bias_gelu" in w.trials[0]
    with pytest.raises(SystemExit):
        csr_probe.main(["128", "96", "16", "--activation", "tanh", "--configs", "[{}]"], worker=w)
    # one matrix from a file (fp32 kernels; a shape that is not the file's is an error)
    dense = np.where(np.random.default_rng(3).random((48, 40)) < 0.2, 1.0, 0.0).astype(np.float32)
    w = ReplayWorker()
    with tempfile.TemporaryDirectory() as tmp:
        f = Path(tmp) / "w.npy"
        np.save(f, dense)
        assert csr_probe.main(["48", "40", "8", "--dtype", "fp32", "--layout", "fm", "--matrix",
                               str(f), "--rounds", "2", "--configs",
                               '[{"tables":"global","vec":1,"rows":2,"split":1,"unroll":4}]'],
                              worker=w) == 0
        lines = [x for x in capsys.readouterr().out.splitlines() if " us " in x]
        assert len(lines) == 1 and lines[0].startswith("csr 48x40 N=8 fm fp32 d=0.")
        assert "w.npy" in lines[0] and len(w.trials) == 2
        with pytest.raises(SystemExit):
            csr_probe.main(["40", "48", "8", "--dtype", "fp32", "--matrix", str(f),
                            "--configs", '[{"tables":"global"}]'], worker=ReplayWorker())
    with pytest.raises(ConfigError, match="ksw"):
        csr_probe.main(["64", "96", "16", "--configs", '[{"mf":1,"wm":2,"wk":1,"ksw":3,'
                        '"bn":16,"stages":4,"ck":1}]'], worker=ReplayWorker())


def test_ncu_top_reads_a_source_page(tmp_path, capsys):
    """bench/ncu_top.py: totals by stall reason (samples with no named
    reason counted apart), the busiest instructions, two files side by
    side; a file that is not a source page is refused."""
    import ncu_top
    head = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed",
            "stall_long_sb", "stall_wait", "stall_wait (Not Issued)"]

    def page(name, rows):
        lines = ['"Kernel Name","sf_k",'] + [",".join(f'"{c}"' for c in r) for r in [head] + rows]
        f = tmp_path / name
        f.write_text("\n".join(lines) + "\n")
        return str(f)
    a = page("a.csv", [["0x100", "HGMMA.SP R24", "89", "4096", "0", "1", "0"],
                       ["0x110", "@!P0 BRA 0x100", "90", "4,096", "90", "0", "0"],
                       ["0x120", "LDS R2, [R3]", "3", "512", "0", "3", "3"]])
    b = page("b.csv", [["0x100", "HGMMA.SP R24", "8", "4096", "0", "0", "0"]])
    assert ncu_top.main([a, b, "--top", "2"]) == 0
    out = capsys.readouterr().out
    assert "| samples | 182 | 8 |" in out and "| executed | 8,704 | 4,096 |" in out
    assert "| unnamed | 88 | 8 |" in out and "| stall_long_sb | 90 | 0 |" in out
    busiest = [x for x in out.splitlines() if "%" in x]
    assert len(busiest) == 2 and "+00010" in busiest[0] and "(long_sb 90)" in busiest[0]
    assert "HGMMA" in busiest[1] and "wait 1, unnamed 88" in busiest[1]
    bad = tmp_path / "c.csv"
    bad.write_text('"Kernel Name","sf_k",\n"ID","Metric"\n')
    with pytest.raises(ValueError, match="not an ncu source page"):
        ncu_top.read(bad)
    assert ncu_top.main([str(bad)]) == 2 and "not an ncu source page" in capsys.readouterr().err
