"""Reasoning accuracy under a KV budget (docs/evaluation.md): generate, extract the last ``\\boxed{}``, grade.

Outputs in ``out_dir``:

* ``samples-rank{R}.jsonl``: one JSON line per (problem, sample), appended and flushed as soon as its batch
  finishes. A rerun skips every finished key (in any rank's file) and first cuts a half-written last line left by
  a killed process, so runs are resumable. Rank ``R`` of ``WORLD_SIZE`` handles keys ``R, R + WORLD_SIZE, ...``.
* ``settings.json``: the generation settings; a rerun with settings that change the samples (the model and its
  adapter by fingerprint, its weights' dtype, a learned policy's scorer by its weights' SHA-256) is refused, and so is
  a rerun whose problem set or template gives a finished sample another prompt or reference answer (the file behind
  ``--data`` or ``--template`` edited or replaced under the same ids): each record holds its prompt's digest.
* ``summary.json``: pass@1 (mean over problems of the fraction of correct samples), per-problem accuracy, mean
  generated length, peak KV entries and throughput, merged over every rank file present (``complete`` tells
  whether all expected samples are in).

Sampling uses one seed per (problem, sample) (:func:`golden.traces.trace_seed`), so a sample's tokens do not
depend on which other samples share its batch or on resumption.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Sequence

from tqdm.auto import tqdm

from evaluation.grading import grade
from foresight.atomic import append_text, atomic_write_text
from foresight.config import read_json
from foresight.errors import ForesightError
from foresight.fingerprint import fingerprint_diff
from foresight.generation import eos_token_ids, generate
from foresight.limits import check_new_tokens, check_planned
from foresight.outputs import OutputKind, prepare_output_dir
from foresight.policies.base import require_cache
from foresight.prompts import build_prompt
from golden.traces import check_greedy_samples, trace_seed

SAMPLES_GLOB = "samples-rank*.jsonl"
#: ``eval aime``'s output directory.
AIME_OUTPUT = OutputKind("eval aime", ("settings.json", "summary.json", SAMPLES_GLOB), (("settings.json",),))
#: Settings that change what a sample is; a resumed run must agree on them.
SAMPLE_DEFINING = (
    "model", "data", "policy", "policy_kwargs", "budget", "interval", "sinks", "temperature", "top_p", "top_k",
    "max_new_tokens", "seed", "template",
)


def sample_key(problem_id: str, sample: int) -> str:
    return f"{problem_id}#{sample}"


def repair_jsonl(path: Path) -> None:
    """Cut a partial last line (a process killed mid-write) so appended records start on a fresh line."""
    if not path.exists():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        cut = data.rfind(b"\n") + 1
        with path.open("r+b") as f:
            f.truncate(cut)


def read_records(out_dir: str | Path) -> list[dict]:
    """Every complete record of every rank file in ``out_dir`` (first occurrence of a key wins)."""
    seen, out = set(), []
    for path in sorted(Path(out_dir).glob(SAMPLES_GLOB)):
        with path.open() as f:
            for line in f:
                if not line.endswith("\n"):
                    break  # partial last line of a killed run
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if not isinstance(rec, dict) or "problem_id" not in rec or "sample" not in rec:
                    continue  # not a sample record (a damaged line): that sample is simply generated again
                key = sample_key(rec["problem_id"], rec["sample"])
                if key not in seen:
                    seen.add(key)
                    out.append(rec)
    return out


def _check_settings(out: Path, settings: dict) -> None:
    path = out / "settings.json"
    if not path.exists() and any(out.glob(SAMPLES_GLOB)):  # written before the first sample: nothing tells what
        raise ForesightError(f"{out} holds samples but no settings.json (the policy, budget and model they were "
                             "made with are unknown); use another --out")
    if path.exists():
        old = read_json(path, "settings file")
        # the scorer by its weights where both runs recorded them (a path or short name can point at new weights)
        scorer = "scorer_sha256" if old.get("scorer_sha256") and settings.get("scorer_sha256") else "scorer"
        dtype = ("dtype",) if old.get("dtype") and settings.get("dtype") else ()  # runs of earlier versions lack it
        diff = [k for k in (*SAMPLE_DEFINING, scorer, *dtype) if old.get(k) != settings.get(k)]
        detail = [f"{k}: {old.get(k)!r} -> {settings.get(k)!r}" for k in diff]
        if old.get("fingerprint") and settings.get("fingerprint"):  # the model's weights name and adapter
            detail += fingerprint_diff(old["fingerprint"], settings["fingerprint"])
        if detail and any(out.glob(SAMPLES_GLOB)):
            raise ForesightError(f"{out} holds samples made with other settings ({', '.join(detail)}); use another "
                                 "--out")


def check_gradable(problems: Sequence, data) -> None:
    """Refuse a problem set with nothing to grade: no problems, or a problem without a reference answer (every
    sample of it would be graded wrong, and pass@1 read as a measurement)."""
    if not problems:
        raise ForesightError(f"--data {data} holds no problems")
    missing = [p.id for p in problems if not str(p.answer).strip()]
    if missing:
        raise ForesightError(f"--data {data}: problem {missing[0]!r} has no reference answer ({len(missing)} of "
                             f"{len(problems)} have none); eval aime grades against the `answer` field")


def prompt_digest(prompt: str) -> str:
    """SHA-256 (first 16 hex digits) of a prompt's text, recorded with each sample."""
    return hashlib.sha256(prompt.encode()).hexdigest()[:16]


def _check_records(out: Path, records: list[dict], problems: Sequence, prompt_of, data) -> None:
    """Refuse finished samples of this run's problems whose reference answer or prompt (records that carry its
    digest) is not the one ``problems`` and the template give now: their grades would be summarised as if they
    answered these problems."""
    by_id = {p.id: p for p in problems}
    for r in records:
        p = by_id.get(r["problem_id"])
        if p is None:
            continue
        if "answer" in r and r["answer"] != p.answer:
            what = f"reference answer {r.get('answer')!r} there, {p.answer!r} now"
        elif "prompt_sha256" in r and r["prompt_sha256"] != prompt_digest(prompt_of(p)):
            what = "another prompt (problem text or template)"
        else:
            continue
        raise ForesightError(f"{out} holds samples of problem {p.id!r} made from other data ({what}); --data {data} "
                             "or --template changed since they were generated: use another --out")


def run_accuracy(
    model,
    tokenizer,
    problems: Sequence,
    out_dir: str | Path,
    *,
    policy,
    settings: dict,
    samples: int = 1,
    batch_size: int = 8,
    rank: int = 0,
    world_size: int = 1,
    progress: bool = False,
) -> dict:
    """Generate ``samples`` answers per problem (this rank's share), grade and append them; return the summary.

    ``settings`` must hold ``budget``, ``interval``, ``sinks``, ``temperature``, ``top_p``, ``top_k``,
    ``max_new_tokens``, ``seed`` and ``template`` (plus anything to record); ``policy`` is a policy instance.
    """
    if samples <= 0 or batch_size <= 0:
        raise ForesightError("--samples and --batch-size must be positive")
    check_greedy_samples(samples, settings["temperature"], ("--samples ", "--temperature "), "answer")
    if not 0 <= rank < world_size:
        raise ForesightError(f"RANK={rank} is outside WORLD_SIZE={world_size}")
    require_cache(policy, settings["budget"], settings["interval"])  # before anything is written
    check_planned(len(problems), samples, 0, ("samples", "first_sample"))
    prompts_cache: dict[str, str] = {}

    def prompt_of(p) -> str:
        if p.id not in prompts_cache:
            prompts_cache[p.id] = build_prompt(tokenizer, p.problem, settings.get("template"))
        return prompts_cache[p.id]

    longest = max((len(tokenizer(prompt_of(p))["input_ids"]) for p in problems), default=0)
    check_new_tokens(model, longest, settings["max_new_tokens"], "max_new_tokens")  # before anything is written
    out = prepare_output_dir(out_dir, AIME_OUTPUT)

    settings = {**settings, "samples": samples, "num_problems": len(problems)}
    _check_settings(out, settings)
    records = read_records(out)  # complete lines only, so the same before and after repair_jsonl below
    _check_records(out, records, problems, prompt_of, settings.get("data"))
    atomic_write_text(out / "settings.json", json.dumps(settings, indent=2) + "\n")  # a rerun killed here keeps it
    path = out / f"samples-rank{rank}.jsonl"
    repair_jsonl(path)
    done = {sample_key(r["problem_id"], r["sample"]) for r in records}
    keys = [(p, s) for p in problems for s in range(samples)][rank::world_size]
    todo = [(p, s) for p, s in keys if sample_key(p.id, s) not in done]
    greedy = settings["temperature"] == 0
    bar = tqdm(total=len(keys), initial=len(keys) - len(todo), desc=f"eval[{policy.name}]", disable=not progress)
    # Batches are fixed slices of ``keys``: under a budget, left padding shifts a row's eviction events, so a sample
    # is always generated beside the same rows; a resumed batch is regenerated whole and only its missing samples
    # are written (the others come out identical).
    for b0 in range(0, len(keys), batch_size):
        chunk = keys[b0 : b0 + batch_size]
        if all(sample_key(p.id, s) in done for p, s in chunk):
            continue
        prompts = [prompt_of(p) for p, _ in chunk]
        t0 = time.perf_counter()
        res = generate(
            model, tokenizer, prompts, policy=policy, budget=settings["budget"],
            interval=settings["interval"], sinks=settings["sinks"], max_new_tokens=settings["max_new_tokens"],
            do_sample=not greedy, temperature=1.0 if greedy else settings["temperature"],
            top_p=settings["top_p"], top_k=settings["top_k"],
            seed=[trace_seed(settings["seed"], p.id, s) for p, s in chunk],
        )
        seconds = time.perf_counter() - t0
        batch_tokens = sum(len(t) for t in res.token_ids)
        batch_id = f"{rank}:{time.time_ns()}"
        eos = eos_token_ids(model, tokenizer)
        lines = []
        for i, (p, s) in enumerate(chunk):
            if sample_key(p.id, s) in done:
                continue
            g = grade(res.texts[i], p.answer)
            ids = res.token_ids[i]
            rec = {
                "problem_id": p.id, "sample": s, "answer": p.answer,
                "prompt_sha256": prompt_digest(prompts[i]), "extracted": g["extracted"],
                "correct": g["correct"], "generated_tokens": len(ids),
                "finished": bool(ids) and ids[-1] in eos, "prompt_tokens": res.prompt_lengths[i],
                "peak_kv_entries": max(res.stats["peak_entries"]), "evictions": res.stats["evictions"],
                "batch": batch_id, "batch_seconds": seconds, "batch_tokens": batch_tokens,
                "text": res.texts[i],
            }
            lines.append(json.dumps(rec) + "\n")
        append_text(path, "".join(lines))  # the batch's records whole, or none of them
        bar.update(sum(sample_key(p.id, s) not in done for p, s in chunk))
    bar.close()
    return write_summary(out, problems, samples)



def regrade(records: Sequence[dict], problems: Sequence) -> list[dict]:
    """The records of ``problems`` graded again from their text against the problem's answer (grading is cheap, and
    a sample file is text a hand can edit: its ``correct`` and ``extracted`` are never trusted); a note on stderr
    counts the records whose recorded grade differed."""
    answer = {p.id: p.answer for p in problems}
    out, changed = [], 0
    for r in records:
        if r["problem_id"] in answer and isinstance(r.get("text"), str):
            g = grade(r["text"], answer[r["problem_id"]])
            changed += (bool(r.get("correct")), r.get("extracted")) != (g["correct"], g["extracted"])
            r = {**r, "correct": g["correct"], "extracted": g["extracted"]}
        out.append(r)
    if changed:
        print(f"note: {changed} sample record(s) held another grade than their text gets; the regraded ones are "
              "reported", file=sys.stderr)
    return out


def summarize(records: Sequence[dict], problems: Sequence, samples: int, settings: dict | None = None) -> dict:
    """pass@1, per-problem accuracy, lengths, peak KV entries and throughput of the records for ``problems``, each
    graded again from its text (:func:`regrade`)."""
    wanted = {sample_key(p.id, s) for p in problems for s in range(samples)}
    recs = regrade([r for r in records if sample_key(r["problem_id"], r["sample"]) in wanted], problems)
    per_problem: dict[str, dict] = {}
    for p in problems:
        rs = [r for r in recs if r["problem_id"] == p.id]
        if rs:
            k = sum(bool(r["correct"]) for r in rs)
            per_problem[p.id] = {"correct": k, "samples": len(rs), "accuracy": k / len(rs)}
    batches = {r["batch"]: (r["batch_seconds"], r["batch_tokens"]) for r in recs}
    seconds = sum(v[0] for v in batches.values())
    tokens = sum(v[1] for v in batches.values())
    n = len(recs)
    return {
        "pass@1": sum(v["accuracy"] for v in per_problem.values()) / len(per_problem) if per_problem else None,
        "problems": len(per_problem),
        "samples": n,
        "expected_samples": len(wanted),
        "complete": n == len(wanted),
        "correct": sum(bool(r["correct"]) for r in recs),
        "mean_generated_tokens": sum(r["generated_tokens"] for r in recs) / n if n else None,
        "finished_fraction": sum(bool(r["finished"]) for r in recs) / n if n else None,
        "no_answer_fraction": sum(r["extracted"] is None for r in recs) / n if n else None,
        "peak_kv_entries": max((r["peak_kv_entries"] for r in recs), default=None),
        "tokens_per_s": tokens / seconds if seconds else None,
        "generation_seconds": seconds,
        "per_problem": per_problem,
        "settings": settings or {},
    }


#: Summary fields that measure time rather than results (differ between identical runs).
TIMING_FIELDS = ("tokens_per_s", "generation_seconds")


def write_summary(out_dir: str | Path, problems: Sequence, samples: int) -> dict:
    out = Path(out_dir)
    settings_path = out / "settings.json"
    settings = read_json(settings_path, "settings file") if settings_path.exists() else {}
    summary = summarize(read_records(out), problems, samples, settings)
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=2) + "\n")  # ranks may end together
    return summary


def format_summary(s: dict) -> str:
    """A short human-readable block of a summary."""
    st = s.get("settings", {})
    p1 = "n/a" if s["pass@1"] is None else f"{100 * s['pass@1']:.1f}%"
    tps = "n/a" if not s["tokens_per_s"] else f"{s['tokens_per_s']:.1f}"
    return "\n".join([
        "| data | policy | budget | interval | pass@1 | correct/samples | mean gen tokens | no \\boxed | "
        "peak KV entries | tokens/s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| {st.get('data')} | {st.get('policy')} | {st.get('budget')} | {st.get('interval')} | {p1} | "
        f"{s['correct']}/{s['samples']} | {s['mean_generated_tokens'] or 0:.1f} | "
        f"{100 * (s['no_answer_fraction'] or 0):.0f}% | {s['peak_kv_entries']} | {tps} |",
        "" if s["complete"] else f"(incomplete: {s['samples']}/{s['expected_samples']} samples so far)",
    ])


__all__ = ["AIME_OUTPUT", "TIMING_FIELDS", "check_gradable", "format_summary", "read_records", "regrade",
           "repair_jsonl", "run_accuracy", "summarize", "write_summary"]
