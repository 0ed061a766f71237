"""bench/tune_model.py without a GPU: the BERT-base-sized model is built
and pruned, and --dry-run counts the work (a later block of layers only
adds warm searches); the sampled pairs are spread over the model."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import tune_model  # noqa: E402

from sparseforge.tuner.driver import WARM_MIN, WARM_SHARE  # noqa: E402


def test_the_model_is_bert_base_sized_and_pruned():
    mats = tune_model.build(tune_model.bert_recipe("shflbw:64", 0.75, layers=1))
    shapes = {n: m.shape for n, m in mats}
    assert shapes == {"attention.query.weight": (768, 768), "attention.key.weight": (768, 768),
                      "attention.value.weight": (768, 768), "attention.output.weight": (768, 768),
                      "intermediate.weight": (3072, 768), "output.weight": (768, 3072)}
    assert all(m.density == pytest.approx(0.25, abs=0.01) and m.perm is not None
               for _, m in mats)
    twelve = tune_model.bert_recipe("nm24", None)
    assert twelve["repeat"] == 12 and "sparsity" not in twelve["layer"][0]


def test_a_dry_run_counts_the_work_and_later_blocks_start_warm(capsys):
    one = tune_model.plan(tune_model.build(tune_model.bert_recipe("nm24", None, 1)),
                          [16, 256, 4096], "sm_90a")
    two = tune_model.plan(tune_model.build(tune_model.bert_recipe("nm24", None, 2)),
                          [16, 256, 4096], "sm_90a")
    assert (one["matrices"], one["tuned"], one["searches"]) == (6, 6, 18)
    space = one["spaces"]["nm24 768x768"]
    warm = max(WARM_MIN, math.ceil(space / WARM_SHARE))
    assert two["planned_trials"] - one["planned_trials"] == 18 * warm   # the second block: warm
    assert tune_model.main(["--dry-run", "--layers", "1", "--prunings", "nm24"]) == 0
    out = capsys.readouterr().out
    assert "nm24: 6 matrices (6 tuned, 0 skipped), 18 searches" in out


def test_samples_spread_over_kinds_blocks_and_n():
    from sparseforge.tuner.driver import LayerResult
    from sparseforge.tuner.model import ModelRow
    rows = [ModelRow(f"layers.{b}.{k}", LayerResult(f"layers.{b}.{k}", "nm24", "op", None))
            for b in range(3) for k in ("q", "k", "up")]
    picks = tune_model.samples(rows, [16, 256, 4096], 6)
    assert len(picks) == 6 and len(set(picks)) == 6
    assert {name.split(".", 2)[-1] for name, _ in picks} == {"q", "k", "up"}
    assert {name.split(".")[1] for name, _ in picks} == {"0", "2"}
    assert {n for _, n in picks} == {16, 256, 4096}
    assert tune_model.parse_pruning("shflbw:64@0.75") == ("shflbw:64", 0.75)
    assert tune_model.parse_pruning("nm24") == ("nm24", None)


def test_a_run_reports_both_runs_and_the_samples_against_the_exhaustive_best(tmp_path,
                                                                             monkeypatch):
    """The GPU path of the benchmark, with a replaying worker for the GPU
    and six configurations per space (compiled for real)."""
    import argparse
    from sparseforge.generator.families import get_family
    from sparseforge.tuner.driver import Tuner
    from replay import ReplayWorker
    fam = get_family("nm24")
    full = fam.search_space
    monkeypatch.setattr(fam, "search_space", lambda *a, **k: full(*a, **k)[:6])
    args = argparse.Namespace(db_dir=str(tmp_path), n=[16, 256], samples=3, layers=1)
    mats = tune_model.build(tune_model.bert_recipe("nm24", None, 1))
    out = tune_model.run_pruning(args, "nm24", mats,
                                 lambda cache, **kw: Tuner(cache, worker=ReplayWorker(), jobs=2,
                                                           **kw))
    first, second = out["first"], out["second"]
    assert first["trials"] == 6 * 2 * 6 and first["compiled"] > 0
    assert second["compiled"] == 0 and second["trials"] == first["trials"]
    assert "time " in first["phases"]
    assert len(out["samples"]) == 3
    for s in out["samples"]:
        assert s["space"] == 6 and s["ratio"] >= 1.0 and s["best_ms"] > 0
        assert s["retimed"] > 0        # measured again side by side (1.0: the same config)
    text = tune_model.table([out], args, "abc1234")
    assert "| nm24 | 6 first" not in text and "Replay GPU" in text
    assert text.count("| nm24 |") == 1 + 3
    # --resume: a later call keeps the runs and searches only the samples not done
    state = tmp_path / "nm24.json"
    kept = json.loads(state.read_text())
    kept["samples"] = kept["samples"][:1]
    state.write_text(json.dumps(kept))
    searched = []
    args.resume = True
    again = tune_model.run_pruning(
        args, "nm24", mats,
        lambda cache, **kw: Tuner(cache, worker=ReplayWorker(on_trial=lambda w, t: searched.append(t)),
                                  jobs=2, **kw))
    assert again["first"] == json.loads(json.dumps(first)) and len(again["samples"]) == 3
    assert [s["layer"] for s in again["samples"]] == [s["layer"] for s in out["samples"]]
    assert searched == []    # the samples' trials are in the database: nothing measured again


def test_side_by_side_alternates_and_compares_medians():
    """The winner and the exhaustive best measured again in alternation;
    the ratio of the medians (an outlier does not move it); NaN when a
    measurement fails or a configuration is unknown; 1.0 for the same."""
    class Entry:
        op = "op"

        def get_matrix(self):
            return "matrix"

    class FakeTuner:        # Tuner.measure_rounds: configurations in turn, each round
        def __init__(self, fail=False):
            self.calls, self.fail = [], fail

        def measure_rounds(self, matrix, pattern, params, op, n, configs, rounds):
            infos = [[] for _ in configs]
            for _ in range(rounds):
                for cfg, out in zip(configs, infos):
                    self.calls.append(cfg["c"])
                    if self.fail and len(self.calls) == 3:
                        return "wrong", {}
                    t = {"w": 1.1, "b": 1.0}[cfg["c"]] * (5.0 if len(self.calls) == 1 else 1.0)
                    out.append({"median_ms": t})
            return "ok", infos

    t = FakeTuner()
    r = tune_model._side_by_side(t, Entry(), "nm24", {}, 16, {"c": "w"}, {"c": "b"})
    assert r == pytest.approx(1.1)
    assert t.calls == ["w", "b"] * tune_model.RETIME_ROUNDS
    assert math.isnan(tune_model._side_by_side(FakeTuner(fail=True), Entry(), "nm24", {}, 16,
                                               {"c": "w"}, {"c": "b"}))
    assert math.isnan(tune_model._side_by_side(t, Entry(), "nm24", {}, 16, None, {"c": "b"}))
    assert tune_model._side_by_side(t, Entry(), "nm24", {}, 16, {"c": "b"}, {"c": "b"}) == 1.0
