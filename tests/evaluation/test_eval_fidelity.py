"""Fidelity evaluation: exact reference values for ``full``, a model whose predictions depend on context
(so eviction must hurt), brute-force metric checks and the CLI (fields, reports, error paths)."""

from __future__ import annotations

import copy
import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from evaluation.fidelity import FIELDS, evaluate_fidelity, pooled_delta_se
from evaluation.fidelity_journal import record_checksum
from foresight.errors import ForesightError
from foresight.cli import main
from tests.conftest import Killed, kill_while_writing, save_random_traces

PERIOD = 6


def _periodic(batch: int, length: int, gen: torch.Generator) -> torch.Tensor:
    """Sequences repeating a random pattern of PERIOD tokens: the next token is a copy from PERIOD back."""
    pats = torch.randint(40, 56, (batch, PERIOD), generator=gen)
    return pats.repeat(1, length // PERIOD + 1)[:, :length]


@pytest.fixture(scope="module")
def copy_model():
    """tiny-llama trained for a few seconds to copy periodic patterns: confident, and only from context."""
    from foresight.tiny_models import build_tiny_model

    model, _ = build_tiny_model("tiny-llama")
    gen = torch.Generator().manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls: one thread is faster, and much faster on a shared CPU
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(100):
        x = _periodic(8, 64, gen)
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    model.eval()
    torch.set_num_threads(threads)
    for p in model.parameters():
        p.requires_grad_(False)
    return model


@pytest.fixture(scope="module")
def copy_traces():
    return _periodic(4, 64, torch.Generator().manual_seed(101)).tolist()


@pytest.fixture(scope="module")
def copy_records(copy_model, copy_traces):
    return evaluate_fidelity(copy_model, copy_traces, ["full", "random", "streaming_llm"], [12, 24], 4)


def _rec(records, policy, budget):
    return next(r for r in records if r["policy"] == policy and r["budget"] == budget)


def test_copy_model_is_confident(copy_records):
    # Without this the ordering test below would be meaningless (near-uniform CE ~ log(261) = 5.6).
    assert _rec(copy_records, "full", 12)["ce_full"] < 0.5


def test_full_is_exact_reference(copy_records):
    for b in (12, 24):
        r = _rec(copy_records, "full", b)
        assert r["loss_ratio"] == pytest.approx(1.0, abs=1e-6)
        assert abs(r["delta_ce"]) < 1e-6
        assert abs(r["kl"]) < 1e-6
        assert r["top1_agreement"] == 1.0


def test_random_eviction_hurts(copy_records):
    # B=12 evicts the token six back (the one to copy) at most events; at B=24 it is mostly kept, and whether the
    # loss grows depends on the draw (loss ratio 0.89-2.42 over seeds 0-5), but the distributions move whatever the draw
    r = _rec(copy_records, "random", 12)
    assert r["loss_ratio"] > 1.5 and r["delta_ce"] > 0 and r["kl"] > 0.01
    assert _rec(copy_records, "random", 24)["kl"] > 0.005


def test_recency_keeps_what_the_copy_task_needs(copy_records):
    # The copy task reads PERIOD tokens back: a recency window of 24 keeps it, random eviction does not.
    s24 = _rec(copy_records, "streaming_llm", 24)
    assert s24["loss_ratio"] < 1.25
    assert s24["loss_ratio"] < _rec(copy_records, "random", 24)["loss_ratio"]


@pytest.mark.parametrize("policy, batch_size, score_from", [("random", 1, 0), ("streaming_llm", 2, 0),
                                                            ("streaming_llm", 1, 31)])
def test_metrics_match_brute_force(copy_model, copy_traces, policy, batch_size, score_from):
    """Recompute CE ratio, KL and top-1 from a plain full forward and a captured evicted replay per trace, over the
    positions from B + W (or from ``score_from`` when it is later)."""
    from foresight.runtime import replay

    budget, interval = 12, 4
    seqs = [copy_traces[0], copy_traces[1][:50]]  # unequal lengths exercise the padding mask
    rec = evaluate_fidelity(copy_model, seqs, [policy], [budget], interval, batch_size=batch_size,
                            score_from=score_from)[0]
    assert rec["score_from"] == max(budget + interval, score_from)
    ce_ev, ce_full, kl, agree, count = 0.0, 0.0, 0.0, 0.0, 0
    per_trace = []  # (CE evicted, CE full, positions) of each trace, as the record keeps them for pooled intervals
    for seq in seqs:
        before = (ce_ev, ce_full, count)
        ids = torch.tensor([seq])
        with torch.no_grad():
            full_lp = torch.log_softmax(copy_model(input_ids=ids).logits.float()[0], -1)
        chunks = []
        replay(copy_model, [seq], policy, budget, interval, on_logits=lambda s, e, lg: chunks.append(lg[0]))
        ev_lp = torch.log_softmax(torch.cat(chunks), -1)
        for i in range(max(budget + interval, score_from), len(seq) - 1):
            t = seq[i + 1]
            ce_ev -= ev_lp[i, t].item()
            ce_full -= full_lp[i, t].item()
            kl += (full_lp[i].exp() * (full_lp[i] - ev_lp[i])).sum().item()
            agree += float(full_lp[i].argmax() == ev_lp[i].argmax())
            count += 1
        per_trace.append((ce_ev - before[0], ce_full - before[1], count - before[2]))
    assert rec["tokens"] == count
    got = list(rec["per_trace_ce"].values())
    assert [n for *_, n in got] == [n for *_, n in per_trace]
    for (ce, cf, _), (ref_ce, ref_cf, _) in zip(got, per_trace):
        assert ce == pytest.approx(ref_ce, rel=1e-4) and cf == pytest.approx(ref_cf, rel=1e-4)
    assert [ce / cf for ce, cf, _ in got] == pytest.approx(list(rec["per_trace_ratio"].values()))
    assert rec["loss_ratio"] == pytest.approx(ce_ev / ce_full, rel=1e-4)
    assert rec["delta_ce"] == pytest.approx((ce_ev - ce_full) / count, abs=1e-4)
    assert rec["kl"] == pytest.approx(kl / count, rel=1e-3, abs=1e-5)
    assert rec["top1_agreement"] == pytest.approx(agree / count)


def test_batching_does_not_change_results(copy_model, copy_traces):
    seqs = [copy_traces[0][:50], copy_traces[2], copy_traces[3][:40]]
    # (random draws per batch, so a deterministic policy is compared)
    one = evaluate_fidelity(copy_model, seqs, ["full", "streaming_llm"], [12], 4, batch_size=1)
    three = evaluate_fidelity(copy_model, seqs, ["full", "streaming_llm"], [12], 4, batch_size=3)
    for a, b in zip(one, three):
        assert a["tokens"] == b["tokens"]
        for k in ("loss_ratio", "kl", "top1_agreement"):
            assert a[k] == pytest.approx(b[k], rel=1e-4, abs=1e-6)


def _crash_after(monkeypatch, calls: int) -> None:
    """Make evaluate_fidelity's replays fail from call ``calls + 1`` on (a killed run)."""
    import evaluation.fidelity as fidelity

    real, seen = fidelity.replay, []

    def replay(*args, **kwargs):
        seen.append(1)
        if len(seen) > calls:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(fidelity, "replay", replay)


def test_a_killed_run_resumes_to_the_uninterrupted_numbers(copy_model, copy_traces, tmp_path, monkeypatch):
    """Batches finished before the crash are read back, the rest replayed (sampled draws included: the policy
    re-seeds per replay); the records equal an uninterrupted run's exactly, and a cut last line is replayed."""
    import evaluation.fidelity as fidelity

    args = (copy_model, copy_traces, ["random", "streaming_llm"], [12], 4)
    want = evaluate_fidelity(*args)
    journal = tmp_path / "j.jsonl"
    with monkeypatch.context() as m:
        _crash_after(m, 7)  # 3 replays per batch (full + 2 policies): batches 0 and 1 finish
        with pytest.raises(KeyboardInterrupt):
            evaluate_fidelity(*args, journal=journal)
    assert len(journal.read_text().splitlines()) == 3  # the header and two batches
    with open(journal, "a") as fh:
        fh.write('{"start": 2, "poli')  # the crash cut a line short
    calls = []
    real = fidelity.replay
    monkeypatch.setattr(fidelity, "replay", lambda *a, **k: calls.append(1) or real(*a, **k))
    got = evaluate_fidelity(*args, journal=journal)
    assert len(calls) == 6  # batches 2 and 3 only
    assert got == want


def test_ranks_share_the_batches_and_one_process_sums_them_to_the_unsharded_numbers(copy_model, copy_traces,
                                                                                      tmp_path, monkeypatch):
    """Two ranks replay disjoint batches into their own journal files; the first to finish returns None, the last
    (or a later run in one process) replays nothing and returns an unsharded run's records exactly."""
    import evaluation.fidelity as fidelity

    args = (copy_model, copy_traces, ["random", "streaming_llm"], [12], 4)
    want = evaluate_fidelity(*args)
    journal = tmp_path / "j.jsonl"
    real, starts = fidelity.replay, []

    def replay(model, seqs, policy, *a, **k):
        starts.append(copy_traces.index(seqs[0]))
        return real(model, seqs, policy, *a, **k)

    monkeypatch.setattr(fidelity, "replay", replay)
    assert evaluate_fidelity(*args, journal=journal, rank=1, world_size=2) is None  # rank 0's batches missing
    assert sorted(set(starts)) == [1, 3] and len(starts) == 6  # batches 1 and 3, three replays each
    starts.clear()
    assert evaluate_fidelity(*args, journal=journal, rank=0, world_size=2) == want  # the last rank sums them all
    assert sorted(set(starts)) == [0, 2] and len(starts) == 6
    assert sorted(f.name for f in tmp_path.iterdir()) == ["j.rank0of2.jsonl", "j.rank1of2.jsonl"]
    starts.clear()
    assert evaluate_fidelity(*args, journal=journal) == want and starts == []  # one process: nothing replayed
    with pytest.raises(ForesightError, match="needs a journal"):
        evaluate_fidelity(*args, rank=0, world_size=2)
    with pytest.raises(ForesightError, match="rank 2 of world size 2"):
        evaluate_fidelity(*args, journal=journal, rank=2, world_size=2)


def test_a_journal_of_other_inputs_is_refused(copy_model, copy_traces, tmp_path, monkeypatch):
    journal = tmp_path / "j.jsonl"
    with monkeypatch.context() as m:
        _crash_after(m, 4)
        with pytest.raises(KeyboardInterrupt):
            evaluate_fidelity(copy_model, copy_traces, ["random"], [12], 4, journal=journal)
    before = journal.read_text()
    with pytest.raises(ForesightError, match="plan differs"):
        evaluate_fidelity(copy_model, copy_traces, ["random"], [12], 4, journal=journal,
                          policy_kwargs={"random": {"seed": 3}})
    with pytest.raises(ForesightError, match="tokens differs"):
        evaluate_fidelity(copy_model, [copy_traces[1], *copy_traces[1:]], ["random"], [12], 4, journal=journal)
    with pytest.raises(ForesightError, match="batch_size differs"):
        evaluate_fidelity(copy_model, copy_traces, ["random"], [12], 4, journal=journal, batch_size=2)
    assert journal.read_text() == before  # refused before anything is written
    with pytest.raises(ForesightError, match="dtype differs"):  # sums of fp32 weights mixed with bf16 ones
        evaluate_fidelity(copy.deepcopy(copy_model).to(torch.bfloat16), copy_traces, ["random"], [12], 4,
                          journal=journal)
    header, first = before.splitlines()[:2]
    moved = {**json.loads(first), "start": 1}  # batch 0's sums, moved by hand to batch 1: reused as its traces' before
    journal.write_text("\n".join([header, json.dumps(moved)]) + "\n")
    with pytest.raises(ForesightError, match="line 2 was changed since it was written"):  # its checksum tells
        evaluate_fidelity(copy_model, copy_traces, ["random"], [12], 4, journal=journal)
    moved["sha256"] = record_checksum(moved)  # a checksum made anew: the record is still not batch 1's
    journal.write_text("\n".join([header, json.dumps(moved)]) + "\n")
    with pytest.raises(ForesightError, match="batch starting at trace 1 holds a row of random@12 that is not one of"):
        evaluate_fidelity(copy_model, copy_traces, ["random"], [12], 4, journal=journal)
    journal.write_text(header + '\n{"note": 1}\n')  # valid JSON, not a record: was a KeyError (exit 1)
    with pytest.raises(ForesightError, match="line 2 is not a batch record"):
        evaluate_fidelity(copy_model, copy_traces, ["random"], [12], 4, journal=journal)
    journal.write_text("not json\n")
    with pytest.raises(ForesightError, match="not a fidelity journal"):
        evaluate_fidelity(copy_model, copy_traces, ["random"], [12], 4, journal=journal)


def _golden_dir(path, labels: dict, alpha_scale: float = 1.0):
    """A `foresight golden` output directory (plan, shards, manifests) holding ``labels``, alphas scaled."""
    from golden.labels import EventLabel, TraceLabels, save_labels
    from golden.pipeline import GOLDEN_OUTPUT
    from golden.sharding import atomic_output, ensure_plan, shard_path

    ids = sorted(labels)
    units = [{"shard": f"labels-{u:05d}.safetensors", "trace_ids": ids[i : i + 2]}
             for u, i in enumerate(range(0, len(ids), 2))]
    ensure_plan(path, {"kind": "foresight-golden", "units": units}, "golden labels", (), GOLDEN_OUTPUT)
    for unit in units:
        with atomic_output(shard_path(path, unit["shard"])) as tmp:
            save_labels(tmp, [TraceLabels(t, labels[t].budget, labels[t].interval, labels[t].fingerprint,
                                          [EventLabel(e.end, e.candidates, e.alpha * alpha_scale, e.evicted)
                                           for e in labels[t].events], labels[t].token_hash) for t in unit["trace_ids"]])
    return path


@pytest.mark.parametrize("where", ["directories", "in memory"])
def test_a_journal_of_other_golden_labels_is_refused(copy_model, copy_traces, tmp_path, monkeypatch, where):
    """Golden labels re-made for the same traces (another alpha, model adapter, ...) have the same trace ids and
    count, so the journal's plan once read the same for both: labels B resumed labels A's journal and mixed
    their sums. The labels' content digest (a shard's recorded digest, else the event tensors) now tells them
    apart."""
    import golden.labels
    from golden.labels import labels_digest, load_labels
    from golden.oracle import label_trace

    ids = [f"t{i}" for i in range(len(copy_traces))]
    made = {i: label_trace(copy_model, torch.tensor([s]), 12, 4, trace_id=i) for i, s in zip(ids, copy_traces)}
    a, b = _golden_dir(tmp_path / "a", made), _golden_dir(tmp_path / "b", made, alpha_scale=0.5)
    if where == "in memory":
        a, b = load_labels(a), load_labels(b)
        for labs in (a, b):
            for lab in labs.values():
                lab.source = None
    else:
        with monkeypatch.context() as m:  # a shard's recorded digest: its labels are not hashed again
            m.setattr(golden.labels, "_events_digest", lambda lab: pytest.fail("re-hashed a recorded shard"))
            assert labels_digest(load_labels(a)) != labels_digest(load_labels(b))
    journal = tmp_path / "j.jsonl"

    def run(labels):
        return evaluate_fidelity(copy_model, copy_traces, ["golden"], [12], 4, trace_ids=ids, journal=journal,
                                 policy_kwargs={"golden": {"labels": labels}})

    with monkeypatch.context() as m:
        _crash_after(m, 2)  # full + golden per batch: batch 0 finishes
        with pytest.raises(KeyboardInterrupt):
            run(a)
    before = journal.read_text()
    with pytest.raises(ForesightError, match="plan differs"):
        run(b)
    assert journal.read_text() == before
    run(a)  # the same labels resume


def test_short_traces_give_no_tokens(tiny_llama):
    model, _ = tiny_llama
    rec = evaluate_fidelity(model, [[5] * 20], ["random"], [16], 8)[0]
    assert rec["tokens"] == 0 and math.isnan(rec["loss_ratio"])


# ---- CLI --------------------------------------------------------------------------------------------------------


@pytest.fixture
def trace_dir(tmp_path, tiny_llama):
    """A tiny traces dataset with the columns of golden.traces.load_traces."""
    save_random_traces(tiny_llama[0], tmp_path / "traces", (90, 120, 75))
    return tmp_path / "traces"


def test_cli_writes_documented_outputs(trace_dir, tmp_path, capsys):
    out = tmp_path / "fid"
    rc = main(["eval", "fidelity", "--model", "tiny-llama", "--traces", str(trace_dir), "--policies",
               "full,random,streaming_llm", "--budget", "24,48", "--interval", "8", "--out", str(out), "--quiet",
               "--policy-arg", "random.seed=3"])
    assert rc == 0
    records = json.loads((out / "fidelity.json").read_text())
    assert len(records) == 6
    for r in records:
        assert set(FIELDS) <= set(r)
        assert r["interval"] == 8 and r["tokens"] > 0
    assert next(r for r in records if r["policy"] == "random")["policy_config"] == {"seed": 3}
    md = (out / "fidelity.md").read_text()
    assert "| 24 | 25% |" in md  # budget as tokens and as % of the mean trace length (95)
    # each budget block is sorted best quality (lowest loss ratio) first; full sits at 1.0 (random eviction on random
    # traces of a random model can land on either side of it, depending on the draw)
    lines = [ln for ln in md.splitlines() if ln.startswith("| 24 ")]
    ratios = [float(ln.split("|")[4]) for ln in lines]
    assert len(lines) == 3 and ratios == sorted(ratios) and any("| full | 1.0000 |" in ln for ln in lines)
    assert (out / "fidelity.png").read_bytes()[:4] == b"\x89PNG"
    assert not (out / "fidelity.partial.jsonl").exists()  # the journal goes once the results are written
    assert "sinks" not in md


def test_cli_ranks_journal_and_one_process_writes_the_unsharded_results(trace_dir, tmp_path, capsys, monkeypatch):
    import evaluation.fidelity as fidelity

    args = ["eval", "fidelity", "--model", "tiny-llama", "--traces", str(trace_dir), "--policies", "full,random,h2o",
            "--budget", "24", "--interval", "8", "--quiet"]
    assert main([*args, "--out", str(tmp_path / "one")]) == 0
    out = tmp_path / "two"
    for rank in (1, 0):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        assert main([*args, "--out", str(out)]) == 0
        assert f"rank {rank}/2: my batches are journalled" in capsys.readouterr().out
        assert not (out / "fidelity.json").exists()  # the ranks write no results, the last one neither
    assert sorted(f.name for f in out.glob("fidelity.partial*")) == ["fidelity.partial.rank0of2.jsonl",
                                                                     "fidelity.partial.rank1of2.jsonl"]
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    monkeypatch.setattr(fidelity, "replay", lambda *a, **k: pytest.fail("the run in one process replayed a batch"))
    assert main([*args, "--out", str(out)]) == 0
    records = [json.loads((d / "fidelity.json").read_text()) for d in (tmp_path / "one", out)]
    assert records[0] == records[1] and len(records[0]) == 3
    assert not list(out.glob("fidelity.partial*"))  # every rank's journal goes once the results are written


def test_cli_score_from_puts_every_budget_on_the_same_positions(trace_dir, tmp_path):
    """--score-from 56 (the larger B + W): both budgets score the same positions, the same count of them."""
    out = tmp_path / "fid"
    rc = main(["eval", "fidelity", "--model", "tiny-llama", "--traces", str(trace_dir), "--policies", "random",
               "--budget", "24,48", "--interval", "8", "--score-from", "56", "--out", str(out), "--quiet"])
    assert rc == 0
    records = json.loads((out / "fidelity.json").read_text())
    assert [r["score_from"] for r in records] == [56, 56]
    assert records[0]["tokens"] == records[1]["tokens"] > 0
    assert {t: n for t, (_, _, n) in records[0]["per_trace_ce"].items()} == \
        {t: n for t, (_, _, n) in records[1]["per_trace_ce"].items()}


def test_cli_report_names_the_attention_sinks(trace_dir, tmp_path):
    """With --sinks the markdown report read exactly as one without: the numbers of another cache, unnamed."""
    out = tmp_path / "fid"
    assert main(["eval", "fidelity", "--model", "tiny-llama", "--traces", str(trace_dir), "--policies", "h2o",
                 "--budget", "24", "--interval", "8", "--sinks", "4", "--out", str(out), "--quiet"]) == 0
    assert "- interval W = 8; attention sinks S = 4 (never evicted); mean trace length" in (out / "fidelity.md"
                                                                                          ).read_text()


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--policies", "full,nope", "--budget", "24"], "unknown policy 'nope'"),
        (["--policies", "learned", "--budget", "24"], "needs --scorer"),
        (["--policies", "golden", "--budget", "24"], "needs --golden"),
        (["--policies", "random", "--budget", "abc"], "bad budget 'abc'"),
        (["--policies", "random", "--budget", "8"], "larger than the interval"),
        (["--policies", "random", "--budget", "24", "--limit", "0"], "--limit"),
    ],
)
def test_cli_error_paths(trace_dir, tmp_path, capsys, extra, message):
    rc = main(["eval", "fidelity", "--model", "tiny-llama", "--traces", str(trace_dir), "--interval", "8",
               "--out", str(tmp_path / "x"), *extra])
    assert rc == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("extra, message", [
    (["--policies", "full,paged", "--policy-arg", "paged.block_size=3"], "block_size (3) must divide the interval"),
    (["--policies", "full,h2o", "--policy-arg", "h2o.bogus=1"], "policy 'h2o' has no hyperparameter(s) bogus"),
    (["--policies", "full,h2o", "--sinks", "17"], "--budget 24 --interval 8 --sinks 17: sinks must be in"),
], ids=["paged-block", "unknown-key", "sinks"])
def test_cli_refuses_policy_and_cache_settings_before_the_model_loads(trace_dir, tmp_path, capsys, monkeypatch,
                                                                       extra, message):
    import foresight

    monkeypatch.setattr(foresight, "load_model", lambda *a, **k: pytest.fail("the model loaded"))
    rc = main(["eval", "fidelity", "--model", "tiny-llama", "--traces", str(trace_dir), "--budget", "24,48",
               "--interval", "8", "--out", str(tmp_path / "x"), *extra])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err and message in err, err


def test_cli_refuses_an_output_path_that_is_a_file(trace_dir, tmp_path, capsys):
    (tmp_path / "file").write_text("")
    rc = main(["eval", "fidelity", "--model", "tiny-llama", "--traces", str(trace_dir), "--policies", "random",
               "--budget", "24", "--interval", "8", "--out", str(tmp_path / "file")])
    assert rc == 2
    assert "exists and is not a directory" in capsys.readouterr().err


def test_cli_rejects_traces_of_another_model(trace_dir, tmp_path, capsys):
    rc = main(["eval", "fidelity", "--model", "tiny-qwen3", "--traces", str(trace_dir), "--policies", "random",
               "--budget", "24", "--interval", "8", "--out", str(tmp_path / "x")])
    assert rc == 2
    assert "another model" in capsys.readouterr().err


# ---- golden ------------------------------------------------------------------------------------------------------


def test_golden_beats_random_on_the_copy_task(copy_model, copy_traces):
    from golden.oracle import label_trace

    ids = [f"t{i}" for i in range(len(copy_traces))]
    labels = {i: label_trace(copy_model, torch.tensor([s]), 12, 4, trace_id=i) for i, s in zip(ids, copy_traces)}
    recs = evaluate_fidelity(copy_model, copy_traces, ["golden", "random"], [12], 4, trace_ids=ids,
                             policy_kwargs={"golden": {"labels": labels}})
    golden, rand = _rec(recs, "golden", 12), _rec(recs, "random", 12)
    assert golden["loss_ratio"] < rand["loss_ratio"]
    assert golden["kl"] < rand["kl"]


def test_cli_golden_labels_per_budget(trace_dir, tmp_path, capsys, tiny_llama):
    from golden.labels import save_labels
    from golden.oracle import label_trace
    from golden.traces import load_traces

    model, _ = tiny_llama
    ds = load_traces(trace_dir)
    labels = [label_trace(model, torch.tensor([r["input_ids"]]), 24, 8, trace_id=r["trace_id"]) for r in ds]
    (tmp_path / "golden").mkdir()
    save_labels(tmp_path / "golden" / "b24.safetensors", labels)
    out = tmp_path / "fid"
    args = ["eval", "fidelity", "--model", "tiny-llama", "--traces", str(trace_dir), "--policies", "golden,full",
            "--interval", "8", "--golden", str(tmp_path / "golden"), "--out", str(out), "--quiet"]
    assert main([*args, "--budget", "24,48"]) == 2  # no labels for B=48: an error naming both, not a dropped row
    assert "made for B=24 W=8, not B=48 W=8" in capsys.readouterr().err
    assert main([*args, "--budget", "24"]) == 0
    records = json.loads((out / "fidelity.json").read_text())
    assert sorted((r["policy"], r["budget"]) for r in records) == [("full", 24), ("golden", 24)]
    # a second set under the root labelling the same traces at that B and W: refused, not the later set taken
    save_labels(tmp_path / "golden" / "copy.safetensors", labels)
    assert main([*args, "--budget", "24", "--out", str(tmp_path / "fid2")]) == 2
    err = capsys.readouterr().err.strip()
    assert "labelled in both" in err and "b24.safetensors" in err and "copy.safetensors" in err
    assert len(err.splitlines()) == 1 and not (tmp_path / "fid2").exists()


def test_cli_names_the_traces_a_budget_leaves_out(trace_dir, tmp_path, capsys):
    """A trace too short to reach a budget's first eviction is left out of that budget's numbers; the report says
    so beside the budget (it said only "3 traces", so the B=72 row read as measured on all of them)."""
    out = tmp_path / "fid"
    assert main(["eval", "fidelity", "--model", "tiny-llama", "--traces", str(trace_dir), "--policies", "random",
                 "--budget", "24,72", "--interval", "8", "--out", str(out), "--quiet"]) == 0
    records = {r["budget"]: r for r in json.loads((out / "fidelity.json").read_text())}
    assert records[24]["traces"] == 3 and records[72]["traces"] == 2  # the 75-token trace: 75 <= 72 + 8 + 1
    md = (out / "fidelity.md").read_text()
    assert "B=72: 1 of 3 traces" in md and "B=24:" not in md


def test_duplicate_trace_ids_are_refused(copy_model, copy_traces):
    """Per-trace ratios are keyed by trace id: two traces under one id kept one ratio, so mean_trace_ratio and every
    paired comparison silently dropped a trace. Refused before any compute, naming the id."""
    with pytest.raises(ForesightError, match="trace id 'a' appears 2 times"):
        evaluate_fidelity(copy_model, copy_traces[:3], ["random"], [12], 4, trace_ids=["a", "b", "a"])


# ---- a finished --out of another evaluation -----------------------------------------------------------------------


def _fid_args(trace_dir, out, *extra):
    return ["eval", "fidelity", "--model", "tiny-llama", "--traces", str(trace_dir), "--policies", "full,random",
            "--budget", "24", "--out", str(out), "--quiet", *extra]


@pytest.mark.parametrize("change", [["--interval", "16"], ["--interval", "8", "--policy-arg", "random.seed=4"],
                                    ["--interval", "8", "--policy-arg", "random.seed=3", "--batch-size", "2"]],
                         ids=["interval", "policy-arg", "batch-size"])
def test_cli_refuses_the_finished_out_of_another_evaluation(trace_dir, tmp_path, capsys, monkeypatch, change):
    """A rerun into a --out holding another evaluation's finished results overwrote them without a word: now one
    line naming fidelity.json and the setting that differs, exit 2, before the model loads, the results untouched."""
    import foresight

    out = tmp_path / "fid"
    assert main(_fid_args(trace_dir, out, "--interval", "8", "--policy-arg", "random.seed=3")) == 0
    capsys.readouterr()
    before = {f.name: f.read_bytes() for f in out.iterdir()}
    monkeypatch.setattr(foresight, "load_model", lambda *a, **k: pytest.fail("the model loaded"))
    assert main(_fid_args(trace_dir, out, *change)) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and "holds the results of another evaluation" in err[0]
    assert str(out / "fidelity.json") in err[0]
    want = {"interval": "interval 8, this run 16", "policy-arg": 'policy_args {"full": {}, "random": {"seed": 3}}',
            "batch-size": "batch_size 1, this run 2"}
    assert sum(w in err[0] for w in want.values()) == 1
    assert {f.name: f.read_bytes() for f in out.iterdir()} == before


def test_cli_reruns_the_same_evaluation_into_its_out(trace_dir, tmp_path, capsys):
    out = tmp_path / "fid"
    args = _fid_args(trace_dir, out, "--interval", "8", "--policy-arg", "random.seed=3")
    assert main(args) == 0
    first = json.loads((out / "fidelity.json").read_text())
    (out / "fidelity.json").write_text(json.dumps(first[:1]))  # rewritten by the rerun
    assert main(args) == 0
    assert json.loads((out / "fidelity.json").read_text()) == first
    assert json.loads((out / "settings.json").read_text())["policy_args"] == {"full": {}, "random": {"seed": 3}}


@pytest.mark.parametrize("damage", ["corrupt", "no settings"])
def test_cli_refuses_an_out_whose_fidelity_json_is_unreadable(trace_dir, tmp_path, capsys, damage):
    from evaluation.report import FIDELITY_OUTPUT
    from foresight.outputs import write_marker

    out = tmp_path / "fid"
    out.mkdir()
    write_marker(out, FIDELITY_OUTPUT)  # an earlier evaluation's directory, its results damaged
    (out / "fidelity.json").write_text('[{"policy": ' if damage == "corrupt" else "[]\n")
    before = (out / "fidelity.json").read_bytes()
    assert main(_fid_args(trace_dir, out, "--interval", "8")) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and str(out / "fidelity.json") in err[0]
    assert (out / "fidelity.json").read_bytes() == before and not (out / "fidelity.md").exists()


def test_cli_compares_policy_args_with_the_records_of_older_runs(trace_dir, tmp_path, capsys):
    """Runs before settings.json recorded policy_args: the policy_config of its records is compared instead."""
    out = tmp_path / "fid"
    assert main(_fid_args(trace_dir, out, "--interval", "8", "--policy-arg", "random.seed=3")) == 0
    settings = json.loads((out / "settings.json").read_text())
    del settings["policy_args"], settings["scorer_sha256"]
    (out / "settings.json").write_text(json.dumps(settings))
    capsys.readouterr()
    assert main(_fid_args(trace_dir, out, "--interval", "8", "--policy-arg", "random.seed=4")) == 2
    err = capsys.readouterr().err
    assert "random.seed 3, this run 4" in err and str(out / "fidelity.json") in err
    assert main(_fid_args(trace_dir, out, "--interval", "8", "--policy-arg", "random.seed=3")) == 0


def test_cli_refuses_a_finished_out_of_another_model_fingerprint(trace_dir, tmp_path, capsys):
    """The same arguments with another adapter (or other weights under one name) give another fingerprint, which is
    known once the model loads: refused then, before any compute, the results untouched."""
    from evaluation.cli.eval import _check_finished_out

    out = tmp_path / "fid"
    assert main(_fid_args(trace_dir, out, "--interval", "8")) == 0
    settings = json.loads((out / "settings.json").read_text())
    now = {k: settings[k] for k in ("model", "traces", "num_traces", "policies", "budgets", "interval", "sinks",
                                    "scorer", "scorer_sha256", "golden", "policy_args", "batch_size", "ref_dtype")}
    _check_finished_out(out, now)  # before the model loads: the same evaluation
    _check_finished_out(out, {**now, "fingerprint": settings["fingerprint"]})
    other = {**settings["fingerprint"], "adapter": {"path": "some/adapter", "sha256": "0" * 64}}
    with pytest.raises(ForesightError, match="fingerprint"):
        _check_finished_out(out, {**now, "fingerprint": other})


def test_cli_reruns_into_its_out_with_the_traces_spelled_another_way(trace_dir, tmp_path, capsys, monkeypatch):
    """The traces were compared as typed: the same folder given relative and then absolute was refused as another
    evaluation. Spellings of one folder are the same evaluation; another folder is still refused."""
    out = tmp_path / "fid"
    monkeypatch.chdir(trace_dir.parent)
    assert main(_fid_args(Path(trace_dir.name), out, "--interval", "8")) == 0
    first = json.loads((out / "fidelity.json").read_text())
    assert main(_fid_args(trace_dir.resolve(), out, "--interval", "8")) == 0
    assert main(_fid_args(f"./{trace_dir.name}/", out, "--interval", "8")) == 0
    assert json.loads((out / "fidelity.json").read_text()) == first
    capsys.readouterr()
    other = tmp_path / "other_traces"
    shutil.copytree(trace_dir, other)
    assert main(_fid_args(other, out, "--interval", "8")) == 2
    assert "traces" in capsys.readouterr().err


def test_golden_with_attention_sinks_is_refused_before_any_replay(copy_model, copy_traces, monkeypatch):
    """Labels are made without sinks: with --sinks the golden replay diverged at its first event and failed with
    "labels ... do not match the replayed cache", after the full-cache and every other policy's replays."""
    import evaluation.fidelity as fidelity
    from golden.oracle import label_trace

    ids = [f"t{i}" for i in range(len(copy_traces))]
    labels = {i: label_trace(copy_model, torch.tensor([s]), 12, 4, trace_id=i) for i, s in zip(ids, copy_traces)}
    calls = []
    real = fidelity.replay
    monkeypatch.setattr(fidelity, "replay", lambda *a, **k: calls.append(1) or real(*a, **k))
    with pytest.raises(ForesightError, match="'golden' replays labels made without attention sinks.*not 2"):
        evaluate_fidelity(copy_model, copy_traces, ["h2o", "golden"], [12], 4, trace_ids=ids, sinks=2,
                          policy_kwargs={"golden": {"labels": labels}})
    assert not calls


def test_report_orders_by_loss_ratio_then_kl_with_nan_last():
    from evaluation.report import _quality_key

    recs = [{"policy": p, "loss_ratio": lr, "kl": kl} for p, lr, kl in
            [("nan_kl", 1.1, float("nan")), ("small_kl", 1.1, 0.2), ("best", 1.05, 0.9), ("nan_lr", float("nan"), 0.1)]]
    assert [r["policy"] for r in sorted(recs, key=_quality_key)] == ["best", "small_kl", "nan_kl", "nan_lr"]


def test_a_run_killed_while_writing_its_results_resumes(trace_dir, tmp_path, monkeypatch):
    """A kill -9 in the write of fidelity.json leaves no torn fidelity.json that every rerun refuses as finished
    results: the rerun finishes from the journal with the uninterrupted run's records."""
    args = ["eval", "fidelity", "--model", "tiny-llama", "--traces", str(trace_dir), "--policies", "h2o",
            "--budget", "24", "--interval", "8", "--quiet"]
    assert main([*args, "--out", str(tmp_path / "full")]) == 0
    out = tmp_path / "cut"
    with monkeypatch.context() as m:
        kill_while_writing(m, "fidelity.json")
        with pytest.raises(Killed):
            main([*args, "--out", str(out)])
    assert (out / "fidelity.partial.jsonl").exists()
    assert main([*args, "--out", str(out)]) == 0
    assert not (out / "fidelity.partial.jsonl").exists()
    full = json.loads((tmp_path / "full" / "fidelity.json").read_text())
    assert json.loads((out / "fidelity.json").read_text()) == full


def test_delta_ce_se_is_the_pooled_ratio_estimators_error():
    """ΔCE is pooled over tokens, so its error weighs each trace by its scored tokens: a hand-computed example, and
    traces of equal length give the plain standard error of the per-trace means."""
    # r = 2/100; residuals 2 - 0.2 and 0 - 1.8; sqrt(2/1 * 2 * 1.8^2) / 100 (the per-trace-mean SE would be 0.1)
    assert pooled_delta_se([(2.0, 10), (0.0, 90)]) == pytest.approx(0.036)
    rows = [(1.0, 50), (3.0, 50), (-0.5, 50), (2.0, 50)]
    means = [d / n for d, n in rows]
    m = sum(means) / len(means)
    plain = (sum((x - m) ** 2 for x in means) / (len(means) - 1) / len(means)) ** 0.5
    assert pooled_delta_se(rows) == pytest.approx(plain)
    assert math.isnan(pooled_delta_se([(1.0, 10)]))


def test_batches_are_formed_longest_first_and_records_keep_the_given_order(copy_model, copy_traces, monkeypatch):
    """Traces are replayed in batches of similar lengths (the longest first, the short batch where it pads least:
    the batches of :func:`foresight.runtime.length_batches`), and the records list every trace in the order given,
    with the values an unbatched evaluation gives."""
    import evaluation.fidelity as fidelity

    seqs = [copy_traces[0][:40], copy_traces[1], copy_traces[2][:50], copy_traces[3][:45]]
    ids = ["a", "b", "c", "d"]
    real, widths = fidelity.replay, []

    def replay(model, batch, *args, **kwargs):
        widths.append([len(s) for s in batch])
        return real(model, batch, *args, **kwargs)

    monkeypatch.setattr(fidelity, "replay", replay)
    two = evaluate_fidelity(copy_model, seqs, ["streaming_llm"], [12], 4, batch_size=2, trace_ids=ids)[0]
    assert widths == [[64, 50]] * 2 + [[45, 40]] * 2  # per batch: the full replay, then the policy's
    # five traces in batches of two: the short batch between the full ones pads least (sorted runs of two, the
    # short one last, would replay [64, 64], [60, 30], [30])
    five, five_ids = [copy_traces[0][:30], copy_traces[1], copy_traces[2][:60], copy_traces[3][:30], copy_traces[0]], \
        ["a", "b", "c", "d", "e"]
    widths.clear()
    evaluate_fidelity(copy_model, five, ["streaming_llm"], [12], 4, batch_size=2, trace_ids=five_ids)
    assert widths == [[64, 64]] * 2 + [[60]] * 2 + [[30, 30]] * 2
    monkeypatch.setattr(fidelity, "replay", real)
    one = evaluate_fidelity(copy_model, seqs, ["streaming_llm"], [12], 4, batch_size=1, trace_ids=ids)[0]
    assert list(two["per_trace_ratio"]) == list(two["per_trace_ce"]) == ids
    assert list(two["per_trace_ratio"].values()) == pytest.approx(list(one["per_trace_ratio"].values()), rel=1e-5)
    assert two["mean_trace_ratio"] == pytest.approx(one["mean_trace_ratio"], rel=1e-5)


def test_a_journal_of_trace_order_batches_is_refused(copy_model, copy_traces, tmp_path, monkeypatch):
    """A journal whose batches were cut in trace order (written before batches went longest first) holds sums of
    other batches: refused, naming the key, before anything is written."""
    journal = tmp_path / "j.jsonl"
    with monkeypatch.context() as m:
        _crash_after(m, 2)
        with pytest.raises(KeyboardInterrupt):
            evaluate_fidelity(copy_model, copy_traces, ["random"], [12], 4, journal=journal, batch_size=2)
    header, *rest = journal.read_text().splitlines()
    head = json.loads(header)
    assert head["identity"].pop("batches") == "longest first"
    journal.write_text("\n".join([json.dumps(head), *rest]) + "\n")
    before = journal.read_text()
    with pytest.raises(ForesightError, match=r"\(batches differs\)"):
        evaluate_fidelity(copy_model, copy_traces, ["random"], [12], 4, journal=journal, batch_size=2)
    assert journal.read_text() == before
