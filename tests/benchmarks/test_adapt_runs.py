"""benchmarks/adapt_runs.py: two adaptation runs compared window by window on the same data order."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import load_script

ar = load_script("adapt_runs.py")

CONFIG = {"model": "tiny-llama", "dtype": None, "traces": "runs/traces", "seed": 0, "split_seed": 0, "heldout": 2,
          "max_traces": 0, "micro_batch": 1, "policy": "learned", "policy_kwargs": {}, "scorer": "s", "budget": 8,
          "interval": 4, "sinks": 0, "steps": 30, "lr": 1e-3, "ce_weight": 0.0}


def _records(values, ce_full=None, positions=None, metric="loss"):
    ce_full = ce_full or [0.5 + 0.1 * i for i in range(len(values))]
    positions = positions or [100 + i for i in range(len(values))]
    return [{"step": 10 * (i + 1), "kind": "train", metric: v, "kl": v, "ce_full": c, "positions": p}
            for i, (v, c, p) in enumerate(zip(values, ce_full, positions))]


def _run(root: Path, values, *, extra=None, config=None, as_checkpoint=False, **kw) -> Path:
    """A run directory: metrics.jsonl plus either an adapter record or a checkpoint manifest."""
    root.mkdir(parents=True)
    recs = _records(values, **kw) + [{"step": 30, "kind": "eval", "heldout_kl_to_base": 0.1}] + (extra or [])
    (root / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    cfg = {**CONFIG, **(config or {})}
    if as_checkpoint:
        step = root / "checkpoints" / "step_000030"
        step.mkdir(parents=True)
        settings = {**cfg, "world_size": 2, "anchor_weight": 0.0, "traces": "digest-t", "scorer": "digest-s"}
        (step / "checkpoint.json").write_text(json.dumps({"format": "foresight-checkpoint/1", "step": 30,
                                                          "settings": settings}))
    else:
        (root / "adapter").mkdir()
        meta = {"format": "foresight-adapter/1", "scorer_sha256": "sha-s", "traces": cfg["traces"], "config": cfg}
        (root / "adapter" / "foresight_adapter.json").write_text(json.dumps(meta))
    return root


def _fails(argv, capsys, match):
    with pytest.raises(SystemExit) as exc:
        ar.run_script(lambda: ar.main(argv), "adapt_runs")
    err = capsys.readouterr().err
    assert exc.value.code == 2 and match in err, err
    assert len(err.strip().splitlines()) == 1


def test_paired_windows_match_a_hand_computation_and_the_outputs_are_written(tmp_path, capsys):
    a, b = [0.10, 0.08, 0.07], [0.12, 0.09, 0.06]
    ra, rb = _run(tmp_path / "a", a), _run(tmp_path / "b", b, config={"lr": 5e-4, "steps": 60})
    res = ar.compare(ra, rb)
    d = np.array(a) - np.array(b)
    assert res["windows"] == 3 and res["steps"] == [10, 20, 30]
    assert res["diff_mean"] == pytest.approx(d.mean()) and res["a_lower"] == 2
    assert res["ratio_of_means"] == pytest.approx(sum(a) / sum(b))
    assert res["diff_ci_low"] <= d.mean() <= res["diff_ci_high"] and res["unchecked_settings"] == []
    assert ar.main([str(ra), str(rb), "--json", str(tmp_path / "r.json"), "--plot", str(tmp_path / "r.png")]) == 0
    assert "| 20 | 0.0800 | 0.0900 | -0.0100 |" in capsys.readouterr().out
    assert json.loads((tmp_path / "r.json").read_text())["diff_mean"] == pytest.approx(d.mean())
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"


def test_only_the_steps_both_runs_logged_pair_up(tmp_path):
    ra = _run(tmp_path / "a", [0.1, 0.2, 0.3])
    rb = _run(tmp_path / "b", [0.1, 0.1])  # stopped after step 20
    res = ar.compare(ra, rb)
    assert res["steps"] == [10, 20] and res["diff_mean"] == pytest.approx(0.05)


def test_loss_windows_of_other_spans_are_refused_and_kl_pairs_them(tmp_path, capsys):
    """Runs logged at another log_every were paired as if alike: B's loss at step 20 is the mean of its steps 11-20,
    A's the mean of step 20 alone (A - B +0.033 for identical training). kl is each window's last step: it pairs."""
    ra = _run(tmp_path / "a", [0.1, 0.2, 0.3])
    rb = _run(tmp_path / "b", [0.1, 0.2, 0.3])
    recs = [json.loads(line) for line in (ra / "metrics.jsonl").read_text().splitlines()]
    extra = [{**recs[0], "step": 5}, {**recs[0], "step": 15}]  # A logged every 5 steps
    (ra / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [*extra, *recs]))
    _fails([str(ra), str(rb)], capsys, "step 10: the logged loss of")
    assert ar.window_starts({10: {}, 20: {}, 25: {}}) == {10: 1, 20: 11, 25: 21}
    assert ar.window_starts({10: {}, 20: {"window_from": 15}}) == {10: 1, 20: 15}  # resumed at step 14
    assert ar.compare(ra, rb, metric="kl")["steps"] == [10, 20, 30]


def test_checkpoint_settings_are_read_and_mixed_sources_say_what_they_could_not_check(tmp_path, capsys):
    ra = _run(tmp_path / "a", [0.1, 0.2], as_checkpoint=True)
    rb = _run(tmp_path / "b", [0.1, 0.3])
    assert ar.compare(ra, rb)["unchecked_settings"] == ["traces", "scorer", "world_size"]
    assert ar.main([str(ra), str(rb)]) == 0
    assert "not checked" in capsys.readouterr().out
    rc = _run(tmp_path / "c", [0.1, 0.3], as_checkpoint=True, config={"budget": 16})
    _fails([str(ra), str(rc)], capsys, "setting 'budget' differs")


@pytest.mark.parametrize("key,value", [("seed", 1), ("micro_batch", 2), ("scorer", "other"), ("interval", 8)])
def test_runs_on_another_data_order_or_eviction_are_refused(tmp_path, capsys, key, value):
    ra = _run(tmp_path / "a", [0.1, 0.2])
    rb = _run(tmp_path / "b", [0.1, 0.2], config={key: value})
    if key == "scorer":  # an adapter record names the scorer by the SHA-256 of its weights
        meta_path = rb / "adapter" / "foresight_adapter.json"
        meta = json.loads(meta_path.read_text())
        meta_path.write_text(json.dumps({**meta, "scorer_sha256": "sha-other"}))
    _fails([str(ra), str(rb)], capsys, f"setting {key!r} differs")


def test_loss_needs_the_same_objective_and_kl_does_not(tmp_path, capsys):
    ra = _run(tmp_path / "a", [0.1, 0.2])
    rb = _run(tmp_path / "b", [0.1, 0.2], config={"anchor_weight": 1.0})
    _fails([str(ra), str(rb)], capsys, "setting 'anchor_weight' differs")
    assert ar.compare(ra, rb, metric="kl")["windows"] == 2
    # a run from before the anchor term (no anchor_weight recorded) counts as weight 0
    rc = _run(tmp_path / "c", [0.1, 0.2], config={"anchor_weight": 0.0})
    assert ar.compare(ra, rc)["windows"] == 2


def test_windows_that_saw_other_traces_are_refused(tmp_path, capsys):
    ra = _run(tmp_path / "a", [0.1, 0.2, 0.3])
    rb = _run(tmp_path / "b", [0.1, 0.2, 0.3], ce_full=[0.5, 0.6, 0.75])
    _fails([str(ra), str(rb)], capsys, "step 30: teacher CE")
    rc = _run(tmp_path / "c", [0.1, 0.2, 0.3], ce_full=[0.5, 0.6 * (1 + 1e-5), 0.7])  # replay-order rounding
    assert ar.compare(ra, rc)["windows"] == 3
    rd = _run(tmp_path / "d", [0.1, 0.2, 0.3], positions=[100, 99, 102])
    _fails([str(ra), str(rd)], capsys, "step 20: 101 scored positions")


def test_a_window_without_a_finite_value_is_refused_not_averaged(tmp_path, capsys):
    """A window whose steps were all skipped logs loss NaN; it must not turn the paired mean into NaN silently."""
    ra = _run(tmp_path / "a", [0.1, float("nan"), 0.3])
    rb = _run(tmp_path / "b", [0.1, 0.2, 0.3])
    _fails([str(ra), str(rb)], capsys, "step 20 has no finite 'loss'")
    rc = _run(tmp_path / "c", [0.1, 0.2, 0.3], ce_full=[0.5, None, 0.7])
    _fails([str(rb), str(rc)], capsys, "step 20 has no finite 'ce_full'")


def test_bad_inputs_are_one_line_and_exit_2_before_anything_is_written(tmp_path, capsys):
    ra = _run(tmp_path / "a", [0.1, 0.2])
    rb = _run(tmp_path / "b", [0.1])
    _fails([str(ra), str(rb)], capsys, "share 1 logged training step")
    _fails([str(ra), str(ra), "--metric", "accuracy"], capsys, "--metric 'accuracy'")
    _fails([str(ra), str(ra), "--plot", str(tmp_path / "nowhere" / "p.png")], capsys, "does not exist")
    # an unknown suffix was a traceback after the JSON was written; none wrote p.png instead of the file named
    for name in ("p.txt", "p"):
        _fails([str(ra), str(ra), "--plot", str(tmp_path / name), "--json", str(tmp_path / "r.json")], capsys,
               "name the image with a suffix matplotlib writes")
        assert not (tmp_path / "r.json").exists() and not (tmp_path / "p.png").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "metrics.jsonl").write_text("")
    _fails([str(ra), str(empty)], capsys, "neither a checkpoint nor foresight_adapter.json")
    _fails([str(ra), str(tmp_path / "missing")], capsys, "neither a checkpoint")
    _fails([str(ra), str(ra), "--json", str(tmp_path)], capsys, "is a directory")
    (rb / "metrics.jsonl").write_text('{"kind": "train", "loss": 0.1}\n')
    _fails([str(ra), str(rb)], capsys, "line 1 is not a metrics record")
    (rb / "metrics.jsonl").write_text("{not json\n")
    _fails([str(ra), str(rb)], capsys, "not readable")
    (rb / "adapter" / "foresight_adapter.json").write_text("{not json")
    _fails([str(ra), str(rb)], capsys, "is not valid JSON")
    (rb / "adapter" / "foresight_adapter.json").write_text("{}")
    _fails([str(ra), str(rb)], capsys, "no training config")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b", "empty"]


def test_a_damaged_checkpoint_manifest_is_named_by_adapt_runs_not_by_resume(tmp_path, capsys):
    ra = _run(tmp_path / "a", [0.1, 0.2], as_checkpoint=True)
    rb = _run(tmp_path / "b", [0.1, 0.3])
    manifest = ra / "checkpoints" / "step_000030" / "checkpoint.json"
    manifest.write_text("{not json")
    said = f"adapt_runs: error: run settings: {manifest} is not a"
    _fails([str(ra), str(rb)], capsys, f"{said} readable checkpoint manifest")
    manifest.write_text(json.dumps({"format": "other"}))
    _fails([str(ra), str(rb)], capsys, f"{said} foresight-checkpoint/1 manifest")
