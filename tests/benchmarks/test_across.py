"""benchmarks/across.py: a small budget's policies against a larger budget's heuristics on the same positions."""

from __future__ import annotations

import json
import random

import pytest

from tests.conftest import load_script


def _record(policy: str, budget: int, interval: int, ce: dict, score_from: int | None = None) -> dict:
    """A fidelity record as `foresight eval fidelity` writes it: per-trace [CE sum, full CE sum, positions]."""
    pooled = sum(v[0] for v in ce.values()) / sum(v[1] for v in ce.values())
    return {"policy": policy, "budget": budget, "interval": interval, "score_from": score_from, "loss_ratio": pooled,
            "per_trace_ce": ce, "per_trace_ratio": {t: v[0] / v[1] for t, v in ce.items()}}


def _runs(tmp_path, seed: int = 0):
    rng = random.Random(seed)
    ids = [f"t{i}" for i in range(9)]
    full = {t: [rng.uniform(50, 90), rng.randint(20, 300)] for t in ids}
    def ce(scale):
        return {t: [full[t][0] * rng.uniform(1.0, scale), full[t][0], full[t][1]] for t in ids}
    small = [_record("golden", 64, 16, ce(1.1), 160), _record("learned", 64, 16, ce(1.2), 160)]
    large = [_record("h2o", 128, 32, ce(1.4)), _record("snapkv", 128, 32, ce(1.15)),
             _record("golden", 128, 32, ce(1.02))]  # golden at the larger budget is not a heuristic
    for name, recs in (("small", small), ("large", large)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "fidelity.json").write_text(json.dumps(recs))
    return small, large


def test_each_small_policy_is_paired_with_the_best_heuristic_by_hand(tmp_path, capsys):
    across = load_script("across.py")
    small, large = _runs(tmp_path)
    assert across.main([str(tmp_path / "small"), str(tmp_path / "large"), "--json", str(tmp_path / "a.json")]) == 0
    got = json.loads((tmp_path / "a.json").read_text())
    best = min(large[:2], key=lambda r: r["loss_ratio"])
    assert [g["policy"] for g in got] == ["golden", "learned"] and all(g["best"] == best["policy"] for g in got)
    for g, rec in zip(got, small):
        ids = sorted(rec["per_trace_ratio"])
        diffs = [rec["per_trace_ratio"][t] - best["per_trace_ratio"][t] for t in ids]
        assert g["diff"]["mean"] == pytest.approx(sum(diffs) / len(diffs))
        assert g["diff"]["ci_low"] <= g["diff"]["mean"] <= g["diff"]["ci_high"]
        assert g["learned"]["value"] == pytest.approx(rec["loss_ratio"])
        assert g["best_ratio"]["value"] == pytest.approx(best["loss_ratio"])
        assert g["wins"] == sum(d < 0 for d in diffs) and g["heuristics"] == 2
        assert (g["first"], g["small"], g["large"]) == (160, [64, 16], [128, 32])
    out = capsys.readouterr().out
    assert "| golden B=64/W=16 | B=128/W=32 | ≥ 160 |" in out and "| learned B=64 |" in out


@pytest.mark.parametrize("break_it, message", [
    (lambda s, l: s[1]["per_trace_ce"]["t0"].__setitem__(1, 1.0), "full-cache CE differs"),
    (lambda s, l: s[0].__setitem__("score_from", 80), "scored from position 80"),
    (lambda s, l: l.__setitem__(slice(None), [l[2]]), "no heuristic"),
    (lambda s, l: s.__setitem__(slice(None), [dict(r, score_from=160) for r in l[:2]]),
     "not below the heuristics' B=128"),  # the large run passed as the small one
])
def test_runs_that_do_not_share_traces_and_positions_are_refused(tmp_path, capsys, break_it, message):
    across = load_script("across.py")
    small, large = _runs(tmp_path)
    break_it(small, large)
    (tmp_path / "small" / "fidelity.json").write_text(json.dumps(small))
    (tmp_path / "large" / "fidelity.json").write_text(json.dumps(large))
    with pytest.raises(SystemExit) as exc:
        across.run_script(lambda: across.main([str(tmp_path / "small"), str(tmp_path / "large")]), "across")
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_a_missing_run_is_one_line(tmp_path, capsys):
    across = load_script("across.py")
    with pytest.raises(SystemExit) as exc:
        across.run_script(lambda: across.main([str(tmp_path / "nope"), str(tmp_path)]), "across")
    assert exc.value.code == 2 and "small " in capsys.readouterr().err
