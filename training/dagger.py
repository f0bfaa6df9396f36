"""Stage 1b: on-policy relabelling (DAgger) of the distilled scorer (docs/training.md).

Ross, Gordon & Bagnell 2011, "A Reduction of Imitation Learning and Structured Prediction to No-Regret Online
Learning". Distillation (:mod:`training.sl`) only sees caches that golden produced; at inference the scorer meets
caches that its own mistakes produced. The oracle's foresight value α(i, s) = max over blocks j > s of ā[i, j]
comes from full-cache future attention, so it is defined for *any* candidate i at any event s; the labels store it
for every position (``TraceLabels.foresight``, format /3, O(N · N/W) per head), so the oracle labels any state.

Rounds (``foresight train sl`` with ``dagger_rounds = R > 0``):

* round 0 is distillation as before: rows recorded along the golden trajectory;
* round r ≥ 1 replays every *training* trace with the mixture policy π_r
  (:class:`training.onpolicy.MixturePolicy`): at each event, with probability β_r = ``dagger_beta ** r`` (a
  seeded coin per (seed, round, trace, event), shared by all layers) the oracle acts (it evicts the W candidates
  of *this* cache with the lowest α, ties: the older entry first, as in :func:`golden.oracle.greedy_schedule`),
  otherwise the scorer of round r-1 keeps its top-k, or, with ``dagger_temperature = T > 0``, draws the evicted
  set by Plackett–Luce at T (the ``learned`` policy's ``selection=sample``, seeded per (seed, round, trace)), so
  the rounds follow the trajectory of a scorer deployed sampling. At every event the candidates π_r's cache holds
  are recorded with their features, their α and the oracle's evict set for this cache; the rows are aggregated
  with those of all earlier rounds (golden rows included);
* each round **retrains the scorer from scratch** (same seed, ``steps``, LR schedule, normaliser refitted on a
  seeded sample of the aggregate). As in Ross et al., a round's policy is the learner's best fit to the aggregate
  data, so round r depends on earlier rounds only through their data: rounds compare like for like (round 0 is
  bit for bit the scorer of ``dagger_rounds = 0``), and the final scorer is fitted to all rows at once rather than
  warm-started from a scorer fitted to the early rounds only. The cost is ``steps`` per round either way.

Layout under ``out_dir``: ``rounds/round-<r>/`` is a complete training directory per round (``checkpoints/``,
its own ``metrics.jsonl`` of training records, ``scorer/``, ``summary.json`` once finished, and for r ≥ 1 the
recorded ``rows/`` as safetensors, one file per trace); ``rounds/dagger.json`` the settings of the run;
``metrics.jsonl`` one ``eval`` record per finished round (``round``, ``beta``, row counts, the held-out ranking
metrics on the golden trajectory, ``loss_ratio`` of the learned policy when ``eval_fidelity``), logged at step
``(r + 1) * steps``; ``scorer/`` the last round's scorer; ``summary.json``.

Resume (``--resume``): the settings must match ``rounds/dagger.json`` (names the differing keys), finished rounds
are kept, recorded rows are reused, and the open round resumes from its newest checkpoint
(:mod:`training.checkpoint`), so a killed run ends where an uninterrupted one does. A *finished* run resumed with a
larger ``dagger_rounds`` goes on with the new rounds and ends where a run started with that many rounds ends (the one
setting allowed to differ; the extension is recorded in ``dagger.json``). ``max_steps_per_run`` counts
optimisation steps over all rounds of one invocation. A run without ``--resume`` refuses an ``out_dir`` that holds
an earlier DAgger run (``rounds/dagger.json``), as a plain run refuses one with checkpoints.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import torch
from tqdm.auto import tqdm

from foresight.atomic import atomic_directory, atomic_write_text
from foresight.errors import ForesightError
from foresight.feature_groups import feature_columns
from foresight.runtime import length_batches
from foresight.scorer import Scorer
from training import checkpoint as ckpt
from training.digests import digest
from training.distributed import barrier, init_distributed, load_ds_config, out_dir_lock
from training.logging import MetricsLogger
from training.loop import resume_settings, train
from training.out_dir import FEATURES, make_out_dir, refuse_fresh as refuse_earlier_run
from training.event_files import (check_free_space, concat_events, events_bytes, join_events, load_events,
                                  repack_events, save_events, saved_metadata)
from training.onpolicy import ROWS_FORMAT, collect_onpolicy_events
from training.packed_events import PACKED_LAYOUT, recorded_groups
from training.settings_check import check_settings, plain

ROUNDS = "rounds"
STATE = "dagger.json"
STATE_FORMAT = "foresight-dagger/1"


def round_dir(out_dir: str | Path, r: int) -> Path:
    return Path(out_dir) / ROUNDS / f"round-{r}"


def rows_file(out_dir: str | Path, r: int, trace_id: str) -> Path:
    safe = "".join(c if c.isalnum() or c in "_.-" else "_" for c in trace_id)
    return round_dir(out_dir, r) / "rows" / f"{safe}-{hashlib.sha1(trace_id.encode()).hexdigest()[:8]}.safetensors"


class _RoundTask:
    """An :class:`~training.sl.SLTask` whose resume identity also names the round and its aggregated rows."""

    def __init__(self, task, identity: dict):
        self._task, self._identity = task, identity

    def __getattr__(self, name):
        return getattr(self._task, name)

    def resume_identity(self) -> dict:
        return {**self._task.resume_identity(), **self._identity}


def _finished(out_dir, r: int) -> dict | None:
    path = round_dir(out_dir, r) / "summary.json"
    if not path.is_file() or not (round_dir(out_dir, r) / "scorer").is_dir():
        return None
    return json.loads(path.read_text())


def _write_json(path: Path, data: dict) -> None:
    atomic_write_text(path, json.dumps(data, indent=1, default=str))


def _dims(task) -> tuple[int, int]:
    """(head_dim, query heads per KV head) of the task's model: what the packed rows layout needs."""
    return int(task.scorer_config.fingerprint["head_dim"]), task.scorer_config.num_groups


def _groups(cfg) -> tuple[str, ...]:
    """The feature groups a round's rows hold: the scorer's (in ``FEATURE_GROUPS`` order). The rows are this scorer's
    trajectory, of no use to another feature set, so even beside a feature cache of every group they skip the other
    groups: their columns, and their computation (the recency state, the query ring)."""
    return recorded_groups(cfg.feature_set)


def _repack_rows(task, cfg, dist, rounds) -> None:
    """Rewrite, packed, the rows files of ``rounds`` still in the dense layout of earlier versions (each rank its
    share; :func:`training.packed_events.pack` checks that the features are unchanged). No replay."""
    files = [f for r in rounds for row in task.train_rows[dist.rank :: dist.world_size]
             if (f := rows_file(cfg.out_dir, r, row["trace_id"])).exists()
             and saved_metadata(f).get("layout") != PACKED_LAYOUT]
    repack_events(files, ROWS_FORMAT, *_dims(task), "repack rows", dist.is_main)
    barrier()


def _record_round(task, cfg, dist, r: int, beta: float) -> None:
    """Rows of round ``r`` for every training trace (each rank its share; existing files are kept)."""
    check_disk(task, cfg, [r])  # again: the disk may have filled since the run started
    scorer = Scorer.from_pretrained(round_dir(cfg.out_dir, r - 1) / "scorer").eval()
    groups = _groups(cfg)
    columns = torch.tensor(feature_columns(cfg.feature_set, groups, *_dims(task)))  # the scorer's, of the rows'
    todo = [row for row in task.train_rows[dist.rank :: dist.world_size]
            if not rows_file(cfg.out_dir, r, row["trace_id"]).exists()]
    bar = tqdm(total=len(todo), desc=f"dagger round {r}", unit="trace", disable=not (dist.is_main and todo),
               dynamic_ncols=True)
    for batch in length_batches([len(row["input_ids"]) for row in todo], cfg.replay_batch_size):
        part = [todo[i] for i in batch]
        events = collect_onpolicy_events(
            task.model, [row["input_ids"] for row in part], [row["trace_id"] for row in part], task.labels, scorer,
            lambda: task.feature_cache.extractor(groups), columns, cfg.budget, cfg.interval, r, beta, cfg.seed,
            getattr(torch, cfg.feature_dtype), len(part), cfg.dagger_temperature)
        for ev in events:
            save_events(rows_file(cfg.out_dir, r, ev.trace_id), ev, *_dims(task), ROWS_FORMAT, groups=groups)
        bar.update(len(part))
    bar.close()
    barrier()


def rows_bytes(task, cfg, rounds, reuse: bool = True) -> tuple[int, int]:
    """``(bytes, traces)`` that the rows of ``rounds`` still to record will take (``reuse``: files already there
    are kept and cost nothing): a trace's rows have its labels' events with the candidates of its golden rows and the
    feature columns of the scorer's groups, packed (:func:`training.event_files.events_bytes`)."""
    dtype = getattr(torch, cfg.feature_dtype)
    todo = [row["trace_id"] for r in rounds for row in task.train_rows
            if not (reuse and rows_file(cfg.out_dir, r, row["trace_id"]).exists())]
    return sum(events_bytes(task.labels[t], *_dims(task), dtype, _groups(cfg)) for t in todo), len(todo)


def check_disk(task, cfg, rounds, reuse: bool = True) -> None:
    """Refuse (one line) DAgger rounds whose rows will not fit on ``out_dir``'s disk, before replaying anything:
    each round's rows take up to as much as a feature cache of the scorer's groups."""
    per_round = {r: rows_bytes(task, cfg, [r], reuse) for r in rounds}
    rounds = [r for r, (_, traces) in per_round.items() if traces]  # those with rows still to record
    need = sum(n for n, _ in per_round.values())
    traces = sum(t for _, t in per_round.values())
    if traces:
        which = f"round {rounds[0]}" if len(rounds) == 1 else f"rounds {', '.join(map(str, rounds))}"
        check_free_space(round_dir(cfg.out_dir, rounds[0]).parent, need,
                         f"dagger_rounds: {which} ({traces} rows files)",
                         "free disk space or lower dagger_rounds (recorded rows are kept)")


def _aggregate(task, golden: dict, cfg, r: int) -> dict:
    """Golden rows followed by the rows of rounds 1..r (training traces only)."""
    if r == 0:
        return golden
    parts = [golden]
    for k in range(1, r + 1):
        evs = [load_events(f, ROWS_FORMAT) for row in task.train_rows
               if (f := rows_file(cfg.out_dir, k, row["trace_id"])).exists()]
        if evs:
            parts.append(concat_events(evs, task.columns))
    return join_events(parts)


def _round_record(r: int, beta: float, golden_events: int, task, ev: dict) -> dict:
    out = {"round": r, "beta": beta, "train_events": int(task.train["alpha"].shape[0]),
           "onpolicy_events": int(task.train["alpha"].shape[0]) - golden_events, **ev}
    for rec in ev.get("fidelity") or []:
        if rec.get("policy") == "learned":
            out["loss_ratio"] = rec.get("loss_ratio")
    return out


def _extends(cfg, saved: dict) -> int | None:
    """The saved run's ``dagger_rounds`` when this resume asks for more rounds, else None. Rounds depend on earlier
    rounds only through their data, so more rounds continue a run exactly as a longer run would have gone on; only a
    finished run is extended (an open round's checkpoint was written under the old count)."""
    old = saved.get("dagger_rounds")
    if not isinstance(old, int) or cfg.dagger_rounds <= old:
        return None
    open_rounds = [r for r in range(old + 1) if _finished(cfg.out_dir, r) is None]
    if open_rounds:
        raise ForesightError(f"--resume: dagger_rounds={cfg.dagger_rounds} adds rounds to the run under "
                             f"{cfg.out_dir}, but its dagger_rounds={old} run is not finished (round "
                             f"{open_rounds[0]} open); finish it with dagger_rounds={old}, then resume with more")
    return old


def _check(cfg, settings: dict, complete: bool = True) -> tuple[dict, int | None]:
    """Refuse a resume whose settings differ from those ``rounds/dagger.json`` records (``complete=False``: only the
    keys of ``settings``, the check before the data loads); returns the recorded state and, when this resume
    extends a finished run (:func:`_extends`), its old ``dagger_rounds``."""
    state = Path(cfg.out_dir) / ROUNDS / STATE
    if not state.is_file():
        raise ForesightError(f"--resume: no DAgger run under {cfg.out_dir} ({state} missing); start without "
                             "--resume")
    saved = json.loads(state.read_text())
    old = _extends(cfg, saved.get("settings", {}))
    check_settings(saved.get("settings", {}), settings if old is None else {**settings, "dagger_rounds": old},
                   state, complete=complete)
    return saved, old


def refuse_fresh(out: Path) -> None:
    """A run without ``--resume`` or ``--overwrite`` (plain or DAgger: :func:`training.sl.run_sl` calls this for both)
    refuses an ``out_dir`` that holds an earlier run: a plain run's checkpoints or finished scorer
    (:func:`training.out_dir.refuse_fresh`), or a DAgger run's ``rounds/``, whose recorded rows and finished rounds are
    hours of work. A DAgger run would remove them and a plain run would leave them beside a scorer they did not make;
    either is the user's decision, not a forgotten flag's."""
    out = Path(out)
    rounds = out / ROUNDS
    if (rounds / STATE).is_file():
        done = sum(_finished(out, r) is not None for r in range(len(list(rounds.glob("round-*")))))
        raise ForesightError(f"out_dir {out} holds an earlier DAgger run ({rounds}: {done} finished round(s)); pass "
                             "--resume to continue it, --overwrite to replace it, or choose another out_dir")
    refuse_earlier_run(out)


def _start(cfg, dist, resume: bool, settings: dict) -> None:
    """Check (resume) or record (fresh run: :func:`refuse_fresh` has checked that there are no earlier rounds; a
    ``rounds/`` without its ``dagger.json`` is removed) the run's settings. A resume of a finished run
    with a larger ``dagger_rounds`` extends it (:func:`_extends`): the recorded settings take the new count and
    the old final ``scorer/`` and ``summary.json`` are removed (the old last round's scorer stays under
    ``rounds/``)."""
    out = Path(cfg.out_dir)
    state = out / ROUNDS / STATE
    if resume:
        saved, old = _check(cfg, settings)
        if old is not None and dist.is_main:
            extended = saved.get("extended", []) + [{"from": old, "to": cfg.dagger_rounds}]
            _write_json(state, {**saved, "settings": plain(settings), "extended": extended})
            shutil.rmtree(out / "scorer", ignore_errors=True)
            (out / "summary.json").unlink(missing_ok=True)
            print(f"[foresight] DAgger: extending the finished {old}-round run to {cfg.dagger_rounds} rounds",
                  flush=True)
    elif dist.is_main:
        shutil.rmtree(out / ROUNDS, ignore_errors=True)
        state.parent.mkdir(parents=True, exist_ok=True)
        _write_json(state, {"format": STATE_FORMAT, "settings": plain(settings)})


def run_dagger(cfg, load_data: Callable[[Any], Any], make_task: Callable[[Any, Any, Any], Any],
               resume: bool = False, overwrite: bool = False) -> dict[str, Any]:
    """Distillation followed by ``cfg.dagger_rounds`` on-policy rounds; see the module docstring.

    ``cfg`` is the :class:`~training.sl.SLConfig`; ``load_data(cfg)`` loads the split and labels without the model
    (:class:`~training.sl.SLData`: a resume is checked against its digests before the model loads);
    ``make_task(dist, cfg, data)`` builds the :class:`~training.sl.SLTask` on it (round 0's rows, frozen model;
    ``init_scorer()`` builds a fresh scorer on its ``train`` rows). Passed in by :func:`training.sl.run_sl`, so
    this module sits below it. ``overwrite`` replaces an earlier run in ``out_dir`` once the data has loaded. The
    whole run holds ``out_dir``'s lock (:func:`training.distributed.out_dir_lock`)."""
    dist = init_distributed(cfg.device)
    with out_dir_lock(cfg.out_dir, dist):
        return _run_dagger(cfg, dist, load_data, make_task, resume, overwrite)


def _run_dagger(cfg, dist, load_data, make_task, resume: bool, overwrite: bool) -> dict[str, Any]:
    """:func:`run_dagger` under the lock."""
    out = Path(cfg.out_dir)
    ds_config = load_ds_config(cfg.deepspeed, micro_batch=cfg.micro_batch, grad_clip=cfg.grad_clip,
                               world_size=dist.world_size)
    if resume:  # fail fast, before the data preparation (a fresh run: run_sl has called refuse_fresh)
        _check(cfg, resume_settings(cfg, dist.world_size, ds_config), complete=False)
    data = load_data(cfg)
    if resume:  # the data's digests too, before the model loads
        _check(cfg, resume_settings(cfg, dist.world_size, ds_config, data))
    for row in data.train_rows:  # labels without per-position α (format /2): refuse now, not after round 0
        lab = data.labels[row["trace_id"]]
        if lab.foresight is None and not lab.foresight_file:
            lab.load_foresight()  # raises the one-line request to regenerate them
    torch.manual_seed(cfg.seed)
    base = replace(cfg, feature_cache=cfg.feature_cache or str(out / FEATURES))
    task = make_task(dist, base, data)
    make_out_dir(cfg, dist, overwrite)  # the task's checks passed: a refused run replaces nothing
    # rows of every round still to record fit on the disk (a fresh run removes the old ones): before writing anything
    check_disk(task, base, range(1, cfg.dagger_rounds + 1), reuse=resume)
    _start(cfg, dist, resume, resume_settings(cfg, dist.world_size, ds_config, task))
    barrier()
    logger = MetricsLogger(out, enabled=dist.is_main, report_to=cfg.report_to, project=cfg.wandb_project,
                           run_name=cfg.run_name, run_config=cfg.to_dict())
    done = [_finished(out, r) for r in range(cfg.dagger_rounds + 1)]
    first_open = next((r for r, d in enumerate(done) if d is None), len(done))
    logger.truncate(first_open * cfg.steps if resume else -1)  # no round's record twice
    if dist.is_main:
        _write_json(out / "split.json", {"train": [r["trace_id"] for r in task.train_rows],
                                         "heldout": [r["trace_id"] for r in task.val_rows]})
        print(f"[foresight] DAgger: {cfg.dagger_rounds} round(s) after distillation, beta={cfg.dagger_beta}; "
              f"{len(task.train_rows)} train traces, {len(task.val_rows)} held-out traces", flush=True)
    golden, used = task.train, 0
    for r in range(first_open, cfg.dagger_rounds + 1):
        left = cfg.max_steps_per_run - used
        # a later round starts at step 0, so a slice too short to reach its first checkpoint would be lost work
        if cfg.max_steps_per_run and (left <= 0 or (r > first_open and cfg.slice_stalls(left))):
            return _stop(out, dist, logger, r, used, done)
        summary = _train_round(task, base, dist, r, golden, used, logger)
        used += summary["steps"] - summary["start"]
        if not summary["finished"]:
            return _stop(out, dist, logger, r, used, done)
        done[r] = _finished(out, r)
    result = {"finished": True, "rounds": [d["record"] for d in done if d], "steps_this_run": used,
              "eval": done[-1]["record"] if done[-1] else {}, "scorer": str(out / "scorer")}
    if dist.is_main:
        with atomic_directory(out / "scorer") as tmp:  # a kill mid-copy leaves the earlier scorer/ (or none), whole
            shutil.copytree(round_dir(out, cfg.dagger_rounds) / "scorer", tmp, dirs_exist_ok=True)
        _write_json(out / "summary.json", result)
    barrier()
    logger.close()
    return result


def _train_round(task, cfg, dist, r: int, golden: dict, used: int, logger) -> dict:
    """Round ``r``: record its rows (r ≥ 1), retrain a fresh scorer on the aggregate (resuming the round's newest
    checkpoint if there is one); once finished, save its scorer, log its record, then mark it finished."""
    beta = cfg.dagger_beta**r
    if r > 0:
        _record_round(task, cfg, dist, r, beta)
        _repack_rows(task, cfg, dist, range(1, r + 1))
    task.train = _aggregate(task, golden, cfg, r)
    task.init_scorer()
    task.cfg = replace(cfg, fidelity_policies=cfg.fidelity_policies if r == cfg.dagger_rounds else [])
    rdir = round_dir(cfg.out_dir, r)
    round_cfg = replace(cfg, out_dir=str(rdir),
                        max_steps_per_run=cfg.max_steps_per_run - used if cfg.max_steps_per_run else 0)
    identity = {"dagger_round": r, "dagger_rows": digest([task.train["alpha"], task.train["positions"]])}
    resume = ckpt.latest_step(rdir) is not None
    round_logger = MetricsLogger(rdir, enabled=dist.is_main)
    if not resume:  # the round starts at step 0 again: a killed attempt's records would repeat (train cuts on resume)
        round_logger.truncate(-1)
    summary = train(_RoundTask(task, identity), round_cfg, dist, resume=resume, logger=round_logger)
    if summary["finished"] and dist.is_main:
        task.module.save_pretrained(rdir / "scorer")
        record = _round_record(r, beta, int(golden["alpha"].shape[0]), task, summary["eval"])
        logger.log((r + 1) * cfg.steps, record, "eval")  # before the mark: a resume redoes an unmarked round
        _write_json(rdir / "summary.json", {**summary, "record": record})  # the mark
    barrier()
    return summary


def _stop(out: Path, dist, logger, r: int, used: int, done: list) -> dict:
    """A time-sliced invocation ends (``max_steps_per_run``); ``--resume`` continues at round ``r``."""
    result = {"finished": False, "round": r, "steps_this_run": used, "rounds": [d["record"] for d in done if d]}
    if dist.is_main:
        _write_json(out / "summary.json", result)
    barrier()
    logger.close()
    return result
