"""How random is the GRPO rollout policy at a given temperature? (docs/training.md, "GRPO")

Scores cached SL features (``foresight train sl`` writes them under ``<out_dir>/features``) with a scorer and
prints, per temperature, the mean overlap between a Plackett–Luce sampled evict set (Gumbel-top-k of
``-score / T``) and the deterministic top-k evict set. Random eviction overlaps ``W / C``.

    python benchmarks/grpo_temperature.py runs/grpo/sl/scorer runs/grpo/sl/features
"""

from __future__ import annotations

import torch

from foresight.config import positive_int
from foresight.errors import ForesightError, OneLineParser, run_script
from foresight.scorer import Scorer
from foresight.sampling import gumbel_topk
from foresight.features import FEATURE_GROUPS, feature_columns
from training.mapped_events import EventRows
from training.event_files import load_events
from training.sl_features import FEATURE_CACHE_FORMAT, FeatureCache


def _temperatures(text: str) -> list[float]:
    try:
        out = [float(v) for v in text.split(",")]
    except ValueError:
        raise ForesightError(f"--temperatures {text!r}: expected comma-separated numbers, e.g. 1,0.1") from None
    if not all(t > 0 for t in out):  # also refuses nan
        raise ForesightError(f"--temperatures {text!r}: every temperature must be > 0")
    return out


def overlaps(rows: EventRows, scorer: Scorer, temperatures: list[float], chunk: int = 256
             ) -> tuple[float, dict[float, float]]:
    """The median per-row standard deviation of ``scorer``'s scores over ``rows`` (E, L, Hkv, C, D) and, per
    temperature, the mean overlap of a sampled evict set (one seeded generator per temperature) with the top-k one.
    Events are read ``chunk`` at a time, so a cache larger than memory is measured; the draws do not depend on
    ``chunk`` (each generator's noise runs on in event order)."""
    w = scorer.config.interval
    gens = {t: torch.Generator().manual_seed(0) for t in temperatures}
    stds, hits = [], dict.fromkeys(temperatures, 0)
    for start in range(0, len(rows), chunk):
        with torch.no_grad():
            s = scorer(rows[start:start + chunk].float().transpose(0, 1)).transpose(0, 1)  # (e, L, Hkv, C)
        stds.append(s.std(-1).reshape(-1))
        top = torch.zeros_like(s, dtype=torch.bool).scatter_(-1, (-s).topk(w, -1).indices, True)
        for t in temperatures:
            draw = gumbel_topk(-s / t, w, generator=gens[t])
            hits[t] += int((torch.zeros_like(top).scatter_(-1, draw, True) & top).sum())
    sets = sum(x.numel() for x in stds)  # evict sets drawn per temperature
    return float(torch.cat(stds).median()), {t: hits[t] / (sets * w) for t in temperatures}


def main(argv=None) -> int:
    p = OneLineParser()
    p.add_argument("scorer")
    p.add_argument("features", help="feature cache dir of `foresight train sl` (of the scorer's groups or every group)")
    p.add_argument("--temperatures", default="1,0.3,0.1,0.03,0.01")
    p.add_argument("--chunk", type=positive_int, default=256, help="events scored at a time (memory)")
    args = p.parse_args(argv)
    temperatures = _temperatures(args.temperatures)
    sc = Scorer.from_pretrained(args.scorer)
    # only the cache of the scorer's model, B, W, window and decay (one features directory holds a cache per setting),
    # of its feature groups or of every group
    c = sc.config
    dirs = [FeatureCache(args.features, c.fingerprint, c.budget, c.interval, c.decay, dtype,
                         window=c.feature_window, groups=groups).dir
            for dtype in ("float16", "bfloat16", "float32") for groups in (c.feature_set, FEATURE_GROUPS)]
    files = sorted(str(p) for d in dirs if d.is_dir() for p in d.glob("*.safetensors"))
    if not files:
        raise ForesightError(f"{args.features}: no feature files of the scorer's model at B={c.budget} "
                             f"W={c.interval} (window {c.feature_window}, decay {c.decay}); pass the features "
                             "directory of its `foresight train sl` run")
    # the scorer reads its own feature set's columns (of the full feature vector, however many groups a file holds)
    cols = torch.tensor(feature_columns(sc.config.feature_set, tuple(FEATURE_GROUPS),
                                        sc.config.fingerprint["head_dim"], sc.config.num_groups))
    rows = EventRows([load_events(f, FEATURE_CACHE_FORMAT).features for f in files], cols)
    std, overlap = overlaps(rows, sc, temperatures, args.chunk)
    w = sc.config.interval
    print(f"rows {tuple(rows.shape[:-1])}; median per-row score std {std:.3f}; random overlap {w / rows.shape[-2]:.3f}")
    for t in temperatures:
        print(f"T={t:g}: overlap sampled vs top-k evict set {overlap[t]:.3f}")
    return 0


if __name__ == "__main__":
    run_script(main, "grpo_temperature")
