"""``foresight trace``: sample reasoning traces for a problem set into a resumable, sharded dataset."""

from __future__ import annotations

import os

from foresight.cli.args import add_model_args, add_sampling_filter_args, fill_sampling_filters
from foresight.config import nonempty_text, nonnegative_float, nonnegative_int, positive_int


TRACE_TOP_P, TRACE_TOP_K = 0.95, 20  # recorded in plan.json (a resumed run must record the same)


def register(sub) -> None:
    p = sub.add_parser("trace", help="sample reasoning traces (resumable, sharded across ranks)")
    add_model_args(p)
    p.add_argument("--data", required=True, type=nonempty_text, help="aime24 | aime25 | math500 | synthetic | a .jsonl file | HF dataset")
    p.add_argument("--split", default=None, help="split of a Hugging Face dataset (default test)")
    p.add_argument("--out", required=True, help="output directory (rerun the same command to resume)")
    p.add_argument("--limit", type=positive_int, default=None, help="first L problems only")
    p.add_argument("--samples", type=positive_int, default=1, help="traces per problem")
    p.add_argument("--first-sample", type=nonnegative_int, default=0,
                   help="index of the first sample (ids problem#K.., seeds from K): with the same --seed, K=1 adds a "
                        "second sample of each problem to a one-sample set, in another --out (not at --temperature 0)")
    p.add_argument("--max-new-tokens", type=positive_int, default=1024)
    p.add_argument("--temperature", type=nonnegative_float, default=0.6, help="0 decodes greedily")
    add_sampling_filter_args(p, top_p=TRACE_TOP_P, top_k=TRACE_TOP_K)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=positive_int, default=8, help="traces generated together (= one shard)")
    p.add_argument("--template", default=None, help="prompt template file (or text) with a {problem} placeholder")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run)


def rank_device(device: str | None) -> str | None:
    """Under a multi-process launcher on a GPU machine, each rank uses the GPU of its ``LOCAL_RANK``."""
    import torch

    if device is None and torch.cuda.is_available() and "LOCAL_RANK" in os.environ:
        return f"cuda:{int(os.environ['LOCAL_RANK'])}"
    return device


def run(args) -> int:
    import foresight
    from foresight.data import load_problems
    from foresight.limits import check_planned
    from foresight.outputs import check_output
    from foresight.prompts import load_template
    from golden.sharding import rank_world
    from golden.traces import TRACES_OUTPUT, check_greedy_samples, generate_traces, load_traces, trace_progress

    fill_sampling_filters(args, top_p=TRACE_TOP_P, top_k=TRACE_TOP_K)
    check_greedy_samples(args.samples, args.temperature, ("--samples ", "--temperature ", "--first-sample "),
                         first_sample=args.first_sample)  # before the model loads
    load_template(args.template)  # fail on a bad template before loading anything
    problems = load_problems(args.data, limit=args.limit, split=args.split)
    check_planned(len(problems), args.samples, args.first_sample)  # sample indices and the plan's size, too
    check_output(args.out, TRACES_OUTPUT)  # before the model loads, not after the work
    rank_world()  # the launcher's environment, too
    model, tok = foresight.load_model(args.model, device=rank_device(args.device), dtype=args.dtype,
                                      adapter=args.adapter)
    out = generate_traces(
        model,
        tok,
        problems,
        args.out,
        samples=args.samples,
        first_sample=args.first_sample,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
        batch_size=args.batch_size,
        template=args.template,
        progress=not args.no_progress,
    )
    done, total = trace_progress(out)
    rank, world = rank_world()
    if done < total:
        print(f"rank {rank}/{world}: my shards are done; {done}/{total} shards finished in {out} (other ranks running)")
        return 0
    ds = load_traces(out)
    lengths = [len(x) - p for x, p in zip(ds["input_ids"], ds["prompt_len"])]
    finished = sum(ds["finished"])
    print(
        f"{len(ds)} traces ({len(problems)} problems x {args.samples} samples) in {out}: "
        f"generated tokens mean {sum(lengths) / len(lengths):.0f}, max {max(lengths)}; "
        f"{finished} ended with EOS, {len(ds) - finished} hit --max-new-tokens"
    )
    return 0
