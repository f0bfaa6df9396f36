"""Reasoning traces: sample model answers to problems into a resumable, sharded ``datasets`` dataset.

A trace is one sampled answer: ``input_ids`` = prompt tokens + generated tokens (up to and including EOS).
Work is split into units of ``batch_size`` (problem, sample) pairs, each unit written as one Arrow shard
(see :mod:`golden.sharding` for resumption and multi-rank sharding). Sampling is seeded per trace from
``(seed, problem id, sample)``, so a trace does not depend on the rank that produced it or on a resume.

Columns of :func:`load_traces`: ``trace_id`` (``"<problem_id>#<sample>"``), ``problem_id``, ``sample``,
``input_ids``, ``prompt_len``, ``answer``, ``settings`` (JSON), ``fingerprint`` (JSON of
:func:`foresight.model_fingerprint`), plus ``problem`` (text) and ``finished`` (ended with EOS).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Sequence

from tqdm.auto import tqdm

# `datasets` (about a second to import) is imported inside the functions that use it: `foresight --help` loads
# this module (the train command lists the trainers, and GRPO imports load_traces).
from foresight.data import Problem
from foresight.errors import ForesightError
from foresight.generation import eos_token_ids, generate
from foresight.fingerprint import weights_dtype
from foresight.limits import check_new_tokens, check_planned
from foresight.models import model_fingerprint
from foresight.prompts import build_prompt, load_template
from golden.sharding import (
    SHARDS_DIR,
    atomic_output,
    check_shard,
    clean_stale,
    ensure_plan,
    my_units,
    rank_world,
    read_plan,
    shard_path,
    sharded_output,
    unfinished_shards,
)

PLAN_KIND = "foresight-traces"
TRACES_OUTPUT = sharded_output("trace")
_REDO = "rerun the same `foresight trace` command to redo it"


def trace_id(problem_id: str, sample: int) -> str:
    return f"{problem_id}#{sample}"


def trace_seed(seed: int, problem_id: str, sample: int) -> int:
    """Per-trace sampling seed derived from the run seed, the problem id and the sample index."""
    digest = hashlib.sha256(f"{seed}\x00{problem_id}\x00{sample}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def _features():
    import datasets  # lazy, see the note at the imports

    return datasets.Features(
        {
            "trace_id": datasets.Value("string"),
            "problem_id": datasets.Value("string"),
            "sample": datasets.Value("int32"),
            "input_ids": datasets.Sequence(datasets.Value("int32")),
            "prompt_len": datasets.Value("int32"),
            "answer": datasets.Value("string"),
            "problem": datasets.Value("string"),
            "finished": datasets.Value("bool"),
            "settings": datasets.Value("string"),
            "fingerprint": datasets.Value("string"),
        }
    )


def _shard_name(index: int) -> str:
    return f"traces-{index:05d}"


def generate_traces(
    model,
    tokenizer,
    problems: Sequence[Problem],
    out_dir: str | Path,
    *,
    samples: int = 1,
    first_sample: int = 0,
    max_new_tokens: int = 1024,
    temperature: float = 0.6,
    top_p: float = 0.95,
    top_k: int = 20,
    seed: int = 0,
    batch_size: int = 8,
    template: str | None = None,
    progress: bool = True,
) -> Path:
    """Sample ``samples`` traces per problem into ``out_dir`` (resumable, sharded across ranks).

    Parameters
    ----------
    problems
        From :func:`foresight.data.load_problems`; ids must be unique.
    samples, max_new_tokens, temperature, top_p, top_k, seed
        Sampling settings (``temperature=0`` decodes greedily). Each trace is sampled with its own generator
        seeded by :func:`trace_seed`.
    first_sample
        Index of the first sample: traces ``first_sample .. first_sample + samples - 1`` of each problem (ids
        ``problem#index``, seeds from the index). With the same ``seed``, ``first_sample=1`` adds a second sample
        of each problem to an existing one-sample set in another directory (the ids differ, so the two sets can
        be trained on together) instead of resampling it.
    batch_size
        Traces generated together; also the size of one work unit / shard.
    template
        Prompt instruction template (text or file) for :func:`foresight.prompts.build_prompt`.

    Returns
    -------
    Path
        ``out_dir``; read it with :func:`load_traces`.
    """
    check_sampling(samples=samples, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                   top_k=top_k, batch_size=batch_size, first_sample=first_sample)
    ids = [p.id for p in problems]
    if len(set(ids)) != len(ids):
        raise ForesightError("problem ids must be unique")
    if not problems:
        raise ForesightError("no problems to trace")
    check_planned(len(problems), samples, first_sample, ("samples", "first_sample"))
    template_text = load_template(template)
    prompt_ids = {p.id: tokenizer(build_prompt(tokenizer, p.problem, template_text))["input_ids"] for p in problems}
    check_new_tokens(model, max(map(len, prompt_ids.values())), max_new_tokens, "max_new_tokens")  # before any write
    settings = {
        "samples": samples,
        "max_new_tokens": max_new_tokens,
        "temperature": temperature,
        "top_p": top_p,
        "top_k": top_k,
        "seed": seed,
        "template": template_text,
    }
    if first_sample:  # recorded only when set, so that the sets made before it existed resume unchanged
        settings["first_sample"] = first_sample
    fingerprint = model_fingerprint(model)
    work = [(p, s) for p in problems for s in range(first_sample, first_sample + samples)]
    units = [work[i : i + batch_size] for i in range(0, len(work), batch_size)]
    plan = {
        "kind": PLAN_KIND,
        "version": 1,
        "fingerprint": fingerprint,
        "settings": settings,
        "batch_size": batch_size,
        "units": [
            {"shard": _shard_name(i), "trace_ids": [trace_id(p.id, s) for p, s in unit]} for i, unit in enumerate(units)
        ],
        **weights_dtype(model),  # a resume in another precision would sample other tokens
    }
    out = Path(out_dir)
    rank, world = rank_world()  # before anything is written
    ensure_plan(out, plan, "traces", ("fingerprint", "settings", "batch_size", "units", "dtype"), TRACES_OUTPUT,
                units_from="--data, --limit, --samples, --first-sample and --batch-size")
    mine = my_units(len(units), rank, world)
    clean_stale(out, [_shard_name(i) for i in mine])
    redo = set(unfinished_shards(out, [_shard_name(i) for i in mine]))
    todo = [i for i in mine if _shard_name(i) in redo]
    for i in mine:  # a finished shard is kept only when it traces these very problems (ids say nothing of the text)
        if i not in todo:
            _check_problems(out, _shard_name(i), units[i])
    settings_json = json.dumps(settings, sort_keys=True)
    fingerprint_json = json.dumps(fingerprint, sort_keys=True)
    eos = eos_token_ids(model, tokenizer)
    desc = "trace" if world == 1 else f"trace[rank {rank}/{world}]"
    bar = tqdm(total=len(mine), initial=len(mine) - len(todo), desc=desc, unit="shard", disable=not progress)
    for i in todo:
        unit = units[i]
        prompts = [prompt_ids[p.id] for p, _ in unit]
        res = generate(
            model,
            tokenizer,
            prompts,
            max_new_tokens=max_new_tokens,
            do_sample=temperature > 0,
            temperature=temperature if temperature > 0 else 1.0,
            top_p=top_p,
            top_k=top_k,
            seed=[trace_seed(seed, p.id, s) for p, s in unit],
        )
        rows = {name: [] for name in _features()}
        for (p, s), prompt, gen in zip(unit, prompts, res.token_ids):
            rows["trace_id"].append(trace_id(p.id, s))
            rows["problem_id"].append(p.id)
            rows["sample"].append(s)
            rows["input_ids"].append(list(prompt) + list(gen))
            rows["prompt_len"].append(len(prompt))
            rows["answer"].append(p.answer)
            rows["problem"].append(p.problem)
            rows["finished"].append(bool(gen) and gen[-1] in eos)
            rows["settings"].append(settings_json)
            rows["fingerprint"].append(fingerprint_json)
        _write_shard(out, _shard_name(i), rows)
        bar.update(1)
    bar.close()
    return out



def check_sampling(*, samples: int, max_new_tokens: int, temperature: float, top_p: float, top_k: int,
                   batch_size: int, first_sample: int = 0) -> None:
    """Refuse sampling settings that cannot work, before anything is loaded or written."""
    for key, value in (("samples", samples), ("max_new_tokens", max_new_tokens), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ForesightError(f"{key} must be an integer >= 1, got {value!r}")
    if isinstance(first_sample, bool) or not isinstance(first_sample, int) or first_sample < 0:
        raise ForesightError(f"first_sample must be an integer >= 0, got {first_sample!r}")
    if not temperature >= 0:
        raise ForesightError(f"temperature must be >= 0 (0 decodes greedily), got {temperature}")
    check_greedy_samples(samples, temperature, first_sample=first_sample)
    if not 0 < top_p <= 1:
        raise ForesightError(f"top_p must be in (0, 1], got {top_p}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise ForesightError(f"top_k must be an integer >= 0 (0 disables it), got {top_k!r}")


def check_greedy_samples(samples: int, temperature: float, flags: tuple[str, ...] = ("samples=", "temperature="),
                         what: str = "trace", first_sample: int = 0) -> None:
    """Refuse several samples per problem at temperature 0, or samples after the first (``first_sample`` > 0):
    greedy decoding makes them identical copies of sample 0, which would be counted (pass@1, accuracy, trace sets
    trained on together) as independent samples. ``flags`` name the settings as the caller spells them
    (``("--samples ", "--temperature ", "--first-sample ")`` on the command line; the third defaults to
    ``first_sample=``)."""
    n, t, f = (*flags, "first_sample=")[:3]
    if temperature == 0 and samples > 1:
        raise ForesightError(f"{n}{samples} with {t}0: greedy decoding makes the {samples} samples of each problem "
                             f"identical copies of one {what}, counted as {samples}; pass {n}1, or {t}T > 0 to sample")
    if temperature == 0 and first_sample > 0:
        raise ForesightError(f"{f}{first_sample} with {t}0: greedy decoding makes sample {first_sample} of each "
                             f"problem an identical copy of its {what} #0 under a new id, counted twice in sets used "
                             f"together; pass {t}T > 0 to sample another {what}")


def _check_problems(out: Path, name: str, unit) -> None:
    """Refuse a finished shard whose traces were sampled for other problem texts or answers than ``unit``'s: problem
    sets without ids number their problems 0, 1, ..., so another (or a corrected) file gives the same trace ids."""
    ds = _load_shard(shard_path(out, name))
    for (p, s), tid, text, answer in zip(unit, ds["trace_id"], ds["problem"], ds["answer"]):
        if (tid, text, answer) != (trace_id(p.id, s), p.problem, p.answer):
            raise ForesightError(f"{shard_path(out, name)} holds traces of other problems than --data gives now "
                                 f"(trace {tid!r}: its problem text or answer differs); rerun with the data it was "
                                 "made from, or choose another --out")


def _write_shard(out: Path, name: str, rows: dict) -> None:
    import datasets  # lazy, see the note at the imports

    ds = datasets.Dataset.from_dict(rows, features=_features())
    was_enabled = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()  # one bar per shard would drown ours
    try:
        with atomic_output(shard_path(out, name)) as tmp:
            ds.save_to_disk(str(tmp))
    finally:
        if was_enabled:
            datasets.enable_progress_bars()


def trace_progress(path: str | Path) -> tuple[int, int]:
    """(finished shards, planned shards) of a trace directory."""
    plan = read_plan(path)
    if plan is None:
        raise ForesightError(f"{path} is not a trace directory (no plan.json)")
    done = sum(check_shard(path, u["shard"], _REDO) for u in plan["units"])
    return done, len(plan["units"])


def _load_shard(path: Path):
    import datasets  # lazy, see the note at the imports

    try:
        return datasets.load_from_disk(str(path))
    except Exception as exc:  # pyarrow / datasets errors of a damaged shard (no manifest could tell)
        raise ForesightError(f"trace shard {path} cannot be read ({type(exc).__name__}: "
                             f"{' '.join(str(exc).split())[:200]}); {_REDO}") from None


def load_traces(path: str | Path | Sequence[str | Path], complete: bool = True):
    """Load the traces of ``path`` as one ``datasets.Dataset``, shards concatenated in plan order.

    ``path`` is a directory written by :func:`generate_traces` (``foresight trace``), or any dataset saved
    with ``Dataset.save_to_disk`` that has the trace columns; or a list of them, concatenated in order (e.g. a
    second sample of each problem made with ``first_sample=1``), where a trace id found in two sets is refused.
    A set whose generation has not finished every shard is refused (a measurement on part of it would pass for one
    on all of it); ``complete=False`` loads the shards finished so far.
    """
    import datasets  # lazy, see the note at the imports

    if not isinstance(path, (str, Path)):
        paths = list(path)
        if not paths:
            raise ForesightError("no trace directory given (an empty list)")
        sets = [load_traces(p, complete) for p in paths]
        seen: dict[str, str] = {}
        for p, ds in zip(paths, sets):
            for t in ds["trace_id"]:
                if t in seen:
                    raise ForesightError(f"trace {t!r} is in both {seen[t]} and {p}: trace sets trained on together "
                                         "must hold different traces (make more samples of a problem with `foresight "
                                         "trace --first-sample`)")
                seen[t] = str(p)
        try:
            return datasets.concatenate_datasets(sets)
        except ValueError as exc:  # a saved dataset with other columns or types
            raise ForesightError(f"the trace sets {', '.join(map(str, paths))} cannot be joined "
                                 f"({' '.join(str(exc).split())[:200]})") from None
    path = Path(path)
    if not path.exists():
        raise ForesightError(f"trace directory not found: {path}")
    plan = read_plan(path)
    if plan is None:
        if (path / "dataset_info.json").is_file() or (path / "state.json").is_file():
            try:
                ds = datasets.load_from_disk(str(path))
            except Exception as exc:  # a damaged or foreign saved dataset: datasets/pyarrow/OS errors of every kind
                raise ForesightError(f"{path}: not a readable saved dataset ({type(exc).__name__}: "
                                     f"{' '.join(str(exc).split())[:200]})") from None
            missing = [c for c in ("trace_id", "input_ids") if c not in getattr(ds, "column_names", [])]
            if missing:
                raise ForesightError(f"{path}: a saved dataset without the trace column(s) {', '.join(missing)} "
                                     "(`foresight trace` writes them)")
            return ds
        raise ForesightError(f"{path} holds no traces (no {path / 'plan.json'}); run `foresight trace` first")
    if plan.get("kind") != PLAN_KIND:
        raise ForesightError(f"{path} holds {plan.get('kind')!r} output, not traces")
    finished = [u["shard"] for u in plan["units"] if check_shard(path, u["shard"], _REDO)]
    if not finished:
        raise ForesightError(f"{path} has no finished trace shards yet (under {path / SHARDS_DIR})")
    if complete and len(finished) < len(plan["units"]):
        missing = next(u["shard"] for u in plan["units"] if u["shard"] not in finished)
        raise ForesightError(f"{path} is unfinished: {len(finished)} of {len(plan['units'])} trace shards done "
                             f"({shard_path(path, missing)} missing); rerun the `foresight trace` command that made it "
                             "(it resumes)")
    return datasets.concatenate_datasets([_load_shard(shard_path(path, s)) for s in finished])
