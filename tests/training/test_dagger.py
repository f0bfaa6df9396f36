"""On-policy relabelling (DAgger, docs/training.md, DAgger): oracle values for any candidate, rows from the scorer's own
trajectory labelled like a brute-force oracle, dagger_rounds=0 unchanged, resume mid-DAgger."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

import foresight
from foresight import replay_schedule
from foresight.errors import ForesightError
from golden.labels import LabelMismatchError, load_labels
from tests.training.test_sl import _make_data as make_sl_data
from training.sl_config import SLConfig

B, W = 16, 4
REPO = Path(__file__).resolve().parents[2]


def _make_data(root: Path, n: int = 6) -> tuple[Path, Path]:
    return make_sl_data(root, n, seed=1, base_len=40)  # same B, W as tests/training/test_sl.py


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return _make_data(tmp_path_factory.mktemp("dagger_data"))


def _cfg(data, out: Path, **kw) -> SLConfig:
    traces, labels = data
    base = dict(model="tiny-llama", traces=str(traces), labels=str(labels), budget=B, interval=W, heldout=2,
                steps=8, micro_batch=2, warmup_steps=2, checkpoint_every=0, log_every=2, eval_every=0,
                eval_fidelity=False, out_dir=str(out), feature_cache=str(out.parent / "features"), device="cpu",
                deepspeed=str(REPO / "configs" / "deepspeed" / "zero0.json"))
    base.update(kw)
    return SLConfig.from_dict(base)


def _weights(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def _rows(out: Path, r: int, trace_id: str):
    from training.dagger import rows_file
    from training.event_files import load_events
    from training.onpolicy import ROWS_FORMAT

    return load_events(rows_file(out, r, trace_id), ROWS_FORMAT)


def naive_alpha(model, ids: list[int], budget: int, interval: int) -> tuple[torch.Tensor, list[int]]:
    """Brute force: eager full attention (L, Hkv, N keys, n_blocks) block means, then α(i, s) for every event
    block s by a max over the later blocks. Returns (E, L, Hkv, N) and the event ends."""
    t = torch.tensor([ids])
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            att = torch.stack([a[0].float() for a in model(t, output_attentions=True).attentions])  # (L, Hq, q, k)
    finally:
        model.set_attn_implementation("sdpa")
    L, hq, n, _ = att.shape
    hkv = model.config.num_key_value_heads
    att = att.view(L, hkv, hq // hkv, n, n).mean(2)
    pieces = replay_schedule(n, budget, interval)
    abar = torch.stack([att[:, :, s:e, :].mean(2) for s, e, _ in pieces], dim=-1)  # (L, Hkv, N, nb)
    out, ends = [], []
    for s, (_, end, fire) in enumerate(pieces):
        if fire:
            later = abar[..., s + 1 :]
            out.append(later.amax(-1) if later.shape[-1] else torch.zeros(abar.shape[:-1]))
            ends.append(end)
    return torch.stack(out), ends


# ---------------------------------------------------------------------------------------------------------------
# Labels: α for every position, format /3
# ---------------------------------------------------------------------------------------------------------------


def test_labels_hold_alpha_of_every_position(data, tmp_path):
    import datasets
    from safetensors import safe_open
    from safetensors.torch import save_file

    model, _ = foresight.load_model("tiny-llama", device="cpu")
    labels = load_labels(data[1])
    row = list(datasets.load_from_disk(str(data[0])))[3]
    lab = labels[row["trace_id"]]
    ref, ends = naive_alpha(model, row["input_ids"], B, W)
    assert [ev.end for ev in lab.events] == ends
    assert lab.foresight is None and lab.foresight_file  # read on first use only
    for e, ev in enumerate(lab.events):
        for layer in range(2):
            every = torch.arange(ev.end).expand(2, -1)  # every position appended so far, both KV heads
            torch.testing.assert_close(lab.alpha_at(e, layer, every), ref[e, layer, :, : ev.end], atol=2e-6,
                                       rtol=1e-5)
            assert torch.equal(lab.alpha_at(e, layer, ev.candidates[layer]), ev.alpha[layer])  # golden's own
    n = len(row["input_ids"])
    assert lab.foresight.shape == (2, 2, sum(ends)) and sum(ends) <= len(ends) * n  # O(N * N/W) per head
    lab.release_foresight()
    assert lab.foresight is None

    # a format-/2 file (no foresight values) still loads for replay and SL, and DAgger's lookup refuses it
    with safe_open(str(data[1]), framework="pt") as f:
        meta = dict(f.metadata())
        tensors = {k: f.get_tensor(k) for k in f.keys() if not k.endswith("/foresight")}
    meta["format"] = "foresight-golden-labels/2"
    save_file(tensors, str(tmp_path / "old.safetensors"), metadata=meta)
    old = load_labels(tmp_path / "old.safetensors")[row["trace_id"]]
    assert old.foresight is None and torch.equal(old.events[0].alpha, lab.events[0].alpha)
    with pytest.raises(LabelMismatchError, match="regenerate"):
        old.alpha_at(0, 0, old.events[0].candidates[0])
    from training.sl import run_sl

    cfg = _cfg((data[0], tmp_path / "old.safetensors"), tmp_path / "run", dagger_rounds=1)
    with pytest.raises(LabelMismatchError, match="regenerate"):  # before any training
        run_sl(cfg)
    assert not (tmp_path / "run" / "rounds" / "round-0" / "checkpoints").exists()


def test_config_keys_are_validated(data, tmp_path):
    assert _cfg(data, tmp_path).dagger_rounds == 0 and _cfg(data, tmp_path).dagger_beta == 0.5
    with pytest.raises(ValueError, match="dagger_rounds"):
        _cfg(data, tmp_path, dagger_rounds=-1)
    with pytest.raises(ValueError, match="dagger_beta"):
        _cfg(data, tmp_path, dagger_beta=1.5)
    for bad in (-0.1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="dagger_temperature"):
            _cfg(data, tmp_path, dagger_temperature=bad)
    # recorded only when set: the settings of runs that never set it read as they always did
    assert "dagger_temperature" not in _cfg(data, tmp_path).to_dict()
    assert _cfg(data, tmp_path, dagger_temperature=0.005).to_dict()["dagger_temperature"] == 0.005


def test_beta_one_replays_the_golden_trajectory(data):
    """π with β = 1 is the oracle acting on its own cache: the golden rows, labels and evict sets exactly."""
    import datasets

    from foresight.features import FEATURE_GROUPS, FeatureExtractor
    from training.onpolicy import collect_onpolicy_events
    from training.sl_features import collect_events

    model, _ = foresight.load_model("tiny-llama", device="cpu")
    labels = load_labels(data[1])
    rows = list(datasets.load_from_disk(str(data[0])))[:3]
    ids, seqs = [r["trace_id"] for r in rows], [r["input_ids"] for r in rows]

    def ext():
        return FeatureExtractor(window=W, feature_set=tuple(FEATURE_GROUPS))

    got = collect_onpolicy_events(model, seqs, ids, labels, None, ext, None, B, W, 1, 1.0, 0, torch.float32, 3)
    ref = collect_events(model, seqs, ids, labels, ext, B, W, torch.float32, 1)
    assert [e.trace_id for e in got] == [e.trace_id for e in ref]
    for a, b in zip(got, ref):
        assert torch.equal(a.positions, b.positions) and torch.equal(a.alpha, b.alpha)
        assert torch.equal(a.evicted, b.evicted)
        torch.testing.assert_close(a.features, b.features)


# ---------------------------------------------------------------------------------------------------------------
# One DAgger round with beta = 0: the scorer's own trajectory
# ---------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runs(data, tmp_path_factory):
    from training.sl import run_sl

    root = tmp_path_factory.mktemp("dagger_runs")
    plain = run_sl(_cfg(data, root / "plain"))
    dag = run_sl(_cfg(data, root / "dagger", dagger_rounds=1, dagger_beta=0.0))
    return root, plain, dag


def _columns(model, scorer) -> torch.Tensor:
    """The columns of ``scorer``'s feature set among every feature group (what a round's rows hold)."""
    from foresight.features import FEATURE_GROUPS, feature_columns

    return torch.tensor(feature_columns(scorer.config.feature_set, tuple(FEATURE_GROUPS), model.config.head_dim,
                                        model.config.num_attention_heads // model.config.num_key_value_heads))


def _three_traces(data, runs):
    """(model, labels, trace ids, token ids, round 0's scorer, its columns) for replays of the first three traces."""
    import datasets

    from foresight.scorer import Scorer
    from training.dagger import round_dir

    model, _ = foresight.load_model("tiny-llama", device="cpu")
    rows = list(datasets.load_from_disk(str(data[0])))[:3]
    scorer = Scorer.from_pretrained(round_dir(runs[0] / "dagger", 0) / "scorer")
    return (model, load_labels(data[1]), [r["trace_id"] for r in rows], [r["input_ids"] for r in rows], scorer,
            _columns(model, scorer))


def _learned_trajectory(model, seq, policy_kwargs: dict) -> dict:
    """``{(event, layer): (candidate positions, features of the scorer's feature set)}`` of the ``learned`` policy
    replaying ``seq`` with ``policy_kwargs``."""
    from foresight.policies import make_policy
    from foresight.runtime import replay

    seen = {}
    learned = make_policy("learned", **policy_kwargs, on_features=lambda v, f: seen.__setitem__(
        (v.event, v.layer_idx), (v.candidate_positions[0].clone(), f[0].clone())))
    replay(model, [seq], learned, B, W)
    return seen


def _with_config(scorer, **changes):
    """A copy of ``scorer`` whose config differs by ``changes`` (same weights and standardisation)."""
    from dataclasses import replace

    from foresight.scorer import Scorer

    out = Scorer(replace(scorer.config, **changes), seed=None)
    out.load_state_dict(scorer.state_dict())
    return out.eval()


#: top-k defaults large enough to change a tiny scorer's evictions (its scores spread over about one unit)
TOPK_DEFAULTS = dict(newcomer_bonus=0.3, age_prior=0.3, spread=0.3)


def test_round1_rows_come_from_the_scorers_own_trajectory(data, runs):
    import datasets

    from foresight.features import FEATURE_GROUPS
    from foresight.scorer import Scorer
    from training.dagger import round_dir
    from training.mapped_events import EventRows
    from training.packed_events import recorded_groups

    root, _, dag = runs
    out = root / "dagger"
    assert dag["finished"] and [r["round"] for r in dag["rounds"]] == [0, 1]
    model, _ = foresight.load_model("tiny-llama", device="cpu")
    labels = load_labels(data[1])
    split = json.loads((out / "split.json").read_text())
    traces = {r["trace_id"]: r["input_ids"] for r in datasets.load_from_disk(str(data[0]))}
    scorer0 = Scorer.from_pretrained(round_dir(out, 0) / "scorer")
    differs = 0
    for tid in split["train"]:
        rows = _rows(out, 1, tid)
        golden = torch.stack([ev.candidates for ev in labels[tid].events]).int()
        assert rows.positions.shape == golden.shape
        differs += int((rows.positions != golden).any(-1).sum())
        # the candidates are exactly those the learned policy's own cache holds at each event
        seen = _learned_trajectory(model, traces[tid], dict(scorer=scorer0))
        # the rows hold the scorer's feature groups only, and those are the features the learned policy scores
        assert rows.features.groups == recorded_groups(scorer0.config.feature_set) != tuple(FEATURE_GROUPS)
        feats = EventRows([rows.features], _columns(model, scorer0))[:]
        for e in range(rows.positions.shape[0]):
            for layer in range(2):
                assert torch.equal(rows.positions[e, layer], seen[(e, layer)][0].int())
                assert torch.equal(feats[e, layer], seen[(e, layer)][1].to(feats.dtype))
        # labels: α of those candidates, recomputed by brute force from eager full attention
        ref, _ = naive_alpha(model, traces[tid], B, W)
        want = ref.gather(-1, rows.positions.long())
        torch.testing.assert_close(rows.alpha, want, atol=2e-6, rtol=1e-5)
        # the oracle's evict set for that cache: the W lowest α
        assert rows.evicted.sum(-1).eq(W).all()
        low = rows.alpha.masked_fill(~rows.evicted, float("-inf")).amax(-1)
        high = rows.alpha.masked_fill(rows.evicted, float("inf")).amin(-1)
        assert (low <= high).all()
    assert differs > 0, "with beta=0 the round-1 candidate sets must differ from golden's somewhere"
    recs = [r for r in _metrics(out) if r["kind"] == "eval"]
    assert [r["round"] for r in recs] == [0, 1] and all(0 <= r["overlap"] <= 1 for r in recs)
    assert recs[1]["onpolicy_events"] > 0 and recs[0]["onpolicy_events"] == 0


def test_sampled_rounds_follow_the_learned_policys_sampled_draw(data, runs):
    """dagger_temperature=T: where the scorer acts, the round's cache is the ``learned`` policy's under
    selection=sample at T on the trace's own generator; the draws do not depend on the batching; T=0 is top-k."""
    from foresight.features import FEATURE_GROUPS, FeatureExtractor
    from foresight.policies import make_policy
    from foresight.runtime import replay
    from training.onpolicy import collect_onpolicy_events, draw_generators

    model, labels, ids, seqs, scorer, cols = _three_traces(data, runs)

    def ext():
        return FeatureExtractor(window=W, feature_set=tuple(FEATURE_GROUPS))

    def rounds(temperature, batch):
        return collect_onpolicy_events(model, seqs, ids, labels, scorer, ext, cols, B, W, 1, 0.0, 0, torch.float32,
                                       batch, temperature)

    topk, sampled, batched = rounds(0.0, 1), rounds(1.0, 1), rounds(1.0, 3)
    for a, b in zip(sampled, batched):
        assert torch.equal(a.positions, b.positions) and torch.equal(a.alpha, b.alpha)
    assert any(not torch.equal(a.positions, b.positions) for a, b in zip(topk, sampled))
    for tid, seq, rec, ref in zip(ids, seqs, sampled, topk):
        for temperature, want in ((1.0, rec), (None, ref)):
            seen = {}
            args = dict(selection="sample", temperature=temperature) if temperature else {}
            learned = make_policy("learned", scorer=scorer, **args, on_features=lambda v, f: seen.__setitem__(
                (v.event, v.layer_idx), v.candidate_positions[0].clone()))
            reset = learned.reset

            def reset_on_the_rounds_generator(*a, reset=reset, learned=learned, tid=tid, **k):
                reset(*a, **k)
                learned._gens = draw_generators(0, 1, tid, model.config.num_hidden_layers)

            learned.reset = reset_on_the_rounds_generator
            replay(model, [seq], learned, B, W)
            for e in range(want.positions.shape[0]):
                for layer in range(2):
                    assert torch.equal(want.positions[e, layer], seen[(e, layer)].int()), (tid, temperature, e)


def test_topk_rounds_act_as_the_learned_policy_with_the_scorers_recorded_defaults(data, runs):
    """A scorer that records top-k defaults (newcomer bonus, age prior, spread: an exported scorer's) acts in a
    round's replay as the ``learned`` policy deploys it, not as its bare top-k."""
    from foresight.features import FEATURE_GROUPS, FeatureExtractor
    from training.onpolicy import collect_onpolicy_events

    model, labels, ids, seqs, bare, cols = _three_traces(data, runs)
    tuned = _with_config(bare, **TOPK_DEFAULTS)

    def rounds(scorer):
        return collect_onpolicy_events(model, seqs, ids, labels, scorer,
                                       lambda: FeatureExtractor(window=W, feature_set=tuple(FEATURE_GROUPS)),
                                       cols, B, W, 1, 0.0, 0, torch.float32, 2)

    plain, acted = rounds(bare), rounds(tuned)
    assert any(not torch.equal(a.positions, b.positions) for a, b in zip(plain, acted))
    for seq, rec in zip(seqs, acted):
        seen = _learned_trajectory(model, seq, dict(scorer=tuned))
        for e in range(rec.positions.shape[0]):
            for layer in range(2):
                assert torch.equal(rec.positions[e, layer], seen[(e, layer)][0].int()), (e, layer)


def test_init_scorer_fine_tunes_that_scorer_with_its_window_and_defaults(data, runs, tmp_path):
    """``init_scorer``: every round starts from that scorer (its weights and standardisation, not a refit), the
    features use its recent-query window (a moved scorer's trained W), round 1's rows are its own deployed
    trajectory (window and top-k defaults), and the result keeps its config and records where it started."""
    import datasets

    from foresight.scorer import Scorer, scorer_sha256
    from training.dagger import round_dir
    from training.event_files import EventRows
    from training.sl import SLData, run_sl

    root, _, _ = runs
    src = Scorer.from_pretrained(round_dir(root / "dagger", 0) / "scorer")
    init_dir = tmp_path / "init"
    _with_config(src, window=2, **TOPK_DEFAULTS).save_pretrained(init_dir)
    cfg = _cfg(data, tmp_path / "ft", init_scorer=str(init_dir), dagger_rounds=1, dagger_beta=0.0, lr=0.003)
    out = run_sl(cfg)
    assert out["finished"]
    init = Scorer.from_pretrained(init_dir)
    r0 = Scorer.from_pretrained(round_dir(cfg.out_dir, 0) / "scorer")
    for k in ("feature_mean", "feature_std"):  # its standardisation, not refitted on these traces
        assert torch.equal(r0.state_dict()[k], init.state_dict()[k]), k
    assert not torch.equal(r0.w1, init.w1)  # and trained from there
    final = Scorer.from_pretrained(Path(cfg.out_dir) / "scorer")
    assert final.config.window == 2 and final.config.feature_window == 2
    assert {k: getattr(final.config, k) for k in TOPK_DEFAULTS} == TOPK_DEFAULTS
    assert final.config.provenance["init_scorer_sha256"] == scorer_sha256(init_dir)
    assert "normalizer_events" not in final.config.provenance
    assert SLData(cfg).resume_identity()["init_scorer"] == scorer_sha256(init_dir)
    # round 1's rows: the learned policy's trajectory with round 0's scorer, and the features it builds (window 2)
    model, _ = foresight.load_model("tiny-llama", device="cpu")
    traces = {r["trace_id"]: r["input_ids"] for r in datasets.load_from_disk(str(data[0]))}
    cols = _columns(model, r0)
    for tid in json.loads((Path(cfg.out_dir) / "split.json").read_text())["train"]:
        rows = _rows(Path(cfg.out_dir), 1, tid)
        feats = EventRows([rows.features], cols)[:]
        seen = _learned_trajectory(model, traces[tid], dict(scorer=r0))
        for e in range(rows.positions.shape[0]):
            for layer in range(2):
                pos, f = seen[(e, layer)]
                assert torch.equal(rows.positions[e, layer], pos.int()), (tid, e, layer)
                assert torch.equal(feats[e, layer], f.to(feats.dtype)), (tid, e, layer)  # stored as float16


@pytest.mark.parametrize("key,value", [("hidden", 8), ("decay", 0.5), ("feature_set", ["key", "value"])])
def test_init_scorer_of_another_network_is_refused(data, runs, tmp_path, key, value):
    from training.dagger import round_dir

    root, _, _ = runs
    init = str(round_dir(root / "dagger", 0) / "scorer")
    with pytest.raises(ValueError, match=f"{key}=.* but init_scorer .* has {key}="):
        _cfg(data, tmp_path / "x", init_scorer=init, **{key: value})
    with pytest.raises(ForesightError, match="not a scorer directory"):
        _cfg(data, tmp_path / "x", init_scorer=str(tmp_path / "missing"))


def test_dagger_rounds_zero_is_todays_distillation(runs):
    from training.dagger import round_dir

    root, plain, _ = runs
    assert plain["finished"] and not (root / "plain" / "rounds").exists()
    assert all("round" not in r for r in _metrics(root / "plain"))
    a, b = _weights(root / "plain" / "scorer"), _weights(round_dir(root / "dagger", 0) / "scorer")
    for k in a:  # round 0 of a DAgger run is the plain run, bit for bit
        assert torch.equal(a[k], b[k]), k
    final = _weights(root / "dagger" / "scorer")
    assert any(not torch.equal(final[k], a[k]) for k in a)  # the last round's scorer is the run's scorer


def _metrics(out: Path) -> list[dict]:
    from training.logging import read_metrics

    return read_metrics(out / "metrics.jsonl")


# ---------------------------------------------------------------------------------------------------------------
# Resume mid-DAgger
# ---------------------------------------------------------------------------------------------------------------


def test_a_slice_too_short_for_a_later_rounds_checkpoint_stops_before_it(data, tmp_path, monkeypatch):
    """max_steps_per_run=8 with 6 steps a round and a checkpoint every 3: after round 0 two steps are left, which
    cannot reach round 1's first checkpoint; the invocation stops there instead of raising mid-run (the validated
    round config) or doing steps that no checkpoint keeps; a resume with other data is refused before the model
    loads."""
    import datasets

    import training.loop
    from training.dagger import round_dir
    from training.sl import run_sl

    kw = dict(dagger_rounds=1, steps=6, checkpoint_every=3)
    a = run_sl(_cfg(data, tmp_path / "run", max_steps_per_run=8, **kw))
    assert not a["finished"] and a["round"] == 1 and a["steps_this_run"] == 6
    assert not (round_dir(tmp_path / "run", 1) / "checkpoints").exists()
    # a resume with other data (one trace fewer: another split) is refused before the model loads, nothing written
    fewer = tmp_path / "fewer"
    datasets.load_from_disk(str(data[0])).select(range(5)).save_to_disk(str(fewer))
    state = (tmp_path / "run" / "rounds" / "dagger.json").read_bytes()
    with monkeypatch.context() as m, pytest.raises(ForesightError, match="differing: labels, traces"):
        m.setattr(training.loop, "load_model", None)
        run_sl(_cfg((fewer, data[1]), tmp_path / "run", **kw), resume=True)
    assert (tmp_path / "run" / "rounds" / "dagger.json").read_bytes() == state
    b = run_sl(_cfg(data, tmp_path / "run", **kw), resume=True)
    assert b["finished"] and b["steps_this_run"] == 6


def test_resume_mid_dagger_equals_uninterrupted(data, tmp_path):
    from training.dagger import round_dir
    from training.sl import run_sl

    kw = dict(dagger_rounds=2, steps=6, checkpoint_every=3, eval_fidelity=True, fidelity_policies=["h2o"],
              fidelity_max_traces=1)
    full = run_sl(_cfg(data, tmp_path / "full", **kw))
    assert full["finished"]
    # killed mid round 1 (6 + 3 steps), then mid round 2 (6 more steps), then to the end
    a = run_sl(_cfg(data, tmp_path / "part", max_steps_per_run=9, **kw))
    assert not a["finished"] and a["round"] == 1 and not (tmp_path / "part" / "scorer").exists()
    with pytest.raises(ForesightError, match="dagger_beta"):
        run_sl(_cfg(data, tmp_path / "part", dagger_beta=0.25, **kw), resume=True)
    b = run_sl(_cfg(data, tmp_path / "part", max_steps_per_run=6, **kw), resume=True)
    assert not b["finished"] and b["round"] == 2 and b["steps_this_run"] == 6
    c = run_sl(_cfg(data, tmp_path / "part", **kw), resume=True)
    assert c["finished"] and c["steps_this_run"] == 3
    for r in range(3):
        x = _weights(round_dir(tmp_path / "full", r) / "scorer")
        y = _weights(round_dir(tmp_path / "part", r) / "scorer")
        for k in x:
            torch.testing.assert_close(y[k], x[k], rtol=0, atol=1e-7, msg=f"round {r} {k}")
    for k, v in _weights(tmp_path / "full" / "scorer").items():
        torch.testing.assert_close(_weights(tmp_path / "part" / "scorer")[k], v, rtol=0, atol=1e-7)

    def evals(out):
        return [{k: v for k, v in r.items() if k != "time"} for r in _metrics(out) if r["kind"] == "eval"]

    assert evals(tmp_path / "part") == evals(tmp_path / "full")
    recs = evals(tmp_path / "full")
    assert [(r["round"], r["step"], r["beta"]) for r in recs] == [(0, 6, 1.0), (1, 12, 0.5), (2, 18, 0.25)]
    assert all(r["loss_ratio"] > 0 for r in recs)
    assert {f["policy"] for f in recs[-1]["fidelity"]} == {"learned", "h2o"}


def test_a_round_restarted_without_a_checkpoint_logs_each_step_once(data, tmp_path):
    """A round killed before its first checkpoint starts at step 0 again on --resume; its rounds/round-r/metrics.jsonl
    kept the killed attempt's records, so steps 2, 4, 6 appeared twice."""
    from training.dagger import round_dir
    from training.sl import run_sl

    kw = dict(dagger_rounds=1, steps=6)
    assert run_sl(_cfg(data, tmp_path / "run", **kw))["finished"]
    r1 = round_dir(tmp_path / "run", 1)
    logged = [r["step"] for r in _metrics(r1) if r["kind"] == "train"]
    assert logged == [2, 4, 6]
    shutil.rmtree(r1 / "scorer")  # as a kill mid round 1 leaves it: records logged, round not marked finished
    (r1 / "summary.json").unlink()
    (tmp_path / "run" / "summary.json").unlink()
    shutil.rmtree(tmp_path / "run" / "scorer")
    assert run_sl(_cfg(data, tmp_path / "run", **kw), resume=True)["finished"]
    assert [r["step"] for r in _metrics(r1) if r["kind"] == "train"] == logged


def test_more_rounds_extend_a_finished_run_like_a_longer_run(data, tmp_path):
    from training.dagger import STATE, round_dir
    from training.sl import run_sl

    full = run_sl(_cfg(data, tmp_path / "full", dagger_rounds=2, steps=6))
    ext = tmp_path / "ext"
    assert not run_sl(_cfg(data, ext, dagger_rounds=1, steps=6, max_steps_per_run=9))["finished"]  # killed in round 1
    with pytest.raises(ForesightError, match=r"dagger_rounds=1 run is not finished \(round 1 open\)"):
        run_sl(_cfg(data, ext, dagger_rounds=2, steps=6), resume=True)  # an open round is finished first
    assert run_sl(_cfg(data, ext, dagger_rounds=1, steps=6), resume=True)["finished"]
    one_round = _weights(ext / "scorer")
    with pytest.raises(ForesightError, match="dagger_beta"):  # only the count may differ
        run_sl(_cfg(data, ext, dagger_rounds=2, dagger_beta=0.25, steps=6), resume=True)
    assert (ext / "scorer").is_dir() and (ext / "summary.json").is_file()  # a refused extension changed nothing
    res = run_sl(_cfg(data, ext, dagger_rounds=2, steps=6), resume=True)
    assert res["finished"] and res["steps_this_run"] == 6 and full["finished"]
    for r in range(3):
        x, y = _weights(round_dir(tmp_path / "full", r) / "scorer"), _weights(round_dir(ext, r) / "scorer")
        for k in x:
            torch.testing.assert_close(y[k], x[k], rtol=0, atol=1e-7, msg=f"round {r} {k}")
    final = _weights(ext / "scorer")
    for k, v in _weights(tmp_path / "full" / "scorer").items():
        torch.testing.assert_close(final[k], v, rtol=0, atol=1e-7)
    assert any(not torch.equal(final[k], one_round[k]) for k in final)

    def evals(out):
        return [{k: v for k, v in r.items() if k != "time"} for r in _metrics(out) if r["kind"] == "eval"]

    assert evals(ext) == evals(tmp_path / "full") and [r["round"] for r in evals(ext)] == [0, 1, 2]
    state = json.loads((ext / "rounds" / STATE).read_text())
    assert state["settings"]["dagger_rounds"] == 2 and state["extended"] == [{"from": 1, "to": 2}]
    with pytest.raises(ForesightError, match="dagger_rounds"):  # fewer rounds than recorded: refused
        run_sl(_cfg(data, ext, dagger_rounds=1, steps=6), resume=True)


def test_the_final_scorer_is_replaced_atomically(data, runs, tmp_path, monkeypatch):
    """The end of a run deleted out/scorer, then copied the last round's scorer there: a kill in between left no
    scorer, a kill in the copy a torn one. Now out/scorer is the earlier one (or none), whole, until the copy is."""
    from tests.conftest import Killed
    from tests.policies.test_scorer import _tree
    from training.dagger import round_dir
    from training.sl import run_sl

    root = runs[0]
    out = tmp_path / "dagger"
    shutil.copytree(root / "dagger", out)
    shutil.copytree(root / "features", tmp_path / "features")  # the run's feature cache (out.parent / "features")
    cfg = _cfg(data, out, dagger_rounds=1, dagger_beta=0.0)
    (out / "scorer" / "notes.txt").write_text("the earlier scorer/")
    before = _tree(out / "scorer")
    copyfile = shutil.copyfile

    def killed(src, dst, *a, **k):  # the process dies halfway through the weights' copy
        copyfile(src, dst, *a, **k)
        if Path(dst).name == "model.safetensors":
            with open(dst, "r+b") as f:
                f.truncate(100)
            raise Killed

    def scorers():
        return sorted(p.name for p in out.iterdir() if "scorer" in p.name)

    for earlier in (True, False):
        if not earlier:
            shutil.rmtree(out / "scorer")
        with monkeypatch.context() as m:
            m.setattr(shutil, "copyfile", killed)
            with pytest.raises(Killed):
                run_sl(cfg, resume=True)  # a finished run: nothing to train, the end of the run again
        if earlier:
            assert _tree(out / "scorer") == before  # the earlier scorer, whole
        assert scorers() == (["scorer"] if earlier else []), earlier  # no torn scorer/, no temporary
    assert run_sl(cfg, resume=True)["finished"]
    assert _tree(out / "scorer") == _tree(round_dir(out, 1) / "scorer") and scorers() == ["scorer"]


@pytest.mark.parametrize("earlier, rerun", [("dagger", ["dagger_rounds=1", "dagger_beta=0.0"]),
                                            ("dagger", ["dagger_rounds=0"]),
                                            ("plain", ["dagger_rounds=1", "dagger_beta=0.0"])])
def test_a_fresh_run_into_an_earlier_run_is_refused(data, runs, tmp_path, capsys, monkeypatch, earlier, rerun):
    """Without --resume a DAgger run removed an earlier DAgger run's rounds/ (its rows: hours of replay, 15 GB a round
    at B=64 on 336 traces); a plain run (dagger_rounds=0) left them beside a scorer they did not make (and overwrote
    the scorer, summary and split); a DAgger run into an earlier plain run left that run's checkpoints, which a later
    plain --resume would continue. All refused like a plain run over checkpoints: one line, exit 2, before the model
    loads, nothing removed or written."""
    import shutil

    from foresight.cli import main
    from tests.safety.test_resume_safety import _cli, _files, _no_model_load, _one_line_error
    from training.checkpoint import checkpoint_root

    out = tmp_path / "run"
    if earlier == "dagger":
        shutil.copytree(runs[0] / earlier, out)
    else:  # the fixture's plain run keeps no checkpoints; this one does (checkpoint_every=4)
        assert main(_cli(data, out)) == 0 and checkpoint_root(out).is_dir()
        capsys.readouterr()
    before = _files(out)
    _no_model_load(monkeypatch)
    assert main(_cli(data, out, *rerun)) == 2
    err = _one_line_error(capsys)
    if earlier == "dagger":
        rounds = out / "rounds"
        assert f"out_dir {out} holds an earlier DAgger run ({rounds}: 2 finished round(s)); pass --resume" in err
    else:
        assert f"out_dir {out} holds the checkpoints of an earlier run (newest: {checkpoint_root(out)}" in err
    assert _files(out) == before  # nothing removed or written


# ---------------------------------------------------------------------------------------------------------------
# Disk: a round's rows are estimated before they are recorded, and refused when they will not fit
# ---------------------------------------------------------------------------------------------------------------


def _data_bytes(path: Path) -> int:
    """Bytes of a safetensors file's tensors (the file less its 8-byte length and JSON header)."""
    raw = path.read_bytes()
    return len(raw) - 8 - int.from_bytes(raw[:8], "little")


def test_disk_estimates_equal_the_bytes_written(data, runs):
    from training.dagger import rows_bytes, rows_file
    from training.distributed import DistInfo
    from training.event_files import events_bytes
    from training.sl import SLTask

    root, _, _ = runs
    out = root / "dagger"
    task = SLTask(_cfg(data, out, dagger_rounds=1, dagger_beta=0.0), DistInfo(0, 1, 0, torch.device("cpu")))
    recorded = sum(_data_bytes(rows_file(out, 1, row["trace_id"])) for row in task.train_rows)
    need, traces = rows_bytes(task, task.cfg, [1], reuse=False)
    assert traces == len(task.train_rows) > 1 and need == recorded  # exact: the same tensors, byte for byte
    assert rows_bytes(task, task.cfg, [1]) == (0, 0)  # recorded rows are reused: nothing more to write
    assert rows_bytes(task, task.cfg, [1, 2]) == (recorded, traces)  # round 2 is still to record
    cfg = task.cfg
    cache = task.feature_cache
    assert cache.groups == tuple(cfg.feature_set)  # the scorer's groups (feature_cache_groups: scorer)
    for row in task.train_rows + task.val_rows:  # the feature cache's files, estimated before extraction
        tid = row["trace_id"]
        need = events_bytes(task.labels[tid], cache.head_dim, cache.num_groups, torch.float16, cache.groups)
        assert need == _data_bytes(cache.file(tid)), tid


def test_writes_that_will_not_fit_on_the_disk_are_refused_before_any_work(data, tmp_path, monkeypatch):
    import shutil

    from training import event_files
    from training.dagger import round_dir
    from training.sl import run_sl

    free, real = {"calls": 0, "bytes": [1]}, shutil.disk_usage

    def disk_usage(path):
        free["calls"] += 1
        return real(path)._replace(free=free["bytes"][min(free["calls"], len(free["bytes"])) - 1])

    monkeypatch.setattr(event_files.shutil, "disk_usage", disk_usage)  # the one shutil module: every caller
    out, cache = tmp_path / "run", tmp_path / "features"
    with pytest.raises(ForesightError, match=r"the feature cache \(6 trace files\) will write about [\d.e-]+ GB "
                                             r"under .*features/\w+, but only 1e-09 GB is free there"):
        run_sl(_cfg(data, out, dagger_rounds=2, steps=6))
    assert not list(cache.rglob("*.safetensors")) and not (out / "rounds").exists()  # nothing extracted or written
    free.update(calls=0, bytes=[10**12, 1])  # the cache fits, the rows of rounds 1 and 2 do not
    with pytest.raises(ForesightError, match=r"dagger_rounds: rounds 1, 2 \(8 rows files\) will write about "
                                             r"[\d.e-]+ GB under .*rounds, but only 1e-09 GB is free there"):
        run_sl(_cfg(data, out, dagger_rounds=2, steps=6))
    assert free["calls"] == 2 and not (out / "rounds").exists()  # refused before round 0 trained or wrote anything
    # enough for both rounds at the start (the cache is there: nothing to check), then the disk fills before round 2
    free.update(calls=0, bytes=[10**12, 10**12, 1])
    with pytest.raises(ForesightError, match=r"dagger_rounds: round 2 \(4 rows files\) will write about"):
        run_sl(_cfg(data, out, dagger_rounds=2, steps=6))
    assert (round_dir(out, 1) / "summary.json").is_file() and not (round_dir(out, 2) / "rows").exists()
    free.update(calls=0, bytes=[10**12])  # space freed: --resume goes on at round 2
    assert run_sl(_cfg(data, out, dagger_rounds=2, steps=6), resume=True)["finished"]


def test_replays_are_batched_by_length(data, tmp_path, monkeypatch):
    """Feature extraction and a round's recording replay the traces in batches of similar lengths, longest first
    (:func:`foresight.runtime.length_batches`), and record every trace once."""
    import training.dagger as dagger_mod
    import training.sl_features as features_mod
    from foresight.runtime import length_batches
    from training.sl import SLData

    seen = {"features": [], "round": []}
    for mod, name, key in ((features_mod, "collect_events", "features"),
                           (dagger_mod, "collect_onpolicy_events", "round")):
        real = getattr(mod, name)

        def spy(model, sequences, *args, real=real, key=key, **kwargs):
            seen[key].append([len(s) for s in sequences])
            return real(model, sequences, *args, **kwargs)

        monkeypatch.setattr(mod, name, spy)
    cfg = _cfg(data, tmp_path / "run", dagger_rounds=1, dagger_beta=0.0, steps=2, replay_batch_size=2,
               feature_cache=str(tmp_path / "features"))
    split = SLData(cfg)
    from training.sl import run_sl

    run_sl(cfg)
    every = [len(r["input_ids"]) for r in split.train_rows + split.val_rows]
    train = [len(r["input_ids"]) for r in split.train_rows]
    assert len(set(every)) > 2  # the test data's lengths differ, or the order would not matter
    assert seen["features"] == [[every[i] for i in b] for b in length_batches(every, 2)]
    assert seen["round"] == [[train[i] for i in b] for b in length_batches(train, 2)]
