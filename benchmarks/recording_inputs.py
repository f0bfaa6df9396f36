"""What the recording benchmarks (``bench_batching.py``, ``bench_rows.py``) replay: the first labelled training traces
by id, their golden labels, a scorer and the model, checked to belong together before any replay."""

from __future__ import annotations

from dataclasses import dataclass

import torch

import foresight
from foresight.config import positive_int
from foresight.errors import ForesightError
from foresight.output_paths import check_output_file
from foresight.schedule import cache_config_arg
from foresight.scorer import Scorer
from golden.labels import check_labels_budget, check_labels_match, load_labels
from golden.traces import load_traces


@dataclass
class RecordingInputs:
    rows: list[dict]  # the traces, sorted by id
    labels: dict
    scorer: Scorer
    model: torch.nn.Module
    budget: int
    interval: int
    dims: tuple[int, int]  # (head_dim, query heads per KV head): what feature columns and packed rows need


def add_arguments(ap, scorer_help: str) -> None:
    """The arguments both scripts take."""
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--traces", required=True, help="a `foresight trace` directory")
    ap.add_argument("--labels", required=True, help="the `foresight golden` directory of those traces at B/W")
    ap.add_argument("--scorer", default="smollm2-135m-b64-w16", help=scorer_help)
    ap.add_argument("--limit", type=positive_int, default=24, help="the first N labelled traces by id (default 24)")
    ap.add_argument("--budget", type=positive_int, default=64)
    ap.add_argument("--interval", type=positive_int, default=16)
    ap.add_argument("--batch-size", type=positive_int, default=4)
    ap.add_argument("--repeats", type=positive_int, default=1)
    ap.add_argument("--threads", type=positive_int, default=1, help="torch threads (default 1)")
    ap.add_argument("--json", default=None, help="also write the results to this JSON file")


def load_inputs(args) -> RecordingInputs:
    """Check the arguments, set the torch threads and load what they name (one-line errors)."""
    check_output_file(args.json, "--json")
    cfg = cache_config_arg(args.budget, args.interval)
    torch.set_num_threads(args.threads)
    labels = load_labels(args.labels, complete=True)
    check_labels_budget(labels, cfg.budget, cfg.interval)  # before the model loads
    rows = sorted((r for r in load_traces(args.traces) if r["trace_id"] in labels),
                  key=lambda r: r["trace_id"])[: args.limit]
    if not rows:
        raise ForesightError(f"--traces {args.traces}: no finished trace has labels in {args.labels}")
    scorer = Scorer.from_pretrained(args.scorer).eval()
    model, _ = foresight.load_model(args.model)
    check_labels_match(labels, model, cfg.budget, cfg.interval)
    scorer.check_compatible(foresight.model_fingerprint(model))
    fp = scorer.config.fingerprint
    dims = (int(fp["head_dim"]), int(fp["num_heads"]) // int(fp["num_kv_heads"]))
    return RecordingInputs(rows, labels, scorer, model, cfg.budget, cfg.interval, dims)
