"""Label a trace directory with Golden Eviction, resumably and sharded across ranks (``foresight golden``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

from foresight.errors import ForesightError
from foresight.fingerprint import check_same_model, weights_dtype
from foresight.limits import check_context
from foresight.models import model_fingerprint
from foresight.runtime import CacheConfig
from golden.labels import LabelMismatchError, check_label_tokens, read_label_file, save_labels
from golden.oracle import check_measure, label_trace
from golden.sharding import (
    atomic_output,
    check_shard,
    clean_stale,
    ensure_plan,
    my_units,
    rank_world,
    shard_path,
    sharded_output,
    unfinished_shards,
)
from golden.traces import load_traces

PLAN_KIND = "foresight-golden"
GOLDEN_OUTPUT = sharded_output("golden")


@dataclass
class LabelSummary:
    """What one ``label_traces`` call did (this rank's share)."""

    out_dir: Path
    planned: int  # traces with labels in the plan (all ranks)
    skipped: int  # traces of at most B+W tokens: no eviction before they end
    labelled_now: int  # traces this call labelled
    shards_done: int  # finished shards (all ranks) after this call
    shards_total: int


def _shard_name(index: int) -> str:
    return f"labels-{index:05d}.safetensors"


def label_traces(
    model,
    traces: str | Path,
    out_dir: str | Path,
    budget: int,
    interval: int,
    *,
    traces_per_shard: int = 4,
    limit: int | None = None,
    allow_other_model: bool = False,
    chunk: int | None = None,
    measure: str = "attention",
    progress: bool = True,
) -> LabelSummary:
    """Write Golden Eviction labels for the traces in ``traces`` to ``out_dir``.

    Traces of at most ``B + W`` tokens are skipped (counted in the summary): no eviction happens before they
    end. ``measure`` is the oracle's (:data:`golden.oracle.MEASURES`), recorded in the plan when it is not the
    default. Rerunning finishes the remaining shards; rerunning with another model, B, W or measure into the same
    directory raises :class:`ForesightError`, and so does rerunning with other traces under the same ids (a
    finished shard's token hashes differ).
    """
    CacheConfig(budget, interval)  # validates B > W > 0
    check_measure(measure)
    if traces_per_shard < 1:
        raise ValueError(f"traces_per_shard must be >= 1, got {traces_per_shard}")
    ds = load_traces(traces)
    if limit is not None:
        ds = ds.select(range(min(limit, len(ds))))
    fp = model_fingerprint(model)
    if not allow_other_model and "fingerprint" in ds.column_names:
        for other in sorted(set(ds["fingerprint"])):
            check_same_model(other, fp, f"traces in {traces}",
                             fix="label them with that model (or pass --allow-other-model)")
    ids, lengths = ds["trace_id"], [len(x) for x in ds["input_ids"]]
    if len(set(ids)) != len(ids):
        raise ForesightError(f"duplicate trace ids in {traces}")
    check_context(model, max(lengths, default=0), f"the longest trace of {traces}",
                  "label traces made by this model")  # before anything is written
    keep = [i for i, n in enumerate(lengths) if n > budget + interval]
    if not keep:  # an --out without labels, which every reader then calls "no finished label shards yet"
        raise ForesightError(f"--traces {traces}: all {len(ids)} trace(s) have at most B+W={budget + interval} tokens "
                             f"(the longest {max(lengths, default=0)}), so no eviction happens before they end and "
                             "there is nothing to label; use a smaller --budget / --interval or longer traces")
    skipped = len(ids) - len(keep)
    units = [keep[i : i + traces_per_shard] for i in range(0, len(keep), traces_per_shard)]
    plan = {
        "kind": PLAN_KIND,
        "version": 2,  # 2: shards record token hashes (golden.labels.FORMAT); a /1 directory is not resumed
        "fingerprint": fp,
        "budget": budget,
        "interval": interval,
        "traces": str(Path(traces).resolve()),
        "skipped": [ids[i] for i in range(len(ids)) if lengths[i] <= budget + interval],
        "units": [{"shard": _shard_name(u), "trace_ids": [ids[i] for i in unit]} for u, unit in enumerate(units)],
        **weights_dtype(model),  # a resume in another precision would label other shards with other evictions
        **({} if measure == "attention" else {"measure": measure}),  # absent: the method's (plans before it)
    }
    out = Path(out_dir)
    rank, world = rank_world()  # before anything is written
    ensure_plan(out, plan, "golden labels", ("version", "fingerprint", "budget", "interval", "units", "dtype", "measure"),
                GOLDEN_OUTPUT, units_from="--traces, --limit, --traces-per-shard, --budget and --interval")
    mine = my_units(len(units), rank, world)
    clean_stale(out, [_shard_name(u) for u in mine])
    redo = set(unfinished_shards(out, [_shard_name(u) for u in mine]))  # missing or damaged since written
    todo = [u for u in mine if _shard_name(u) in redo]
    for u in mine:  # a finished shard is skipped only when it labels these very traces (ids say nothing of tokens)
        if u not in todo:
            done = read_label_file(shard_path(out, _shard_name(u)))
            missing = [ids[i] for i in units[u] if ids[i] not in done]
            if missing:
                raise LabelMismatchError(f"{shard_path(out, _shard_name(u))} holds no labels of trace {missing[0]!r} "
                                         f"of {traces}; it was labelled from other traces: choose another --out")
            try:
                check_label_tokens(done, ((ids[i], ds[i]["input_ids"]) for i in units[u]))
            except LabelMismatchError as exc:
                raise LabelMismatchError(f"--traces {traces}: {exc} (to resume {out}, rerun with the traces it was "
                                         "made from, or choose another --out)") from None
    done_now = 0
    desc = "golden" if world == 1 else f"golden[rank {rank}/{world}]"
    with tqdm(total=sum(len(units[u]) for u in mine), desc=desc, unit="trace", disable=not progress) as bar:
        bar.update(sum(len(units[u]) for u in mine if u not in todo))
        for u in todo:
            labels = []
            for i in units[u]:
                labels.append(label_trace(model, ds[i]["input_ids"], budget, interval, ids[i], chunk=chunk,
                                          measure=measure))
                bar.update(1)
            with atomic_output(shard_path(out, _shard_name(u))) as tmp:
                save_labels(tmp, labels)
            done_now += len(labels)
    finished = sum(check_shard(out, _shard_name(u), "rerun the same `foresight golden` command to redo it")
                   for u in range(len(units)))
    return LabelSummary(out, len(keep), skipped, done_now, finished, len(units))
