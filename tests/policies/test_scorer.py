"""The learned scorer, its feature extractor and the `learned` policy.

Key property: there is ONE feature extractor. Features computed while decoding with the `learned`
policy equal those computed during a teacher-forced replay of the same sequence along the same evictions.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

import pytest
import torch

import foresight
from foresight.errors import ForesightError
from foresight.feature_groups import ATTN_STATS, feature_dim
from foresight.features import FeatureExtractor
from foresight.policies import make_policy
from foresight.policies.base import EvictionPolicy
from foresight.sampling import kept_indices, sample_eviction
from foresight.policies.recorder import FeatureRecorder
from foresight.scorer import Scorer, ScorerConfig, ScorerMismatchError
from foresight.scorer_average import average_scorers
from tests.conftest import get_model

B, W = 16, 4
FULL_SET = ("key", "value", "attn", "age")


def _scorer(model, feature_set=FULL_SET, seed=0, hidden=8) -> Scorer:
    cfg = ScorerConfig(foresight.model_fingerprint(model), budget=B, interval=W, feature_set=feature_set, hidden=hidden)
    return Scorer(cfg, seed=seed)


# ---------------------------------------------------------------------------------------------------------------
# Scorer network
# ---------------------------------------------------------------------------------------------------------------


def test_scorer_all_layers_equals_per_layer_and_per_head_loop():
    model, _ = get_model("tiny-llama")
    sc = _scorer(model)
    with torch.no_grad():
        sc.feature_mean.normal_()
        sc.feature_std.uniform_(0.5, 2.0)
    L, K, D = sc.config.num_layers, sc.config.num_kv_heads, sc.config.input_dim
    x = torch.randn(L, 3, K, 7, D)
    out = sc(x)
    assert out.shape == (L, 3, K, 7)
    for layer in range(L):
        torch.testing.assert_close(sc(x[layer], layer_idx=layer), out[layer])
        for k in range(K):  # brute force: one plain MLP per (layer, head)
            xn = (x[layer, :, k] - sc.feature_mean[layer, k]) / sc.feature_std[layer, k]
            h = torch.nn.functional.gelu(xn @ sc.w1[layer, k] + sc.b1[layer, k])
            ref = h @ sc.w2[layer, k] + sc.b2[layer, k]
            torch.testing.assert_close(out[layer, :, k], ref, rtol=1e-5, atol=1e-5)


def test_input_dim_matches_feature_groups():
    model, _ = get_model("tiny-llama")
    d, g = 16, 2  # tiny-llama: head_dim 16, 4 query heads over 2 KV heads
    assert feature_dim(("key", "value", "attn"), d, g) == 2 * d + ATTN_STATS * g
    assert _scorer(model).config.input_dim == 2 * d + ATTN_STATS * g + 1
    with pytest.raises(ValueError):
        ScorerConfig(foresight.model_fingerprint(model), B, W, feature_set=("key", "nope"))


def test_the_feature_window_is_the_interval_unless_a_moved_scorer_records_its_own(tmp_path):
    """``window`` is written only for a scorer moved to another cache (``foresight export --budget --interval``):
    equal to the interval it is the default (one way to write each config), and it must be a positive integer."""
    fp = foresight.model_fingerprint(get_model("tiny-llama")[0])
    plain = ScorerConfig(fp, B, W)
    assert plain.window is None and plain.feature_window == W and plain.extractor().window == W
    assert "window" not in plain.to_dict()  # every earlier config reads and writes as it was
    moved = ScorerConfig(fp, 2 * B, 2 * W, window=W)
    assert moved.feature_window == W and moved.extractor().window == W and moved.to_dict()["window"] == W
    assert ScorerConfig.from_dict(moved.to_dict()) == moved
    assert ScorerConfig(fp, B, W, window=W).window is None
    for bad in (0, -4):
        with pytest.raises(ValueError, match=f"window must be a positive integer \\(or null\\), got {bad}"):
            ScorerConfig(fp, B, W, window=bad)
    with pytest.raises(ValueError, match="window"):
        ScorerConfig(fp, B, W, window=2.5)


def test_saving_the_same_weights_gives_the_same_bytes(tmp_path):
    """A scorer's weights file is identified by its SHA-256 (quality.json, model cards, adapter pairing): saving the
    same weights again, in this process or another, must give the same bytes."""
    sc = _scorer(get_model("tiny-llama")[0], seed=2)
    digests = set()
    for i in range(8):
        sc.save_pretrained(tmp_path / f"s{i}")
        digests.add(hashlib.sha256((tmp_path / f"s{i}" / "model.safetensors").read_bytes()).hexdigest())
    assert len(digests) == 1


def _tree(path) -> dict[str, bytes]:
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def test_save_is_atomic_a_failure_in_the_write_leaves_no_torn_scorer(tmp_path, monkeypatch):
    """A kill or an error in the middle of save_pretrained left config.json of one scorer beside no (or a torn)
    model.safetensors: a later load refused it, or paired an old config with new weights. Now the folder is either
    the earlier one, whole, or the new one; no temporary is left after an error."""
    import foresight.scorer_files as scorer_files
    from tests.conftest import Killed, kill_while_writing

    model, _ = get_model("tiny-llama")
    old, new = _scorer(model, seed=1), _scorer(model, seed=2, hidden=4)
    save_file = scorer_files.save_file

    def torn(state, path, metadata=None):  # half the weights on disk, then the error
        save_file(state, path, metadata=metadata)
        with open(path, "r+b") as f:
            f.truncate(100)
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(scorer_files, "save_file", torn)
        with pytest.raises(OSError, match="No space left"):
            new.save_pretrained(tmp_path / "fresh")
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no scorer, no temporary

    old.save_pretrained(tmp_path / "s")
    (tmp_path / "s" / "notes").mkdir()
    (tmp_path / "s" / "notes" / "n.txt").write_text("kept")  # a file of its own: saving over it keeps it
    before = _tree(tmp_path / "s")
    for fail in ("weights", "config"):
        with monkeypatch.context() as m:
            if fail == "weights":
                m.setattr(scorer_files, "save_file", torn)
                with pytest.raises(OSError):
                    new.save_pretrained(tmp_path / "s")
            else:
                kill_while_writing(m, "config.json")
                with pytest.raises(Killed):
                    new.save_pretrained(tmp_path / "s")
        assert _tree(tmp_path / "s") == before, fail  # the earlier scorer, whole
        assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]
    assert Scorer.from_pretrained(tmp_path / "s").config.hidden == 8

    new.save_pretrained(tmp_path / "s")  # replaced as a whole; its other files carried over
    after = _tree(tmp_path / "s")
    assert after["notes/n.txt"] == b"kept" and after["model.safetensors"] != before["model.safetensors"]
    loaded = Scorer.from_pretrained(tmp_path / "s", model=model)
    assert loaded.config.hidden == 4 and all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(),
                                                                              new.state_dict().values()))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]


def test_save_load_round_trip_and_mismatch(tmp_path):
    model, _ = get_model("tiny-llama")
    sc = _scorer(model, seed=3)
    with torch.no_grad():
        sc.feature_mean.normal_()
    sc.config.provenance = {"data": "unit-test", "steps": 0}
    sc.save_pretrained(tmp_path / "s")
    cfg = json.loads((tmp_path / "s" / "config.json").read_text())
    assert cfg["fingerprint"] == foresight.model_fingerprint(model)
    assert (cfg["budget"], cfg["interval"], cfg["hidden"]) == (B, W, 8)
    assert cfg["provenance"]["data"] == "unit-test"
    loaded = Scorer.from_pretrained(tmp_path / "s", model=model)
    x = torch.randn(sc.config.num_layers, 2, sc.config.num_kv_heads, 5, sc.config.input_dim)
    torch.testing.assert_close(loaded(x), sc(x))

    other, _ = get_model("tiny-qwen3")  # same shapes, other architecture
    with pytest.raises(ScorerMismatchError, match="model_type"):
        Scorer.from_pretrained(tmp_path / "s", model=other)
    fp = dict(foresight.model_fingerprint(model), num_layers=5)
    with pytest.raises(ForesightError, match="num_layers"):
        sc.check_compatible(fp)
    with pytest.raises(ForesightError, match="not a scorer directory"):
        Scorer.from_pretrained(tmp_path / "missing")
    # every key has its type: a whole float is taken as the integer it is, anything else is one line naming the file
    # and the key (a float width used to reach torch.empty: an internal error)
    (tmp_path / "s" / "config.json").write_text(json.dumps({**cfg, "hidden": 8.0}))
    assert Scorer.from_pretrained(tmp_path / "s", model=model).config.hidden == 8
    for key, value in (("hidden", 8.5), ("budget", "16"), ("decay", None)):
        (tmp_path / "s" / "config.json").write_text(json.dumps({**cfg, key: value}))
        with pytest.raises(ForesightError, match=rf"config.json is not a valid scorer config .*`{key}`"):
            Scorer.from_pretrained(tmp_path / "s")


def test_a_damaged_scorer_config_or_weights_file_is_one_line_naming_it(tmp_path):
    from safetensors.torch import load_file, save_file

    model, _ = get_model("tiny-llama")
    _scorer(model).save_pretrained(tmp_path / "s")
    cfg = json.loads((tmp_path / "s" / "config.json").read_text())
    fp = cfg["fingerprint"]
    # shapes the network is built from (a ZeroDivisionError / RuntimeError before), a decay the extractor refuses
    # later without the file's name, and a misspelt key whose default was used without a word
    for bad, match in (({"fingerprint": {**fp, "num_kv_heads": 0}}, "num_kv_heads"),
                       ({"fingerprint": {**fp, "num_layers": -2}}, "num_layers"),
                       ({"fingerprint": {**fp, "head_dim": "16"}}, "head_dim"),
                       ({"fingerprint": {**fp, "num_heads": 5}}, "multiple"),
                       ({"decay": -1.0}, "decay"), ({"decy": 0.5}, "decy")):
        (tmp_path / "s" / "config.json").write_text(json.dumps({**cfg, **bad}))
        with pytest.raises(ForesightError, match=rf"config.json is not a valid scorer config .*{match}"):
            Scorer.from_pretrained(tmp_path / "s")
    (tmp_path / "s" / "config.json").write_text(json.dumps(cfg))
    state = load_file(str(tmp_path / "s" / "model.safetensors"))
    # integer weights were cast to float32 and a std <= 0 divided the features by zero or flipped their sign
    for key, value, match in (("w1", state["w1"].round().to(torch.int32), "'w1' is int32"),
                              ("feature_std", -state["feature_std"], "'feature_std' holds .* <= 0")):
        save_file({**state, key: value}, str(tmp_path / "s" / "model.safetensors"))
        with pytest.raises(ForesightError, match=rf"model.safetensors: tensor {match}"):
            Scorer.from_pretrained(tmp_path / "s")


def test_learned_policy_refuses_a_scorer_for_another_layout(tmp_path):
    model, tok = get_model("tiny-llama")
    fp = dict(foresight.model_fingerprint(model), num_layers=3)
    sc = Scorer(ScorerConfig(fp, B, W))
    with pytest.raises(ForesightError, match="num_layers"):
        foresight.generate(model, tok, ["hi"], policy=make_policy("learned", scorer=sc), budget=B, interval=W,
                           max_new_tokens=30)
    with pytest.raises(ForesightError, match="needs a scorer"):
        make_policy("learned")
    # what --policy-arg gives: a directory name YAML reads as a number, a value for the library's callback
    with pytest.raises(ForesightError, match="scorer must be a scorer directory .* got 2024"):
        make_policy("learned", scorer=2024)
    with pytest.raises(ForesightError, match="on_features must be a callable"):
        make_policy("learned", scorer=_scorer(model), on_features="x")
    with pytest.raises(ValueError, match="selection"):
        make_policy("learned", scorer=_scorer(model), selection="greedy")


# ---------------------------------------------------------------------------------------------------------------
# learned policy
# ---------------------------------------------------------------------------------------------------------------


def test_learned_policy_from_directory_generates_within_budget(tmp_path):
    model, tok = get_model("tiny-llama")
    _scorer(model).save_pretrained(tmp_path / "s")
    for selection in ("topk", "sample"):
        pol = make_policy("learned", scorer=str(tmp_path / "s"), selection=selection, seed=1)
        res = foresight.generate(model, tok, ["Hello there", "Hi"], policy=pol, budget=B, interval=W,
                                 max_new_tokens=40, stop_on_eos=False)
        assert res.stats["evictions"] > 0
        assert max(res.stats["peak_entries"]) <= B + W
    a = foresight.generate(model, tok, ["Hello"], policy=make_policy("learned", scorer=str(tmp_path / "s"),
                           selection="sample", seed=5), budget=B, interval=W, max_new_tokens=40)
    b = foresight.generate(model, tok, ["Hello"], policy=make_policy("learned", scorer=str(tmp_path / "s"),
                           selection="sample", seed=5), budget=B, interval=W, max_new_tokens=40)
    assert a.token_ids == b.token_ids


def _check_score_offset(model, tok, expected, **policy_args):
    """Generate with the ``learned`` policy under ``policy_args`` and assert at every event that its scores less the
    scorer's own scores of the same features equal ``expected(view)`` (one sequence: (Hkv, candidates)); returns the
    policy."""
    plain = {}
    pol = make_policy("learned", scorer=_scorer(model), selection="topk", spread=0.0, **policy_args,
                      on_features=lambda view, f: plain.update(s=pol.model(f, layer_idx=view.layer_idx)))
    checked = []
    score = pol.score

    def both(view):
        got = score(view)
        torch.testing.assert_close(got[0] - plain["s"][0], expected(view), atol=1e-5, rtol=0)
        checked.append(view.event)
        return got

    pol.score = both
    foresight.generate(model, tok, ["Hello there"], policy=pol, budget=B, interval=W, max_new_tokens=40,
                       stop_on_eos=False)
    assert len(set(checked)) > 3
    return pol


def _candidate_ages(view) -> torch.Tensor:
    """``t - position`` of the first sequence's candidates computed by hand, ``t`` the newest position plus one."""
    pos = view.candidate_positions[0].float()
    return view.positions[0].float().amax(-1, keepdim=True) + 1 - pos


def test_newcomer_bonus_raises_exactly_the_newest_candidates():
    """``newcomer_bonus`` adds to the W newest candidates' scores (those judged on W..2W queries) and to no other."""
    model, tok = get_model("tiny-llama")

    def bonus(view):
        pos = view.candidate_positions[0]
        return torch.where(pos >= pos.topk(W, dim=-1).values[..., -1:], 0.25, 0.0)

    pol = _check_score_offset(model, tok, bonus, newcomer_bonus=0.25)
    with pytest.raises(ValueError, match="newcomer_bonus"):
        make_policy("learned", scorer=pol.model, newcomer_bonus=-0.1)


def test_age_prior_subtracts_log_age_and_a_large_one_evicts_the_oldest():
    """``age_prior`` lowers each candidate's score by ``lam * log1p(t - position)`` (``t`` the newest cached position
    plus one) and nothing else; large enough, top-k keeps the newest candidates, the order of age alone."""
    model, tok = get_model("tiny-llama")
    pol = _check_score_offset(model, tok, lambda view: -0.3 * torch.log1p(_candidate_ages(view)), age_prior=0.3)
    kept = []
    big = make_policy("learned", scorer=pol.model, age_prior=1e4, selection="topk", spread=0.0)
    select = big.select

    def record(scores, num_keep, view):
        keep = select(scores, num_keep, view)
        pos = view.candidate_positions  # (..., batch, Hkv, C): one layer, or all layers of a decode event
        newest = pos.topk(num_keep, dim=-1).indices.sort(-1).values
        kept.append(bool((keep.sort(-1).values == newest).all()))
        return keep

    big.select = record
    foresight.generate(model, tok, ["Hello there"], policy=big, budget=B, interval=W, max_new_tokens=40,
                       stop_on_eos=False)
    assert kept and all(kept)
    with pytest.raises(ValueError, match="age_prior"):
        make_policy("learned", scorer=pol.model, age_prior=-0.1)


def test_shipped_scorer_loads_by_short_name(tmp_path, monkeypatch):
    import foresight.scorer as scorer_mod

    model, tok = get_model("tiny-llama")
    _scorer(model, seed=3).save_pretrained(tmp_path / "shipped" / "tiny-b16")
    monkeypatch.setattr(scorer_mod, "SHIPPED_DIR", tmp_path / "shipped")
    assert list(scorer_mod.shipped_scorers()) == ["tiny-b16"]
    by_name = Scorer.from_pretrained("tiny-b16")
    by_dir = Scorer.from_pretrained(tmp_path / "shipped" / "tiny-b16")
    assert all(torch.equal(a, b) for a, b in zip(by_name.state_dict().values(), by_dir.state_dict().values()))
    pol = make_policy("learned", scorer="tiny-b16")  # the policy takes the short name too
    res = foresight.generate(model, tok, ["Hello"], policy=pol, budget=B, interval=W, max_new_tokens=30,
                             stop_on_eos=False)
    assert res.stats["evictions"] > 0
    with pytest.raises(ForesightError, match="tiny-b16"):  # an unknown name lists what is shipped
        Scorer.from_pretrained("no-such-scorer")


def test_cli_generate_with_learned_policy(tmp_path, capsys):
    from foresight.cli import main

    model, _ = get_model("tiny-llama")
    _scorer(model).save_pretrained(tmp_path / "s")
    rc = main(["generate", "--model", "tiny-llama", "--prompt", "Hello", "--policy", "learned",
               "--policy-arg", f"scorer={tmp_path / 's'}", "--budget", str(B), "--interval", str(W),
               "--max-new-tokens", "30", "--json"])
    assert rc == 0
    stats = json.loads(capsys.readouterr().out)["stats"]
    assert stats["policy"] == "learned" and stats["evictions"] > 0


def test_sample_eviction_draws_from_all_candidates_and_respects_masks():
    gen = torch.Generator().manual_seed(0)
    c, keep = 12, 8  # evict 4 of 12
    scores = torch.arange(c, dtype=torch.float32).repeat(400, 1)
    scores[:, 0] = float("inf")  # a protected sink scored +inf ...
    scores[:, 11] = float("-inf")  # ... and padding scored -inf
    draw = sample_eviction(scores, c - keep, temperature=4.0, generator=gen)
    kept = kept_indices(draw.order, c, keep)
    assert kept.shape == (400, keep)
    evicted = torch.ones(400, c, dtype=torch.bool).scatter_(1, kept, False)
    assert evicted.sum(1).eq(c - keep).all()
    assert evicted[:, 11].all() and not evicted[:, 0].any()
    assert bool((draw.order[:, 0] == 11).all())  # padding goes first, outside the draw
    assert evicted[:, 1:11].any(0).all()  # no pool: every drawable candidate can be evicted (also the 8 highest)
    assert len({tuple(r) for r in evicted.int().tolist()}) > 1  # actually stochastic
    # fewer drawable candidates than evictions: protected entries go last, as top-k would evict them
    few = torch.tensor([[float("inf"), 0.0, float("inf"), 1.0]])
    assert sorted(sample_eviction(few, 3, 1.0, gen).order[0, :2].tolist()) == [1, 3]


# ---------------------------------------------------------------------------------------------------------------
# The feature extractor: brute force, and generation == replay
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class _AttentionLog(EvictionPolicy):
    """Test observer: logs every attention row by logical position (an independent bookkeeping)."""

    name = "attention_log"
    observes = True
    rows: list = field(default_factory=list)

    def observe(self, view):
        if view.layer_idx == 0:
            p = view.probs[0]  # (h, g, q, n)
            pos = view.positions[0]  # (h, n)
            for qi in range(p.shape[2]):
                self.rows.append({(h, int(pos[h, j])): p[h, :, qi, j].clone()
                                  for h in range(p.shape[0]) for j in range(p.shape[-1])})


def test_attention_features_match_brute_force(tiny):
    model, _ = tiny
    seq = torch.randint(3, 250, (1, 45), generator=torch.Generator().manual_seed(1))
    ext = FeatureExtractor(window=W, feature_set=("attn",))
    log = _AttentionLog()
    got = []

    class Driver(EvictionPolicy):
        name = "driver"
        observes = True

        def reset(self, *a, **k):
            log.rows.clear()

        def observe(self, view):
            log.observe(view)

        def score(self, view):
            return -view.candidate_positions.float() * (view.candidate_positions % 3 == 0)  # an odd trajectory

    def on_event(view, feats):
        if view.layer_idx == 0:
            got.append((view.candidate_positions[0].clone(), feats[0].clone(), len(log.rows)))

    foresight.replay(model, seq, FeatureRecorder(extractor=ext, driver=Driver(), on_event=on_event), B, W)
    assert len(got) >= 5
    event_rows = [nrows for _, _, nrows in got]
    for k, (cand, feats, nrows) in enumerate(got):
        rows = log.rows[:nrows]
        hkv, c = cand.shape
        g = feats.shape[-1] // ATTN_STATS
        zero = torch.zeros(g)
        for h in range(hkv):
            for i in range(c):
                p = int(cand[h, i])
                hist = [r.get((h, p), zero) for r in rows]  # absent = not in the cache yet
                last = torch.stack(hist[-W:])
                # attention of every query between consecutive events (the prompt's included); the cumulative
                # features add these up, decayed or not (tests/runtime/test_features_bruteforce.py)
                bounds = [0, *event_rows[: k + 1]]
                ws = [sum((r.get((h, p), zero) for r in log.rows[a:e]), zero) for a, e in zip(bounds, bounds[1:])]
                cum = sum(ws, zero)
                dec = sum((0.9 ** (k - e) * w for e, w in enumerate(ws)), zero)
                ref = torch.stack([last.max(0).values, last.min(0).values, last.sum(0),
                                   torch.stack(hist[-32:]).sum(0), torch.stack(hist[-16:]).sum(0),
                                   torch.stack(hist[-8:]).sum(0), cum, dec], dim=1)  # (g, 8)
                torch.testing.assert_close(feats[h, i].view(g, ATTN_STATS), torch.log(ref + 1e-6),
                                           rtol=1e-4, atol=1e-4)


@dataclass
class _ForcedKeeps(EvictionPolicy):
    """Replays recorded keep sets (candidate indices per event and layer)."""

    name = "forced_keeps"
    keeps: dict = field(default_factory=dict)

    def score(self, view):
        return torch.zeros(view.positions.shape[:2] + (view.num_candidates,))

    def select(self, scores, num_keep, view):
        return self.keeps[(view.event, view.layer_idx)]


@pytest.mark.parametrize("selection,feature_set", [("topk", FULL_SET), ("sample", FULL_SET),
                                                   ("topk", ("prekey", "attn", "query"))])
def test_generation_and_replay_features_are_identical(tiny, selection, feature_set):
    """Decode with `learned`, then replay the generated tokens teacher-forced along the same evictions with a
    fresh extractor: the features at every event and layer agree."""
    model, tok = tiny
    sc = _scorer(model, feature_set=feature_set, seed=2)
    gen_feats, keeps = {}, {}

    pol = make_policy("learned", scorer=sc, selection=selection, seed=3,
                      on_features=lambda v, f: gen_feats.__setitem__((v.event, v.layer_idx), f.clone()))
    orig_on_evict = pol.on_evict

    def record_keep(layer_idx, keep):
        n_keep = B - W
        keeps[(len(keeps) // model.config.num_hidden_layers, layer_idx)] = keep[..., :n_keep].clone()
        orig_on_evict(layer_idx, keep)

    pol.on_evict = record_keep
    prompt = [5, 17, 99, 42, 7, 8]  # shorter than B: no prefill compression, events at B+W, then every W
    res = foresight.generate(model, tok, [prompt], policy=pol, budget=B, interval=W, max_new_tokens=50,
                             stop_on_eos=False, do_sample=True, seed=0)
    seq = prompt + res.token_ids[0][:-1]  # the last sampled token was never fed to the cache
    assert res.stats["evictions"] >= 5

    rep_feats = {}
    rec = FeatureRecorder(extractor=sc.config.extractor(), driver=_ForcedKeeps(keeps=keeps),
                          on_event=lambda v, f: rep_feats.__setitem__((v.event, v.layer_idx), f.clone()))
    foresight.replay(model, [seq], rec, B, W)
    common = sorted(set(gen_feats) & set(rep_feats))
    assert len(common) == len(gen_feats) >= 5 * model.config.num_hidden_layers
    for key in common:
        torch.testing.assert_close(rep_feats[key], gen_feats[key], rtol=1e-4, atol=1e-4, msg=str(key))


def test_feature_subsets_are_columns_of_the_full_set():
    """Training caches every feature group once and selects columns; that equals extracting the subset."""
    from foresight.features import FEATURE_GROUPS, feature_columns

    model, _ = get_model("tiny-qwen3")
    seq = torch.randint(3, 250, (1, 40), generator=torch.Generator().manual_seed(4))
    full_set, subset = tuple(FEATURE_GROUPS), ("attn", "key")
    got = {}
    for fs in (full_set, subset):
        rec = FeatureRecorder(extractor=FeatureExtractor(window=W, feature_set=fs), driver=make_policy("streaming_llm"),
                              on_event=lambda v, f, fs=fs: got.setdefault(fs, []).append(f.clone()))
        foresight.replay(model, seq, rec, B, W)
    cols = torch.tensor(feature_columns(subset, full_set, 16, 2))
    assert len(got[subset]) == len(got[full_set]) > 0
    for a, b in zip(got[full_set], got[subset]):
        torch.testing.assert_close(a.index_select(-1, cols), b)
    with pytest.raises(ValueError):
        feature_columns(("age",), ("key", "attn"), 16, 2)


def test_every_shipped_scorer_loads_and_matches_its_name():
    """The pretrained scorers committed under foresight/scorers/ load by short name (weights finite, checked on
    load) and run at the B and W their name says (trained there, or moved there by ``foresight export --budget
    --interval``, keeping the window they were trained with), for the model their name says."""
    from foresight.fingerprint import file_sha256
    from foresight.scorer import shipped_scorers

    shipped = shipped_scorers()
    assert "smollm2-135m-b64-w16" in shipped
    for name in shipped:
        cfg = Scorer.from_pretrained(name).config
        model, b, w = name.rsplit("-", 2)
        assert (f"b{cfg.budget}", f"w{cfg.interval}") == (b, w)
        assert cfg.fingerprint["model"] == model
        trained = cfg.provenance.get("trained_at")
        assert cfg.feature_window == (trained["interval"] if trained else cfg.interval)
        # selection=sample draws at the scorer's own temperature, so a shipped scorer must record one
        assert cfg.temperature is not None and cfg.temperature > 0
        # the model card's evaluation was measured at the scorer's own B and W
        card = json.loads((shipped[name] / "fidelity.json").read_text())
        assert card and {r["budget"] for r in card} == {cfg.budget} and {r["interval"] for r in card} == {cfg.interval}
        # ... of these very weights: every learned row names them (what `foresight export` checks on a re-export)
        sha = file_sha256(shipped[name] / "model.safetensors")
        assert {r.get("scorer_sha256") for r in card if r["policy"].startswith("learned")} == {sha}


@pytest.mark.slow
def test_shipped_scorer_drives_the_default_model(smollm2):
    """The shipped B=64/W=16 scorer fits SmolLM2-135M (the fingerprint check runs at reset) and evicts."""
    model, tok = smollm2
    pol = make_policy("learned", scorer="smollm2-135m-b64-w16")
    res = foresight.generate(model, tok, ["What is 12 * 13? Think step by step."], policy=pol, budget=64,
                             interval=16, max_new_tokens=80, stop_on_eos=False)
    assert res.stats["evictions"] > 0 and max(res.stats["peak_entries"]) <= 64 + 16


def test_average_scores_the_mean_of_its_members_exactly():
    """The folded ensemble (standardisation folded into W1, hidden units concatenated) against the members'
    own forward passes, per layer and all layers at once; members that do not belong together are refused."""
    model, _ = get_model("tiny-llama")
    members = [_scorer(model, seed=s, hidden=h) for s, h in ((0, 8), (1, 8), (2, 4))]
    gen = torch.Generator().manual_seed(0)
    for i, m in enumerate(members):  # distinct, non-trivial normalisers
        m.feature_mean.copy_(torch.randn(m.feature_mean.shape, generator=gen))
        m.feature_std.copy_(torch.rand(m.feature_std.shape, generator=gen) + 0.1 * (i + 1))
    avg = average_scorers(members)
    assert avg.config.hidden == 20
    L, K, D = avg.w1.shape[:3]
    x = torch.randn(L, 2, K, 11, D, generator=gen) * 3
    want = sum(m(x) for m in members) / 3
    torch.testing.assert_close(avg(x), want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(avg(x[1], layer_idx=1), want[1], atol=1e-5, rtol=1e-5)
    other = Scorer(ScorerConfig(foresight.model_fingerprint(model), budget=B + 4, interval=W, hidden=8), seed=0)
    with pytest.raises(ForesightError, match="budget"):
        average_scorers([members[0], other])
    narrow = Scorer(ScorerConfig(foresight.model_fingerprint(model), budget=B, interval=W, hidden=8, window=W // 2),
                    seed=0)  # the same cache, features of another window
    with pytest.raises(ForesightError, match="differs from .* in window"):
        average_scorers([members[0], narrow])
    assert average_scorers([narrow, narrow]).config.window == W // 2
    hot = _scorer(model, seed=3)
    hot.config.temperature = 0.01
    cold = _scorer(model, seed=4)
    cold.config.temperature = 0.003
    with pytest.raises(ForesightError, match=r"different temperatures \(\(in memory #0\): 0.01, \(in memory #1\): "
                                             r"0.003\); .*temperature="):
        average_scorers([hot, cold])
    # one recorded beside none (which samples at 1) kept the recorded one: a temperature nobody chose for the mean
    with pytest.raises(ForesightError, match=r"#0\): 0.01, \(in memory #1\): none\)"):
        average_scorers([hot, members[0]])
    assert average_scorers([hot, cold], temperature=0.005).config.temperature == 0.005  # chosen explicitly
    assert average_scorers([hot, members[0]], temperature=1.0).config.temperature == 1.0
    cold.config.temperature = 0.01
    assert average_scorers([hot, cold]).config.temperature == 0.01  # equal ones are kept
    assert average_scorers(members[:2]).config.temperature is None
    # top-k defaults: kept where the members agree, refused where they differ (plain top-k nobody chose)
    hot.config.spread = cold.config.spread = 0.005
    hot.config.newcomer_bonus = cold.config.newcomer_bonus = 0.02
    both = average_scorers([hot, cold]).config
    assert (both.spread, both.newcomer_bonus) == (0.005, 0.02)
    cold.config.newcomer_bonus = None
    with pytest.raises(ForesightError, match=r"different top-k newcomer_bonus defaults \(\(in memory #0\): 0.02, "
                                             r"\(in memory #1\): none\); .*--newcomer-bonus"):
        average_scorers([hot, cold])
    # the default selection likewise (a sampled default beside top-k would be chosen by nobody)
    cold.config.newcomer_bonus = 0.02
    hot.config.selection = cold.config.selection = "sample"
    assert average_scorers([hot, cold]).config.selection == "sample"
    cold.config.selection = None
    with pytest.raises(ForesightError, match=r"different default selections \(\(in memory #0\): sample, "
                                             r"\(in memory #1\): none\); .*--selection"):
        average_scorers([hot, cold])
    # the members' shared training data stays in the provenance (the held-out split names the validation problems)
    for i, m in enumerate(members):
        m.config.provenance = {"heldout_traces": ["a#0", "b#0"], "labels": f"golden_{i}", "steps": 10}
    prov = average_scorers(members, provenance={"average_of": ["x", "y", "z"]}).config.provenance
    assert prov == {"average_of": ["x", "y", "z"], "heldout_traces": ["a#0", "b#0"]}


def _spread_reference(scores: list[float], num_keep: int, spread: float) -> list[int]:
    """Naive spread_keep: evict the lowest (newest among ties) one at a time, raise its cache neighbours."""
    s, gone = list(scores), set()
    for _ in range(len(s) - num_keep):
        j = min((i for i in range(len(s)) if i not in gone), key=lambda i: (s[i], -i))
        gone.add(j)
        if s[j] != float("-inf"):
            for nb in (j - 1, j + 1):
                if 0 <= nb < len(s) and nb not in gone:
                    s[nb] += spread
    return [i for i in range(len(s)) if i not in gone]


def test_spread_keep_equals_a_naive_greedy_and_top_keep_at_zero():
    from foresight.sampling import spread_keep, top_keep

    g = torch.Generator().manual_seed(0)
    for trial in range(30):
        c = int(torch.randint(4, 14, (1,), generator=g))
        k = int(torch.randint(1, c, (1,), generator=g))
        x = (torch.randint(0, 5, (2, 3, c), generator=g).float() / 10)  # many ties
        if trial % 3 == 0:
            x[0, 1, 0] = float("-inf")  # padding
        if trial % 4 == 1:
            x[1, 2, : c // 2] = float("inf")  # protected (sinks): evicted last, newest first, when k needs them
        for spread in (0.0, 0.15, 0.5):
            got = spread_keep(x, k, spread)
            for b in range(2):
                for h in range(3):
                    assert got[b, h].tolist() == _spread_reference(x[b, h].tolist(), k, spread), (trial, spread)
        torch.testing.assert_close(spread_keep(x, k, 0.0), top_keep(x, k).sort(-1).values)
    # near-tied neighbours: plain top-k evicts the span [1, 2], spread evicts one of it and the next lowest
    x = torch.tensor([[[0.9, 0.10, 0.11, 0.5, 0.2, 0.8]]])
    assert spread_keep(x, 4, 0.0).tolist() == [[[0, 3, 4, 5]]]
    assert spread_keep(x, 4, 0.2).tolist() == [[[0, 2, 3, 5]]]


def test_learned_spread_runs_and_refuses_sampling():
    model, tok = get_model("tiny-llama")
    sc = _scorer(model)
    kw = dict(budget=B, interval=W, max_new_tokens=30, stop_on_eos=False)
    res = foresight.generate(model, tok, ["Hello there"], policy=make_policy("learned", scorer=sc, spread=0.05), **kw)
    assert res.stats["evictions"] > 3 and max(res.stats["peak_entries"]) <= B + W
    with pytest.raises(ValueError, match="spread"):
        make_policy("learned", scorer=sc, spread=0.05, selection="sample")
    with pytest.raises(ValueError, match="spread"):
        make_policy("learned", scorer=sc, spread=-1.0)
