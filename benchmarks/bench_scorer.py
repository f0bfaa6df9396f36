"""An untrained scorer with a trained one's architecture, at another (B, W): for speed measurements only.

`foresight bench` at B=256/W=64 needs a `learned` scorer of that setting, and none is trained (SmolLM2's math
traces are too short to label at B=256). Decoding cost does not depend on the weights — the feature extractor,
the per-head MLP and the top-k are the same work — so a seeded, untrained scorer of the shipped scorer's
feature set, width and recorded selection defaults (the default selection, its temperature, the top-k spread
and newcomer bonus: the spread evicts one entry at a time) times the policy honestly. Its *quality* is
meaningless: never evaluate it.

    python benchmarks/bench_scorer.py --like smollm2-135m-b64-w16 --budget 256 --interval 64 \
        --out runs/bench_scorer_b256
"""

from __future__ import annotations

from pathlib import Path

from foresight.errors import ForesightError, OneLineParser, run_script
from foresight.output_paths import check_output_dir
from foresight.scorer import TOPK_DEFAULTS, Scorer, ScorerConfig


def main(argv=None) -> int:
    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("--like", required=True, help="scorer directory or shipped name whose architecture to copy")
    ap.add_argument("--budget", type=int, required=True)
    ap.add_argument("--interval", type=int, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    check_output_dir(args.out, "--out")
    if Path(args.out).exists():  # e.g. the --like scorer itself: its trained weights were replaced by untrained ones
        raise ForesightError(f"--out {args.out} exists; choose a new directory")
    like = Scorer.from_pretrained(args.like).config
    try:
        cfg = ScorerConfig(fingerprint=like.fingerprint, budget=args.budget, interval=args.interval,
                           feature_set=like.feature_set, hidden=like.hidden, decay=like.decay,
                           **{name: getattr(like, name) for name in (*TOPK_DEFAULTS, "temperature", "selection")},
                           provenance={"trainer": "none (untrained, for speed measurements only)",
                                       "architecture_of": str(args.like), "seed": args.seed})
    except ValueError as exc:
        raise ForesightError(f"--budget/--interval: {exc}") from None
    try:
        path = Scorer(cfg, seed=args.seed).save_pretrained(args.out)
    except OSError as exc:
        raise ForesightError(f"--out {args.out}: cannot write the scorer ({exc.strerror}: {exc.filename})") from None
    print(f"wrote an untrained {list(cfg.feature_set)} scorer (hidden {cfg.hidden}) at B={cfg.budget} "
          f"W={cfg.interval} to {path}")
    return 0


if __name__ == "__main__":
    run_script(main, "bench_scorer")
