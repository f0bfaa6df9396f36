"""benchmarks/adapt_compare.py: two adapters' held-out measurements paired per trace, against a hand computation;
measurements of other traces, eviction or model refused in one line with exit 2, before anything is written."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import load_script

IDS = [f"p{i}#0" for i in range(6)]
BASE = [1.30, 1.10, 1.25, 1.05, 1.40, 1.20]


def _mod():
    return load_script("adapt_compare.py")


def _record(ratios, ce_full, loss_ratio):
    return {"policy": "learned", "budget": 8, "interval": 2, "loss_ratio": loss_ratio, "ce_full": ce_full,
            "tokens": 600, "per_trace_ratio": dict(zip(IDS, ratios))}


def _eval(path: Path, adapted, ce_full_adapted, loss_ratio_adapted, **meta_extra) -> Path:
    meta = {"model": "tiny-llama", "budget": 8, "interval": 2, "sinks": 0, "num_traces": len(IDS),
            "policies": ["learned"], "policy_kwargs": {"learned": {}}, "scorer": "s", "scorer_sha256": "aaaa",
            **meta_extra}
    data = {"meta": meta, "base": [_record(BASE, 2.0, 1.2)],
            "adapted": [_record(adapted, ce_full_adapted, loss_ratio_adapted)]}
    path.write_text(json.dumps(data))
    return path


@pytest.fixture
def evals(tmp_path):
    a = _eval(tmp_path / "a.json", [1.10, 1.05, 1.12, 1.00, 1.20, 1.08], 2.02, 1.09)
    b = _eval(tmp_path / "b.json", [1.15, 1.04, 1.18, 1.02, 1.25, 1.10], 2.01, 1.12)
    return a, b


def test_paired_difference_and_summaries_match_a_hand_computation(evals, tmp_path, capsys):
    a, b = evals
    mod = _mod()
    assert mod.main([str(a), str(b), "--json", str(tmp_path / "r.json"), "--md", str(tmp_path / "r.md")]) == 0
    res = json.loads((tmp_path / "r.json").read_text())
    ra = json.loads(a.read_text())["adapted"][0]["per_trace_ratio"]
    rb = json.loads(b.read_text())["adapted"][0]["per_trace_ratio"]
    d = np.array([ra[t] - rb[t] for t in IDS])
    assert res["paired"]["mean"] == pytest.approx(d.mean(), abs=1e-12)
    assert res["paired"]["ci_low"] <= d.mean() <= res["paired"]["ci_high"] and res["paired"]["n_traces"] == 6
    assert res["a_lower"] == int((d < 0).sum()) == 5
    sa = res["a_summary"]
    assert sa["gap_removed"] == pytest.approx(1 - 0.09 / 0.2)  # 1.2 -> 1.09 removes 55% of the gap
    assert sa["full_ce_ratio"] == pytest.approx(1.01)
    assert sa["vs_base_full_cache"] == pytest.approx(1.09 * 1.01)
    assert sa["gap_removed_vs_base_full_cache"] == pytest.approx(1 - (1.09 * 1.01 - 1) / 0.2)
    assert "A lower on 5 of 6 traces" in capsys.readouterr().out
    assert (tmp_path / "r.md").read_text().startswith(f"A = {a}")
    assert res["a_adapted_scorer"] == res["b_adapted_scorer"] == "s"
    assert "different scorers" not in (tmp_path / "r.md").read_text()


def test_an_adapted_side_with_its_own_scorer_is_named(evals, tmp_path, capsys):
    """adapt_eval.py --adapted-scorer: the base sides share the scorer (checked), the adapted side's own is named."""
    a = _eval(tmp_path / "own.json", [1.10, 1.05, 1.12, 1.00, 1.20, 1.08], 2.02, 1.09, adapted_scorer="own")
    assert _mod().main([str(a), str(evals[1]), "--json", str(tmp_path / "r.json")]) == 0
    res = json.loads((tmp_path / "r.json").read_text())
    assert (res["a_adapted_scorer"], res["b_adapted_scorer"]) == ("own", "s")
    assert "A with own, B with s" in capsys.readouterr().out


def _fails(argv, capsys, match):
    mod = _mod()
    with pytest.raises(SystemExit) as exc:
        mod.run_script(lambda: mod.main(argv), "adapt_compare")
    err = capsys.readouterr().err
    assert exc.value.code == 2 and match in err and len(err.strip().splitlines()) == 1, err


def _edit(path: Path, out: Path, change) -> Path:
    data = json.loads(path.read_text())
    change(data)
    out.write_text(json.dumps(data))
    return out


@pytest.mark.parametrize("change,match", [
    (lambda d: d["meta"].update(budget=16), "different budget (8 vs 16)"),
    (lambda d: d["meta"].update(model="tiny-qwen3"), "different model"),
    (lambda d: (d["meta"].update(scorer="other"), d["meta"].pop("scorer_sha256")), "different scorer"),  # by name
    (lambda d: d["meta"].update(scorer_sha256="bbbb"), "different scorer_sha256"),  # a short name moved on
    (lambda d: d["meta"]["policy_kwargs"].update(learned={"selection": "sample"}), "different policy_kwargs.learned"),
    (lambda d: d["base"][0].update(ce_full=2.5), "different scored tokens or full-cache CE"),
    (lambda d: d["base"][0].update(loss_ratio=1.25), "base model's learned loss ratio differs"),
    (lambda d: d["adapted"][0]["per_trace_ratio"].pop(IDS[0]), "measured on different traces"),
    (lambda d: d["adapted"][0].update(policy="h2o"), "no 'learned' record"),
    (lambda d: d["base"][0].pop("tokens"), "a base record has no tokens"),
    (lambda d: d.pop("adapted"), "not an adapt_eval.py output"),
    # values that are not numbers were tracebacks (TypeError, ValueError) in the arithmetic
    (lambda d: d["adapted"][0].update(loss_ratio="x"), "adapted record 'learned': 'loss_ratio' must be a number"),
    (lambda d: d["base"][0].update(ce_full="x"), "base record 'learned': 'ce_full' must be a number"),
    (lambda d: d["adapted"][0].update(per_trace_ratio=None), "'per_trace_ratio' must be a non-empty object"),
    (lambda d: d["adapted"][0]["per_trace_ratio"].update({IDS[0]: "x"}),
     f"of trace '{IDS[0]}' must be a positive finite number"),
    # a zero full-cache CE was a ZeroDivisionError; a second record of the policy silently won as the last one
    (lambda d: d["base"][0].update(ce_full=0.0), "base record 'learned': 'ce_full' must be a positive finite"),
    (lambda d: d["adapted"].append({**d["adapted"][0], "per_trace_ratio": dict.fromkeys(IDS, 2.0)}),
     "2 adapted records 'learned'; keep one"),
])
def test_measurements_that_do_not_belong_together_are_refused(evals, tmp_path, capsys, change, match):
    a, b = evals
    bad = _edit(b, tmp_path / "bad.json", change)
    _fails([str(a), str(bad), "--json", str(tmp_path / "r.json")], capsys, match)
    assert not (tmp_path / "r.json").exists()


def test_bad_paths_are_one_line_and_exit_2_before_anything_is_written(evals, tmp_path, capsys):
    a, b = evals
    _fails([str(a), str(tmp_path / "missing.json")], capsys, "not found")
    (tmp_path / "broken.json").write_text("{not json")
    _fails([str(a), str(tmp_path / "broken.json")], capsys, "is not valid JSON")
    _fails([str(a), str(b), "--json", str(tmp_path)], capsys, "is a directory")
    _fails([str(a), str(b), "--md", str(tmp_path / "nowhere" / "r.md")], capsys, "does not exist")
    _fails([str(a), str(b), "--policy", "h2o"], capsys, "no 'h2o' record (measured: learned)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "b.json", "broken.json"]


def test_two_systems_with_other_base_scorers_pair_their_bases_too(evals, tmp_path, capsys):
    """--systems: the base sides evict with different scorers (so their loss ratios differ); the adapted and the
    base records are both paired per trace, against a hand computation; other traces are still refused."""
    other_base = [1.25, 1.12, 1.20, 1.04, 1.35, 1.19]

    def change(d):
        d["meta"].update(scorer="s2", scorer_sha256="cccc")
        d["base"][0].update(loss_ratio=1.18, per_trace_ratio=dict(zip(IDS, other_base)))

    b2 = _edit(evals[1], tmp_path / "b2.json", change)
    _fails([str(evals[0]), str(b2)], capsys, "(two systems with different scorers: --systems)")  # and points to it
    assert _mod().main([str(evals[0]), str(b2), "--systems", "--json", str(tmp_path / "r.json")]) == 0
    res = json.loads((tmp_path / "r.json").read_text())
    assert res["base_paired"]["mean"] == pytest.approx(np.mean(np.array(BASE) - np.array(other_base)), abs=1e-12)
    assert (res["a_base_scorer"], res["b_base_scorer"]) == ("s (aaaa…)", "s2 (cccc…)")
    assert res["b_summary"]["loss_ratio_base"] == 1.18
    assert "Two systems: the base models evict with A's s (aaaa…) and B's s2 (cccc…)" in capsys.readouterr().out
    bad = _edit(b2, tmp_path / "bad.json", lambda d: d["base"][0].update(ce_full=2.5))
    _fails([str(evals[0]), str(bad), "--systems"], capsys, "different scored tokens or full-cache CE")
