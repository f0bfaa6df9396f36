"""The quality benchmark (benchmarks/quality/run.py) end to end on a tiny model, and its statistics by hand."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

import foresight
from evaluation.quality import quality_markdown, quality_summary
from foresight.errors import ForesightError
from foresight.scorer import Scorer, ScorerConfig
from golden.labels import save_labels
from golden.oracle import label_trace
from tests.conftest import load_script, get_model, save_random_traces



def _run_module(name: str = "run"):
    return load_script(f"quality/{name}.py", f"quality_{name}")


def _rec(policy, ratios: dict[str, float], pooled: float | None = None) -> dict:
    mean = sum(ratios.values()) / len(ratios)
    return {"policy": policy, "budget": 16, "interval": 4, "traces": len(ratios), "per_trace_ratio": ratios,
            "loss_ratio": mean if pooled is None else pooled, "mean_trace_ratio": mean}


def test_summary_by_hand():
    recs = [
        _rec("golden", {"a": 1.0, "b": 1.0}),
        _rec("h2o", {"a": 1.2, "b": 1.4}),
        _rec("random", {"a": 2.0, "b": 2.0}),
        _rec("sl", {"a": 1.1, "b": 1.3}),
        _rec("grpo", {"a": 1.05, "b": 1.25}),
    ]
    s = quality_summary(recs, ["sl", "grpo"])
    assert s["best_heuristic"] == "h2o"
    sl, grpo = s["stages"]
    assert math.isclose(sl["gap_closed"], (1.3 - 1.2) / (1.3 - 1.0))
    share = sl["gap_closed_per_trace"]  # per-trace means: h2o 1.3, golden 1.0, sl 1.2
    assert math.isclose(share["share"], 1 / 3) and share["ci_low"] <= 1 / 3 <= share["ci_high"]
    assert math.isclose(sl["vs_best_heuristic"]["mean"], -0.1)
    assert sl["vs_best_heuristic"]["ci_high"] < 0  # better on every trace by exactly 0.1
    assert math.isclose(grpo["vs_previous_stage"]["mean"], -0.05) and grpo["vs_previous_stage"]["previous"] == "sl"
    with pytest.raises(ForesightError, match="different traces"):
        quality_summary([*recs[:4], _rec("grpo", {"a": 1.0, "c": 1.0})], ["sl", "grpo"])
    with pytest.raises(ForesightError, match="no fidelity record for golden"):
        quality_summary(recs[1:], ["sl"])



def _cluster_interval(stat, ids: list[str], seed: int = 0, n: int = 10000) -> tuple[float, float]:
    """Brute force: resample whole problems (``problem_of``, sorted), ``stat`` of each resample's trace ids."""
    problems = sorted({t.rsplit("#", 1)[0] for t in ids})
    members = {p: [t for t in ids if t.rsplit("#", 1)[0] == p] for p in problems}
    rows = np.random.default_rng(seed).integers(0, len(problems), size=(n, len(problems)))
    vals = [v for v in (stat([t for g in row for t in members[problems[g]]]) for row in rows) if v is not None]
    return float(np.percentile(vals, 2.5)), float(np.percentile(vals, 97.5))


def test_summary_resamples_problems_where_a_problem_has_several_traces():
    """The summary's intervals resampled traces even where a problem had 6 traces (temperature_s31's 48 validation
    traces of 8 problems: t005 - t003 -0.0204 [-0.0356, -0.0087] was reported, by problem [-0.0324, -0.0110])."""
    rng = np.random.default_rng(4)
    ids = [f"q{p}#{k}" for p in range(5) for k in range(1 + 3 * (p == 0))] + ["r#0"]  # q0 has 4 traces, others 1
    effect = {t: rng.normal(0, 0.1) for t in ids}
    golden = {t: 1.05 + 0.01 * rng.random() for t in ids}
    tova = {t: 1.4 + effect[t] + 0.1 * rng.random() for t in ids}
    sl = {t: 1.2 + effect[t] + 0.05 * (t.startswith("q0")) + 0.1 * rng.random() for t in ids}
    s = quality_summary([_rec("golden", golden), _rec("tova", tova), _rec("sl", sl), _rec("grpo", golden)],
                        ["grpo", "sl"], seed=0)
    assert s["stages"][1]["vs_best_heuristic"]["n_groups"] == 6
    st = s["stages"][1]

    def mean(r, sel):
        return sum(r[t] for t in sel) / len(sel)

    v = st["vs_best_heuristic"]
    assert (v["ci_low"], v["ci_high"]) == pytest.approx(
        _cluster_interval(lambda sel: mean(sl, sel) - mean(tova, sel), ids))
    prev = st["vs_previous_stage"]
    assert (prev["ci_low"], prev["ci_high"]) == pytest.approx(
        _cluster_interval(lambda sel: mean(sl, sel) - mean(golden, sel), ids))

    def share(sel):
        gap = mean(tova, sel) - mean(golden, sel)
        return (mean(tova, sel) - mean(sl, sel)) / gap if gap > 0 else None

    g = st["gap_closed_per_trace"]
    assert g["n_groups"] == 6 and (g["ci_low"], g["ci_high"]) == pytest.approx(_cluster_interval(share, ids))
    assert "of 6 problems; the intervals resample problems" in quality_markdown([s])
    # one trace per problem: traces resampled, as before
    one = quality_summary([_rec("golden", {"a#0": 1.0, "b#0": 1.0}), _rec("tova", {"a#0": 1.3, "b#0": 1.2}),
                           _rec("sl", {"a#0": 1.1, "b#0": 1.2})], ["sl"])
    assert "n_groups" not in one["stages"][0]["vs_best_heuristic"] and "problems" not in quality_markdown([one])


def test_benchmark_runs_on_a_tiny_model(tmp_path, capsys, monkeypatch):
    model, _ = get_model("tiny-llama")
    traces = tmp_path / "traces"
    rows = save_random_traces(model, traces, (70, 90, 60, 80), seed=5)
    (tmp_path / "heldout.txt").write_text("p0\np1\np3\n")
    args = ["--model", "tiny-llama", "--traces", str(traces), "--heldout-ids", str(tmp_path / "heldout.txt"),
            "--policies", "streaming_llm,h2o,random", "--out", str(tmp_path / "out"),
            "--policy-arg", "grpo.selection=sample", "--policy-arg", "random.seed=3"]
    for b, w in ((16, 4), (24, 8)):
        labels = [label_trace(model, torch.tensor([ids]), b, w, trace_id=t)
                  for t, ids in zip(rows["trace_id"], rows["input_ids"])]
        (tmp_path / f"g{b}").mkdir()
        save_labels(tmp_path / f"g{b}" / "labels.safetensors", labels)
        for stage, seed in (("sl", 0), ("grpo", 1)):
            cfg = ScorerConfig(foresight.model_fingerprint(model), budget=b, interval=w, hidden=8)
            Scorer(cfg, seed=seed).save_pretrained(tmp_path / f"{stage}{b}")
            args += ["--scorer", f"{stage}={tmp_path / f'{stage}{b}'}"]
        args += ["--setting", f"{b}:{w}={tmp_path / f'g{b}'}"]
    # killed in its second setting (one batch of 3 traces per setting, 7 replays each: full, golden, 2 stages, 3
    # policies), then rerun: the first setting is read back, the second replayed
    import evaluation.fidelity as fidelity

    real, calls = fidelity.replay, []

    def crashing(*a, **k):
        calls.append(1)
        if len(calls) > 7 + 3:
            raise KeyboardInterrupt
        return real(*a, **k)

    with monkeypatch.context() as m:
        m.setattr(fidelity, "replay", crashing)
        with pytest.raises(KeyboardInterrupt):
            _run_module().main(args)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["partial_B16_W4.jsonl"]
    calls.clear()
    with monkeypatch.context() as m:
        m.setattr(fidelity, "replay", lambda *a, **k: calls.append(1) or real(*a, **k))
        assert _run_module().main(args) == 0
    assert len(calls) == 7
    result = json.loads((tmp_path / "out" / "quality.json").read_text())
    assert result["meta"]["resumed"] is True and not list((tmp_path / "out").glob("partial_*"))
    assert _run_module().main([*args, "--out", str(tmp_path / "whole")]) == 0
    whole = json.loads((tmp_path / "whole" / "quality.json").read_text())
    assert whole["meta"]["resumed"] is False
    # another benchmark into a finished --out overwrote its results without a word; refused before any compute
    before = (tmp_path / "whole" / "quality.json").read_bytes()
    with pytest.raises(ForesightError, match="holds the finished results of another benchmark .*policies differs"):
        _run_module().main([*args, "--out", str(tmp_path / "whole"), "--policies", "h2o,random"])
    assert (tmp_path / "whole" / "quality.json").read_bytes() == before
    assert (result["records"], result["summaries"]) == (whole["records"], whole["summaries"])
    # two ranks (RANK/WORLD_SIZE) each replay their batches, then one process sums them without a replay: exactly
    # an unsharded run's numbers
    one = [*args, "--batch-size", "1"]
    assert _run_module().main([*one, "--out", str(tmp_path / "b1")]) == 0
    sharded = tmp_path / "sharded"
    for rank in (1, 0):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        assert _run_module().main([*one, "--out", str(sharded)]) == 0
    assert sorted(p.name for p in sharded.iterdir()) == [f"partial_B{b}_W{w}.rank{r}of2.jsonl"
                                                        for b, w in ((16, 4), (24, 8)) for r in (0, 1)]
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    calls.clear()
    with monkeypatch.context() as m:
        m.setattr(fidelity, "replay", lambda *a, **k: calls.append(1) or real(*a, **k))
        assert _run_module().main([*one, "--out", str(sharded)]) == 0
    assert calls == [] and not list(sharded.glob("partial_*"))
    b1, got = (json.loads((d / "quality.json").read_text()) for d in (tmp_path / "b1", sharded))
    assert (got["records"], got["summaries"]) == (b1["records"], b1["summaries"])
    assert [(s["budget"], s["interval"], s["traces"]) for s in result["summaries"]] == [(16, 4, 3), (24, 8, 3)]
    for s in result["summaries"]:
        assert set(s["policies"]) == {"golden", "sl", "grpo", "streaming_llm", "h2o", "random"}
        assert [st["stage"] for st in s["stages"]] == ["sl", "grpo"]
        for st in s["stages"]:
            ci = st["vs_best_heuristic"]
            assert ci["ci_low"] <= ci["mean"] <= ci["ci_high"] and ci["n_traces"] == 3
        assert "vs_previous_stage" in s["stages"][1]
    for r in result["records"]:
        assert sorted(r["per_trace_ratio"]) == ["p0#0", "p1#0", "p3#0"]  # the held-out split only
    assert result["meta"]["policy_args"] == {"grpo": {"selection": "sample"}, "random": {"seed": 3}}
    # each stage's weights are identified by their hash (a shipped short name may later point at newer weights)
    assert result["meta"]["scorer_sha256"] == {
        f"{st}@B{b}W{w}": hashlib.sha256((tmp_path / f"{st}{b}" / "model.safetensors").read_bytes()).hexdigest()
        for st in ("sl", "grpo") for b, w in ((16, 4), (24, 8))}
    assert (tmp_path / "out" / "quality.png").stat().st_size > 0
    assert "gap closed" in (tmp_path / "out" / "quality.md").read_text()
    # a bad stage hyperparameter and a stage named like a policy are refused before any compute
    with pytest.raises(ForesightError, match="policy 'sl': selection must be one of"):
        _run_module().main([*args, "--policy-arg", "sl.selection=bogus"])
    with pytest.raises(ForesightError, match="may not be named like a policy"):
        _run_module().main([*args, "--scorer", f"h2o={tmp_path / 'sl16'}"])
    # a stage's scorer as a hyperparameter was a TypeError traceback; learned as a heuristic failed after the checks
    with pytest.raises(ForesightError, match="--policy-arg sl.scorer: a stage's scorer comes from --scorer sl=DIR"):
        _run_module().main([*args, "--policy-arg", f"sl.scorer={tmp_path / 'sl16'}"])
    with pytest.raises(ForesightError, match="--policies: learned is not a heuristic here"):
        _run_module().main([*args, "--policies", "h2o,learned"])
    # a stage without a scorer for one setting is refused before any compute
    i = args.index(f"grpo={tmp_path / 'grpo24'}")
    with pytest.raises(ForesightError, match="no scorer for B=24 W=8"):
        _run_module().main(args[: i - 1] + args[i + 1 :])


def test_benchmark_refuses_what_would_fail_after_the_replays_before_any(tmp_path, monkeypatch):
    """A bad second setting, a policy named twice (or golden named), no heuristic, a missing --heldout-ids file and
    bad numbers are refused before any replay and before --out is created (the summary used to fail only after every
    replay of every setting, leaving a journal behind, or a traceback escaped)."""
    import evaluation.fidelity as fidelity

    model, _ = get_model("tiny-llama")
    rows = save_random_traces(model, tmp_path / "traces", (40, 44), seed=5)
    labels = [label_trace(model, torch.tensor([ids]), 16, 4, trace_id=t)
              for t, ids in zip(rows["trace_id"], rows["input_ids"])]
    (tmp_path / "g16").mkdir()
    save_labels(tmp_path / "g16" / "labels.safetensors", labels)
    out = tmp_path / "out"
    args = ["--model", "tiny-llama", "--traces", str(tmp_path / "traces"), "--setting", f"16:4={tmp_path / 'g16'}",
            "--policies", "h2o", "--out", str(out)]
    monkeypatch.setattr(fidelity, "replay", lambda *a, **k: pytest.fail("replayed before refusing"))
    for extra, match in ((["--setting", f"24:8={tmp_path / 'nothere'}"], "nothere"),
                         (["--setting", f"24:8={tmp_path / 'g16'}"], "made for B=16 W=4, not B=24 W=8"),
                         (["--setting", f"16:4={tmp_path / 'g16'}"], "B:W given twice"),
                         (["--policies", "h2o,h2o"], "h2o named twice"),
                         (["--policies", "golden,h2o"], "golden named twice"),
                         (["--policies", "full"], "no heuristic"),
                         (["--heldout-ids", str(tmp_path / "ids.txt")], "ids.txt")):
        with pytest.raises(ForesightError, match=match):
            _run_module().main([*args, *extra])
        assert not out.exists(), extra
    for flag, value in (("--batch-size", "0"), ("--max-traces", "-1")):
        with pytest.raises(SystemExit) as exc:
            _run_module().main([*args, flag, value])
        assert exc.value.code == 2 and not out.exists()


def test_benchmark_refuses_a_setting_with_w_not_below_b_before_the_model_load(tmp_path):
    """--setting 16:16 (W >= B) or 0:4 and paged at a W its blocks do not divide were found only after the model
    load: refused with the other argument checks now."""
    run = _run_module()
    base = ["--traces", str(tmp_path / "none"), "--out", str(tmp_path / "out"), "--policies", "tova"]
    for setting, extra, match in (("16:16", [], "--setting 16:16: interval \\(16\\) must be smaller"),
                                  ("0:4", [], "--setting 0:4: budget must be a positive integer"),
                                  ("64:8", ["--policies", "tova,paged"], "policy 'paged': paged: block_size")):
        with pytest.raises(ForesightError, match=match):
            run.main([*base, "--setting", f"{setting}={tmp_path / 'golden'}", *extra])


def test_benchmark_refuses_missing_golden_labels_before_the_model_load(tmp_path, monkeypatch):
    """A --setting whose label directory is missing (or not a golden one) was found only after the model load."""
    run = _run_module()
    model, _ = get_model("tiny-llama")
    save_random_traces(model, tmp_path / "traces", (40,), seed=5)
    (tmp_path / "empty").mkdir()
    monkeypatch.setattr(run, "load_model", lambda *a, **k: pytest.fail("loaded the model before refusing"))
    base = ["--traces", str(tmp_path / "traces"), "--out", str(tmp_path / "out"), "--policies", "tova"]
    for golden, match in (("nothere", r"--setting 16:4: golden label path not found: .*nothere"),
                          ("empty", r"--setting 16:4: .*empty holds no golden labels")):
        with pytest.raises(ForesightError, match=match):
            run.main([*base, "--setting", f"16:4={tmp_path / golden}"])
    assert not (tmp_path / "out").exists()


def _quality_json(path: Path, model: str, records: list[dict]) -> str:
    for r in records:
        r.setdefault("tokens", 100)
        r.setdefault("ce_full", 0.5)
    path.write_text(json.dumps({"meta": {"model": model}, "summaries": [], "records": records}))
    return str(path)


def test_compare_pairs_stages_across_runs_and_refuses_what_does_not_belong(tmp_path, capsys):
    compare = _run_module("compare")
    new = _quality_json(tmp_path / "new.json", "m", [_rec("sl", {"a": 1.1, "b": 1.3, "c": 1.2})])
    old = _quality_json(tmp_path / "old.json", "m", [_rec("sl_long", {"a": 1.2, "b": 1.3, "c": 1.5})])
    r = compare.compare(f"{new}:sl", f"{old}:sl_long", 16, 4)
    assert math.isclose(r["mean"], (-0.1 + 0.0 - 0.3) / 3) and r["n_traces"] == 3
    assert r["ci_low"] <= r["mean"] <= r["ci_high"] <= 0.0
    assert compare.main([f"{new}:sl", f"{old}:sl_long", "--budget", "16", "--interval", "4"]) == 0
    assert "paired a - b -0.1333" in capsys.readouterr().out
    two = {"p#0": 1.1, "p#1": 1.3, "q#0": 1.2}  # two traces of problem p: --by-problem resamples p and q
    many = _quality_json(tmp_path / "many.json", "m", [_rec("sl", two)])
    by_problem = compare.compare(f"{many}:sl", f"{many}:sl", 16, 4, by_problem=True)
    assert by_problem["n_groups"] == 2 and by_problem["mean"] == 0.0
    assert compare.main([f"{many}:sl", f"{many}:sl", "--budget", "16", "--interval", "4", "--by-problem"]) == 0
    assert "over 3 traces of 2 problems (problems resampled)" in capsys.readouterr().out
    threads = _quality_json(tmp_path / "th.json", "m", [{**_rec("sl", {"a": 1.2, "b": 1.3, "c": 1.5}),
                                                        "ce_full": 0.5 * (1 + 1e-5)}])
    assert compare.compare(f"{new}:sl", f"{threads}:sl", 16, 4)["n_traces"] == 3  # fp32 noise of thread counts
    other_traces = _quality_json(tmp_path / "t.json", "m", [_rec("sl", {"a": 1.0, "b": 1.0, "d": 1.0})])
    other_tokens = _quality_json(tmp_path / "k.json", "m", [{**_rec("sl", {"a": 1.0, "b": 1.0, "c": 1.0}),
                                                             "ce_full": 0.7}])
    other_model = _quality_json(tmp_path / "o.json", "other", [_rec("sl", {"a": 1.0, "b": 1.0, "c": 1.0})])
    no_ratios = _quality_json(tmp_path / "r.json", "m", [{"policy": "sl", "budget": 16, "interval": 4}])
    # sinks change what a policy keeps, not the full-cache CE: the token and CE check cannot see them
    other_sinks = _quality_json(tmp_path / "s.json", "m", [{**_rec("sl", {"a": 1.0, "b": 1.0, "c": 1.0}), "sinks": 4}])
    not_quality = tmp_path / "q.json"
    not_quality.write_text(json.dumps({"meta": {}, "records": {"sl": 1}}))
    for spec, match in ((f"{other_traces}:sl", "different traces"), (f"{other_tokens}:sl", "full-cache CE"),
                        (f"{other_model}:sl", "measured on different models"), (f"{new}:grpo", "no record 'grpo' at B=16 W=4"),
                        (f"{tmp_path / 'missing.json'}:sl", "not a readable quality.json"), (new, "expected FILE:STAGE"),
                        (f"{no_ratios}:sl", "record 'sl' has no per_trace_ratio"),
                        (f"{other_sinks}:sl", r"different attention sinks \(4 vs 0\)"),
                        (f"{not_quality}:sl", "not a quality.json")):
        with pytest.raises(ForesightError, match=match):
            compare.compare(spec, f"{old}:sl_long", 16, 4)
    with pytest.raises(ForesightError, match="no record 'sl' at B=64 W=16"):
        compare.compare(f"{new}:sl", f"{old}:sl_long", 64, 16)


def test_compare_refuses_records_with_values_that_are_not_numbers_and_undecodable_files(tmp_path):
    """A record whose ce_full, loss ratio or per-trace ratios were not numbers (or per_trace_ratio null or a list),
    and a file that is not UTF-8, were tracebacks (TypeError, ValueError, UnicodeDecodeError) instead of one line."""
    compare = _run_module("compare")
    old = _quality_json(tmp_path / "old.json", "m", [_rec("sl", {"a": 1.2, "b": 1.3})])
    good = _rec("sl", {"a": 1.1, "b": 1.3})
    for i, (change, match) in enumerate((({"ce_full": "x"}, "'ce_full' must be a number"),
                                         ({"tokens": "100"}, "'tokens' must be an integer"),
                                         ({"loss_ratio": "1.1"}, "'loss_ratio' must be a number"),
                                         ({"mean_trace_ratio": True}, "'mean_trace_ratio' must be a number"),
                                         ({"per_trace_ratio": None}, "'per_trace_ratio' must be a non-empty"),
                                         ({"per_trace_ratio": [1.1, 1.3]}, "'per_trace_ratio' must be a non-empty"),
                                         ({"per_trace_ratio": {"a": "x", "b": 1.3}},
                                          "of trace 'a' must be a positive finite number"),
                                         # NaN (no scored token) and zero: "pooled nan" or a ZeroDivisionError
                                         ({"loss_ratio": float("nan")}, "'loss_ratio' must be a positive finite"),
                                         ({"ce_full": 0.0}, "'ce_full' must be a positive finite"),
                                         ({"per_trace_ratio": {"a": 1.1, "b": float("inf")}},
                                          "of trace 'b' must be a positive finite number"))):
        bad = _quality_json(tmp_path / f"bad{i}.json", "m", [{**good, **change}])
        with pytest.raises(ForesightError, match=match):
            compare.compare(f"{bad}:sl", f"{old}:sl", 16, 4)
    (tmp_path / "latin.json").write_bytes(b"\xff\xfe{}")
    with pytest.raises(ForesightError, match="latin.json: not a readable quality.json"):
        compare.compare(f"{tmp_path / 'latin.json'}:sl", f"{old}:sl", 16, 4)
    # two records of one stage at one (B, W) (files merged by hand): the first was used without a word
    two = _quality_json(tmp_path / "two.json", "m", [good, {**good, "loss_ratio": 9.0}])
    with pytest.raises(ForesightError, match="2 records 'sl' at B=16 W=4; keep one"):
        compare.compare(f"{two}:sl", f"{old}:sl", 16, 4)


def test_compare_reads_eval_fidelity_output_and_reports_gap_shares(tmp_path, capsys):
    """``eval fidelity``'s fidelity.json (model from its settings.json) pairs with a quality.json stage, and
    ``--gap`` gives each side's share of the heuristic -> golden gap of that run, checked by hand."""
    compare = _run_module("compare")
    bench = _quality_json(tmp_path / "q.json", "m", [_rec("golden", {"a": 1.0, "b": 1.1, "c": 1.0}),
                                                    _rec("tova", {"a": 1.4, "b": 1.5, "c": 1.6}),
                                                    _rec("sl", {"a": 1.2, "b": 1.3, "c": 1.3})])
    ev = tmp_path / "ev"
    ev.mkdir()
    rec = {**_rec("learned", {"a": 1.1, "b": 1.2, "c": 1.3}), "tokens": 100, "ce_full": 0.5}
    (ev / "fidelity.json").write_text(json.dumps([rec]))
    with pytest.raises(ForesightError, match="needs the settings.json written beside it"):
        compare.compare(f"{ev / 'fidelity.json'}:learned", f"{bench}:sl", 16, 4)
    (ev / "settings.json").write_text(json.dumps({"model": "m"}))
    r = compare.compare(f"{ev / 'fidelity.json'}:learned", f"{bench}:sl", 16, 4, gap=f"{bench}:tova")
    assert math.isclose(r["mean"], (-0.1 - 0.1 + 0.0) / 3)
    # per-trace means: golden 1.0333, tova 1.5, learned 1.2, sl 1.2667 -> shares 0.3/0.4667 and 0.2333/0.4667
    assert math.isclose(r["a_gap_closed"]["share"], 0.3 / (1.5 - 3.1 / 3))
    assert math.isclose(r["b_gap_closed"]["pooled"], (1.5 - 3.8 / 3) / (1.5 - 3.1 / 3))
    assert r["a_gap_closed"]["ci_low"] <= r["a_gap_closed"]["share"] <= r["a_gap_closed"]["ci_high"]
    assert compare.main([f"{ev / 'fidelity.json'}:learned", f"{bench}:sl", "--budget", "16", "--interval", "4",
                         "--gap", f"{bench}:tova"]) == 0
    assert "a closes 64.3% of the" in capsys.readouterr().out
    (ev / "settings.json").write_text(json.dumps({"model": "other"}))
    with pytest.raises(ForesightError, match="measured on different models"):
        compare.compare(f"{ev / 'fidelity.json'}:learned", f"{bench}:sl", 16, 4)
    (ev / "settings.json").write_text(json.dumps({"model": "m"}))
    other = _quality_json(tmp_path / "o.json", "m", [_rec("golden", {"a": 1.0, "b": 1.1, "d": 1.0}),
                                                    _rec("tova", {"a": 1.4, "b": 1.5, "d": 1.6})])
    with pytest.raises(ForesightError, match="different traces"):
        compare.compare(f"{ev / 'fidelity.json'}:learned", f"{bench}:sl", 16, 4, gap=f"{other}:tova")
    with pytest.raises(ForesightError, match=r"no record 'h2o' at B=16 W=4 \(has golden, sl, tova\)$"):
        compare.compare(f"{ev / 'fidelity.json'}:learned", f"{bench}:sl", 16, 4, gap=f"{bench}:h2o")
    with pytest.raises(ForesightError, match="name the heuristic"):  # a zero gap: every share would be nan
        compare.compare(f"{ev / 'fidelity.json'}:learned", f"{bench}:sl", 16, 4, gap=f"{bench}:golden")



def test_compare_by_problem_resamples_problems_for_the_gap_share_too(tmp_path):
    """--by-problem resampled problems for the paired interval only; the gap share's interval beside it still
    resampled traces (a narrower interval printed under "problems resampled")."""
    compare = _run_module("compare")
    rng = np.random.default_rng(2)
    ids = [f"p{p}#{k}" for p in range(4) for k in range(4 if p < 2 else 1)]
    golden = {t: 1.0 + 0.02 * rng.random() for t in ids}
    tova = {t: 1.3 + 0.1 * rng.random() for t in ids}
    sl = {t: 1.1 + 0.1 * (t[:2] in ("p0", "p1")) + 0.05 * rng.random() for t in ids}
    bench = _quality_json(tmp_path / "q.json", "m", [_rec("golden", golden), _rec("tova", tova), _rec("sl", sl)])
    r = compare.compare(f"{bench}:sl", f"{bench}:sl", 16, 4, gap=f"{bench}:tova", by_problem=True)
    g = r["a_gap_closed"]

    def share(sel):
        w, gd, st = (sum(x[t] for t in sel) / len(sel) for x in (tova, golden, sl))
        return (w - st) / (w - gd) if w > gd else None

    assert g["n_groups"] == 4 and (g["ci_low"], g["ci_high"]) == pytest.approx(_cluster_interval(share, ids))


def test_pooled_gap_weighs_sets_by_their_full_cache_loss_and_resamples_problems_across_sets(tmp_path, capsys):
    """Two trace sets pooled: the token-weighted share by hand, the per-trace share over both sets with problems
    resampled across them (ids repeat across sets: other samples), and the refusals."""
    pooled = _run_module("pooled_gap")

    def one_set(name, traces_dir, tokens, ce_full, golden, tova, learned):
        q = tmp_path / f"{name}.json"
        recs = [{**_rec(p, r), "tokens": tokens, "ce_full": ce_full}
                for p, r in (("golden", golden), ("tova", tova), ("learned", learned))]
        q.write_text(json.dumps({"meta": {"model": "m", "traces": traces_dir}, "summaries": [], "records": recs}))
        return f"{q}:learned", f"{q}:tova"

    a = one_set("a", "runs/a", 100, 0.5, {"p0#0": 1.0, "p1#0": 1.0}, {"p0#0": 1.4, "p1#0": 1.6},
                {"p0#0": 1.1, "p1#0": 1.3})
    b = one_set("b", "runs/b", 300, 1.0, {"p0#0": 1.1, "p2#0": 1.0, "p3#0": 1.0},
                {"p0#0": 1.3, "p2#0": 1.3, "p3#0": 1.6}, {"p0#0": 1.2, "p2#0": 1.1, "p3#0": 1.4})
    r = pooled.pooled_gap([a, b], 16, 4)
    wa, wb = 100 * 0.5, 300 * 1.0  # each set's full-cache loss weighs its pooled ratios (means here)
    mean = lambda *v: sum(v) / len(v)  # noqa: E731
    pool = {k: (wa * mean(*x) + wb * mean(*y)) / (wa + wb) for k, x, y in
            (("g", (1.0, 1.0), (1.1, 1.0, 1.0)), ("t", (1.4, 1.6), (1.3, 1.3, 1.6)), ("l", (1.1, 1.3), (1.2, 1.1, 1.4)))}
    assert math.isclose(r["pooled"], (pool["t"] - pool["l"]) / (pool["t"] - pool["g"]))
    assert math.isclose(r["share"], (mean(1.4, 1.6, 1.3, 1.3, 1.6) - mean(1.1, 1.3, 1.2, 1.1, 1.4))
                        / (mean(1.4, 1.6, 1.3, 1.3, 1.6) - mean(1.0, 1.0, 1.1, 1.0, 1.0)))
    assert (r["n_traces"], r["n_groups"]) == (5, 4)  # p0 in both sets: one problem, resampled as one
    assert [s["traces"] for s in r["sets"]] == [2, 3] and math.isclose(r["sets"][0]["pooled"], (1.5 - 1.2) / 0.5)
    assert pooled.main(["--budget", "16", "--interval", "4", "--set", *a, "--set", *b]) == 0
    assert "all 5 traces (4 problems)" in capsys.readouterr().out
    with pytest.raises(ForesightError, match="were both measured on runs/a; each trace may count once"):
        pooled.pooled_gap([a, a], 16, 4)
    c = one_set("c", "runs/c", 100, 0.7, {"p9#0": 1.0}, {"p9#0": 1.5}, {"p9#0": 1.2})
    with pytest.raises(ForesightError, match="different scored tokens or full-cache CE"):
        pooled.pooled_gap([(c[0], a[1])], 16, 4)
    with pytest.raises(SystemExit) as exc:  # --set is required: argparse's one line, exit 2
        pooled.main(["--budget", "16", "--interval", "4"])
    assert exc.value.code == 2
    assert "the following arguments are required: --set" in capsys.readouterr().err


def test_by_length_splits_the_gap_share_by_trace_length(tmp_path, tiny_llama, capsys):
    from tests.conftest import save_random_traces

    by_length = _run_module("by_length")
    save_random_traces(tiny_llama[0], tmp_path / "tr", [20, 30, 60, 70], prefix="t")
    ids = ["t0#0", "t1#0", "t2#0", "t3#0"]
    # the run scored the positions >= B+W of each trace but the last: 0 + 9 + 39 + 49 at B=16 W=4
    bench = _quality_json(tmp_path / "q.json", "m", [
        {**r, "tokens": 97} for r in (_rec("golden", dict(zip(ids, (1.0, 1.0, 1.0, 1.2)))),
                                      _rec("tova", dict(zip(ids, (1.4, 1.6, 1.5, 1.5)))),
                                      _rec("sl", dict(zip(ids, (1.1, 1.1, 1.4, 1.5)))))])
    rows = by_length.by_length(str(tmp_path / "tr"), f"{bench}:tova", [f"{bench}:sl"], 16, 4, edges=(50,))
    assert [(r["from"], r["to"], r["traces"]) for r in rows] == [(0, 50, 2), (50, None, 2)]
    assert math.isclose(rows[0]["shares"][f"{bench}:sl"], (1.5 - 1.1) / 0.5)  # short traces: 80%
    assert math.isclose(rows[1]["shares"][f"{bench}:sl"], (1.5 - 1.45) / (1.5 - 1.1))  # long: 12.5%
    assert by_length.main([f"{bench}:sl", "--traces", str(tmp_path / "tr"), "--gap", f"{bench}:tova", "--budget",
                           "16", "--interval", "4", "--edges", "50"]) == 0
    assert "| ≥ 50 | 2 | 65 | 0.400 | 13% |" in capsys.readouterr().out
    # two stages named alike in files of one folder had one header: the columns could not be told apart
    other = _quality_json(tmp_path / "q2.json", "m", [{**_rec(r["policy"], r["per_trace_ratio"]), "tokens": 97}
                                                      for r in json.loads(Path(bench).read_text())["records"]])
    assert by_length.main([f"{bench}:sl", f"{other}:sl", "--traces", str(tmp_path / "tr"), "--gap", f"{bench}:tova",
                           "--budget", "16", "--interval", "4", "--edges", "50"]) == 0
    assert f"| gap | {bench}:sl | {other}:sl |" in capsys.readouterr().out
    save_random_traces(tiny_llama[0], tmp_path / "other", [20, 30], prefix="t")
    with pytest.raises(ForesightError, match="holds no trace 't2#0'"):
        by_length.by_length(str(tmp_path / "other"), f"{bench}:tova", [f"{bench}:sl"], 16, 4)
    # the same ids, other lengths (e.g. regenerated traces): they would be bucketed by lengths the run never measured
    save_random_traces(tiny_llama[0], tmp_path / "regenerated", [20, 30, 60, 80], prefix="t")
    with pytest.raises(ForesightError, match="regenerated: its traces give 107 scored tokens at B=16 W=4, the run "
                                             "scored 97"):
        by_length.by_length(str(tmp_path / "regenerated"), f"{bench}:tova", [f"{bench}:sl"], 16, 4, edges=(50,))
    with pytest.raises(ForesightError, match="increasing positive"):
        by_length.by_length(str(tmp_path / "tr"), f"{bench}:tova", [f"{bench}:sl"], 16, 4, edges=(50, 20))
    with pytest.raises(ForesightError, match="expected comma-separated integers"):
        by_length.main([f"{bench}:sl", "--traces", "x", "--gap", f"{bench}:tova", "--budget", "16", "--interval",
                        "4", "--edges", "a,b"])


def test_card_picks_one_scorers_records_and_refuses_two_scorers(tmp_path, capsys):
    card = _run_module("card")
    summary = [{"budget": 16, "interval": 4, "best_heuristic": "tova"}]

    def run(name: str, stage: str, sha: str, args: dict | None = None) -> str:
        recs = [_rec("golden", {"a": 1.0, "b": 1.1}), _rec(stage, {"a": 1.2, "b": 1.3}),
                _rec("tova", {"a": 1.5, "b": 1.6}), _rec("h2o", {"a": 1.7, "b": 1.8})]
        for r in recs:
            r.update(tokens=100, ce_full=0.5)
        recs[1]["policy_config"] = {"selection": "topk", "temperature": 1.0, **(args or {})}  # as the policy resolved it
        meta = {"model": "m", "scorer_sha256": {f"{stage}@B16W4": sha}, "policy_args": {stage: args or {}}}
        path = tmp_path / name
        path.write_text(json.dumps({"meta": meta, "summaries": summary, "records": recs}))
        return str(path)

    topk, sample = run("t.json", "sl", "aa"), run("s.json", "sl_sample", "aa", {"selection": "sample",
                                                                               "temperature": 0.003})
    out = tmp_path / "card.json"
    assert card.main(["--topk", f"{topk}:sl", "--sample", f"{sample}:sl_sample", "--budget", "16", "--interval", "4",
                      "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    assert [r["policy"] for r in got] == ["golden", "learned (this scorer, top-k)", "tova",
                                          "learned (this scorer, selection=sample T=0.003)"]
    assert [r.get("stage") for r in got] == [None, "sl", None, "sl_sample"] and got[3]["source"] == sample
    assert [r.get("scorer_sha256") for r in got] == [None, "aa", None, "aa"]  # what `foresight export` checks
    renamed = json.loads(Path(sample).read_text())  # the same scorer, other traces: used to be accepted
    renamed["records"][1]["per_trace_ratio"] = {"a": 1.2, "c": 1.3}
    (tmp_path / "r.json").write_text(json.dumps(renamed))
    with pytest.raises(ForesightError, match="measured on different traces"):
        card.card_records(f"{topk}:sl", f"{tmp_path / 'r.json'}:sl_sample", 16, 4)
    other = run("o.json", "sl_sample", "bb", {"selection": "sample"})
    with pytest.raises(ForesightError, match="not recorded as the same scorer"):
        card.card_records(f"{topk}:sl", f"{other}:sl_sample", 16, 4)
    not_sampled = run("n.json", "sl_sample", "aa")
    with pytest.raises(ForesightError, match="measured with selection=topk, not sample"):
        card.card_records(f"{topk}:sl", f"{not_sampled}:sl_sample", 16, 4)
    with pytest.raises(ForesightError, match="measured with selection=sample, not topk"):
        card.card_records(f"{sample}:sl_sample", f"{sample}:sl_sample", 16, 4)
    # a stage transferred to another (B, W) was quoted as "this scorer"
    for args, what in (({"any_budget": True}, "any_budget=True"),):
        tuned = run(f"{what}.json", "sl", "aa", args)
        with pytest.raises(ForesightError, match=f"sl: measured with {what}; the card quotes"):
            card.card_records(f"{tuned}:sl", f"{sample}:sl_sample", 16, 4)
    assert len(card.card_records(f"{run('z.json', 'sl', 'aa', {'newcomer_bonus': 0.0})}:sl", f"{sample}:sl_sample",
                                 16, 4)) == 4
    # a top-k stage's spread and newcomer bonus are quoted with it (`foresight export` checks them against the
    # scorer's top-k defaults); a sampled stage with a bonus is not the sampled default
    topk_args = {"spread": 0.005, "newcomer_bonus": 0.02, "age_prior": 0.01}
    both = card.card_records(f"{run('sp.json', 'sl', 'aa', topk_args)}:sl", f"{sample}:sl_sample", 16, 4)
    assert both[1]["policy"] == "learned (this scorer, top-k, spread 0.005, newcomer bonus 0.02, age prior 0.01)"
    for name in ("newcomer_bonus", "age_prior"):
        bonus_sampled = run(f"bs_{name}.json", "sl_sample", "aa", {"selection": "sample", "temperature": 0.003,
                                                                  name: 0.02})
        with pytest.raises(ForesightError, match=f"sl_sample: measured with {name}=0.02; the card quotes"):
            card.card_records(f"{topk}:sl", f"{bonus_sampled}:sl_sample", 16, 4)
    with pytest.raises(ForesightError, match="cannot write"):
        card.main(["--topk", f"{topk}:sl", "--sample", f"{sample}:sl_sample", "--budget", "16", "--interval", "4",
                   "--out", str(tmp_path / "missing" / "card.json")])


def test_card_and_summarise_refuse_a_bad_policy_config_and_undecodable_files_in_one_line(tmp_path):
    """A sampled stage whose policy_config temperature was not a number (or whose policy_config was not an object),
    and a --reference or summarise file that is not UTF-8, were tracebacks (ValueError, TypeError,
    UnicodeDecodeError)."""
    card, summarise = _run_module("card"), _run_module("summarise")
    for i, (cfg, match) in enumerate(((["selection", "temperature"], "no policy_config with selection"),
                                      ({"selection": "sample", "temperature": "hot"}, "temperature must be a number"),
                                      ({"selection": "sample", "temperature": None}, "temperature must be a number"))):
        recs = [{**_rec("sl", {"a": 1.2, "b": 1.3}), "tokens": 100, "ce_full": 0.5, "policy_config": cfg}]
        with pytest.raises(ForesightError, match=match):
            card._selection(recs[0], f"s{i}.json:sl")
    (tmp_path / "latin.json").write_bytes(b"\xff\xfe{}")
    with pytest.raises(ForesightError, match="latin.json: not a readable quality.json"):
        card._golden_and_best(str(tmp_path / "latin.json"), 16, 4)
    with pytest.raises(ForesightError, match="latin.json: not a readable quality.json"):
        summarise.main([str(tmp_path / "latin.json")])


def test_card_takes_golden_and_best_from_a_reference_run_for_eval_fidelity_stages(tmp_path, capsys):
    card = _run_module("card")
    ratios = {"a": 1.2, "b": 1.3}

    def ev(name: str, selection: str, settings: dict) -> str:  # a `foresight eval fidelity` run of one scorer
        d = tmp_path / name
        d.mkdir()
        rec = {**_rec("learned", ratios), "tokens": 100, "ce_full": 0.5,
               "policy_config": {"selection": selection, "temperature": 0.003 if selection == "sample" else 1.0}}
        (d / "fidelity.json").write_text(json.dumps([rec]))
        (d / "settings.json").write_text(json.dumps({"model": "m", **settings}))
        return f"{d / 'fidelity.json'}:learned"

    def ref(name: str, tokens: int = 100, trace_ids=("a", "b")) -> str:  # a quality benchmark on the same traces
        recs = [_rec("golden", dict(zip(trace_ids, (1.0, 1.1)))), _rec("h2o", dict(zip(trace_ids, (1.7, 1.8)))),
                _rec("tova", dict(zip(trace_ids, (1.5, 1.6))))]
        for r in recs:
            r.update(tokens=tokens, ce_full=0.5)
        path = tmp_path / name
        path.write_text(json.dumps({"meta": {"model": "m"}, "records": recs,
                                    "summaries": [{"budget": 16, "interval": 4, "best_heuristic": "tova"}]}))
        return str(path)

    topk, sample = ev("t", "topk", {"scorer_sha256": "aa"}), ev("s", "sample", {"scorer_sha256": "aa"})
    with pytest.raises(ForesightError, match="no quality summary with a best heuristic.*--reference"):
        card.card_records(topk, sample, 16, 4)
    out = tmp_path / "card.json"
    assert card.main(["--topk", topk, "--sample", sample, "--reference", ref("q.json"), "--budget", "16",
                      "--interval", "4", "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    assert [r["policy"] for r in got] == ["golden", "learned (this scorer, top-k)", "tova",
                                          "learned (this scorer, selection=sample T=0.003)"]
    assert [r["loss_ratio"] for r in got] == [1.05, 1.25, 1.55, 1.25]
    assert got[1]["source"] == topk.rpartition(":")[0] and got[3]["stage"] == "learned"
    with pytest.raises(ForesightError, match="different scored tokens"):
        card.card_records(topk, sample, 16, 4, reference=ref("q2.json", tokens=90))
    with pytest.raises(ForesightError, match="different traces"):
        card.card_records(topk, sample, 16, 4, reference=ref("q3.json", trace_ids=("a", "c")))
    with pytest.raises(ForesightError, match=r"not recorded as the same scorer \(aa vs bb\)"):
        card.card_records(topk, ev("s2", "sample", {"scorer_sha256": "bb"}), 16, 4, reference=ref("q.json"))
    # runs older than the SHA-256 record: the same scorer directory at least
    old_t, old_s = ev("ot", "topk", {"scorer": "runs/x/scorer"}), ev("os", "sample", {"scorer": "runs/x/scorer"})
    assert len(card.card_records(old_t, old_s, 16, 4, reference=ref("q.json"))) == 4
    with pytest.raises(ForesightError, match="not recorded as the same scorer"):
        card.card_records(old_t, ev("os2", "sample", {"scorer": "runs/y/scorer"}), 16, 4, reference=ref("q.json"))


def test_scaling_and_by_length_refuse_runs_that_do_not_make_one_curve_or_table(tmp_path):
    """Two runs with as many held-out traces but different ones (or another model) made one curve silently; a missing
    or damaged file was a traceback."""
    scaling = _run_module("scaling")

    def run(name, n, ids=("a", "b"), model="m", ce_full=0.5, ratio=1.1):
        recs = [_rec("golden", dict.fromkeys(ids, 1.0)), _rec("h2o", dict.fromkeys(ids, 1.2)),
                _rec(f"sl_{n}", dict.fromkeys(ids, ratio))]
        for r in recs:
            r.update(tokens=100, ce_full=ce_full)
        (tmp_path / name).write_text(json.dumps({"meta": {"model": model}, "records": recs,
                                                 "summaries": [quality_summary(recs, [f"sl_{n}"])]}))
        return str(tmp_path / name)

    out = ["--out", str(tmp_path / "s.png")]
    assert scaling.main([run("a.json", 10), run("b.json", 30), *out]) == 0
    for other, match in ((run("c.json", 30, ids=("a", "c")), "different traces"),
                         (run("d.json", 30, model="m2"), "measured on different models"),
                         (run("e.json", 30, ce_full=0.7), "full-cache CE"),
                         (str(tmp_path / "missing.json"), "missing.json"),
                         (str(tmp_path), "is a directory")):
        with pytest.raises(ForesightError, match=match):
            scaling.main([str(tmp_path / "a.json"), other, *out])
    (tmp_path / "f.json").write_text(json.dumps({"summaries": [{"budget": 16}], "records": []}))
    with pytest.raises(ForesightError, match="f.json: not a quality.json summary"):
        scaling.main([str(tmp_path / "f.json"), *out])
    # two runs of one N used to be plotted as one curve through both ("N=10: 1.1000, N=10: 1.1500"); the same run
    # given twice counts once
    assert scaling.main([str(tmp_path / "a.json"), str(tmp_path / "a.json"), *out]) == 0
    with pytest.raises(ForesightError, match="stage sl_10: two different results"):
        scaling.main([str(tmp_path / "a.json"), run("g.json", 10, ratio=1.15), *out])
    by_length = _run_module("by_length")  # a repeated stage gave more header columns than values
    with pytest.raises(ForesightError, match="a.json:sl_10: given twice"):
        by_length.main([f"{tmp_path / 'a.json'}:sl_10", f"{tmp_path / 'a.json'}:sl_10", "--traces", "t", "--gap",
                        f"{tmp_path / 'a.json'}:h2o", "--budget", "16", "--interval", "4"])


def test_scaling_refuses_non_numeric_summary_ratios_and_a_directory_out(tmp_path):
    """A summary ratio that was a string was plotted as a category (golden's line, exit 0) or a traceback when
    printed; --out naming a directory (or with no suffix) wrote DIR.png and said it wrote DIR; --out under a file
    was a traceback."""
    scaling = _run_module("scaling")
    recs = [_rec("golden", {"a": 1.0, "b": 1.1}), _rec("h2o", {"a": 1.2, "b": 1.3}),
            _rec("sl_10", {"a": 1.1, "b": 1.2})]
    for r in recs:
        r.update(tokens=100, ce_full=0.5)
    summary = quality_summary(recs, ["sl_10"])
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"meta": {"model": "m"}, "records": recs, "summaries": [summary]}))
    bad_golden = json.loads(json.dumps(summary))
    bad_golden["policies"]["golden"]["loss_ratio"] = "x"
    bad_stage = json.loads(json.dumps(summary))
    bad_stage["stages"][0]["loss_ratio"] = "x"
    for name, s, match in (("g.json", bad_golden, "loss ratio of golden must be a number"),
                           ("s.json", bad_stage, "loss ratio of sl_10 must be a number")):
        (tmp_path / name).write_text(json.dumps({"meta": {"model": "m"}, "records": recs, "summaries": [s]}))
        with pytest.raises(ForesightError, match=match):
            scaling.main([str(tmp_path / name), "--out", str(tmp_path / "p.png")])
    with pytest.raises(ForesightError, match="is a directory"):
        scaling.main([str(good), "--out", str(tmp_path)])
    assert not (tmp_path.parent / f"{tmp_path.name}.png").exists()
    with pytest.raises(ForesightError, match="cannot write the plot"):
        scaling.main([str(good), "--out", str(good / "p.png")])
    with pytest.raises(ForesightError, match="name the plot with its format's suffix"):  # wrote p.png, said p
        scaling.main([str(good), "--out", str(tmp_path / "p")])
    assert not (tmp_path / "p.png").exists()


def test_card_and_summarise_refuse_malformed_quality_json_in_one_line(tmp_path):
    """A reference run without 'records' (or with records that are not objects) and a quality.json whose records
    lack the keys a summary reads were tracebacks (KeyError, AttributeError)."""
    card, summarise = _run_module("card"), _run_module("summarise")
    summary = {"budget": 16, "interval": 4, "best_heuristic": "h2o"}
    for name, data in (("no_records.json", {"meta": {"model": "m"}, "summaries": [summary]}),
                       ("int_records.json", {"meta": {"model": "m"}, "summaries": [summary], "records": [3]})):
        (tmp_path / name).write_text(json.dumps(data))
        with pytest.raises(ForesightError, match=name):
            card._golden_and_best(str(tmp_path / name), 16, 4)
    for records, match in (([3], "record 0 has no policy"),
                           ([{"policy": "sl", "budget": 16, "interval": 4}], "record 0 has no traces")):
        (tmp_path / "q.json").write_text(json.dumps({"summaries": [{**summary, "stages": [{"stage": "sl"}]}],
                                                     "records": records}))
        with pytest.raises(ForesightError, match=match):
            summarise.main([str(tmp_path / "q.json")])


def test_summarise_refuses_non_numeric_records_stages_without_names_and_no_summaries(tmp_path):
    """Records whose ratios were not numbers and a summary stage without its 'stage' name were tracebacks
    (ValueError, TypeError); a quality.json with no summaries printed nothing and exited 0; a stage with no record
    did not name the file."""
    summarise = _run_module("summarise")
    good = [_rec("golden", {"a": 1.0, "b": 1.1}), _rec("sl", {"a": 1.2, "b": 1.3}), _rec("h2o", {"a": 1.5, "b": 1.6})]
    summary = {"budget": 16, "interval": 4, "stages": [{"stage": "sl"}]}
    for i, (records, summaries, match) in enumerate((
            ([good[0], {**good[1], "per_trace_ratio": {"a": "x", "b": 1.3}}, good[2]], [summary],
             r"record 1 \('sl'\): 'per_trace_ratio' of trace 'a' must be a positive finite number"),
            ([good[0], {**good[1], "per_trace_ratio": None}, good[2]], [summary],
             "'per_trace_ratio' must be a non-empty"),
            ([*good[:2], {**good[2], "loss_ratio": "x"}], [summary], "'loss_ratio' must be a number"),
            (good, [{**summary, "stages": [{}]}], "each with its 'stage' name"),
            (good, [], "no summaries to recompute"),
            (good, [{**summary, "stages": [{"stage": "grpo"}]}], r"q5.json: B=16 W=4: .*no fidelity record for grpo"))):
        (tmp_path / f"q{i}.json").write_text(json.dumps({"summaries": summaries, "records": records}))
        with pytest.raises(ForesightError, match=match):
            summarise.main([str(tmp_path / f"q{i}.json")])


def test_summarise_recomputes_old_summaries_from_unchanged_records(tmp_path, capsys):
    summarise = _run_module("summarise")
    recs = [_rec("golden", {"a": 1.0, "b": 1.0}), _rec("h2o", {"a": 1.2, "b": 1.4}), _rec("sl", {"a": 1.1, "b": 1.3})]
    old = quality_summary(recs, ["sl"])
    del old["stages"][0]["gap_closed_per_trace"]  # as written before the interval existed
    path = tmp_path / "quality.json"
    path.write_text(json.dumps({"meta": {"model": "m"}, "summaries": [old], "records": recs}, indent=1))
    assert summarise.main([str(path), "--write"]) == 0
    new = json.loads(path.read_text())
    assert new["records"] == recs and new["meta"] == {"model": "m"}
    assert math.isclose(new["summaries"][0]["stages"][0]["gap_closed_per_trace"]["share"], 1 / 3)
    assert "33.3% [" in (tmp_path / "quality.md").read_text()
    path.write_text(json.dumps({"meta": {}, "records": recs}))
    with pytest.raises(ForesightError, match="not a quality.json"):
        summarise.main([str(path)])


def test_quality_summary_refuses_a_heuristic_measured_on_other_traces():
    """A heuristic that is not the best one, measured on other traces (a hand-merged file), was put in the table
    beside the others without a word; only the best heuristic and the learned stages were checked."""
    recs = [_rec("golden", {"a": 1.0, "b": 1.0}), _rec("h2o", {"a": 1.2, "b": 1.4}), _rec("sl", {"a": 1.1, "b": 1.3})]
    assert quality_summary([*recs, _rec("tova", {"a": 1.5, "b": 1.6})], ["sl"])["best_heuristic"] == "h2o"
    with pytest.raises(ForesightError, match="golden and tova were measured on different traces"):
        quality_summary([*recs, _rec("tova", {"a": 1.5, "c": 1.6})], ["sl"])


def test_a_negative_bootstrap_seed_is_refused_before_the_work(tmp_path, capsys):
    """numpy's generators refuse a negative seed: compare.py was a traceback, and adapt_eval.py / run.py reached it
    only after every replay. Every bootstrap --seed is parsed as an integer >= 0 (one line, exit 2)."""
    compare = _run_module("compare")
    a = _quality_json(tmp_path / "a.json", "m", [_rec("sl", {"a": 1.2, "b": 1.3})])
    args = [f"{a}:sl", f"{a}:sl", "--budget", "16", "--interval", "4"]
    assert compare.main([*args, "--seed", "3"]) == 0
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        compare.main([*args, "--seed", "-1"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and "--seed: must be an integer >= 0, got -1" in err, err
    for script in ("quality/run.py", "quality/summarise.py", "adapt_compare.py", "adapt_eval.py", "adapt_runs.py"):
        source = (Path(__file__).resolve().parents[2] / "benchmarks" / script).read_text()
        assert '"--seed", type=nonnegative_int' in source, script
