"""One scorer that scores the exact mean of several: a seed/bagging ensemble as a single network."""

from __future__ import annotations

import torch

from foresight.errors import ForesightError
from foresight.scorer import TOPK_DEFAULTS, Scorer, ScorerConfig

#: Provenance an average keeps where all its members agree: the data they were trained on.
AVERAGE_SHARED_PROVENANCE = ("traces", "labels", "train_traces", "heldout_traces")


def _members_agree(scorers: list[Scorer], key: str, what: str, fix: str) -> float | str | None:
    """The config value ``key`` (a number or a name) that every scorer of an average records (or all none);
    members that differ are refused in one line naming each member's value, ``what`` naming the values and ``fix``
    the way out."""
    def norm(v):
        return v if v is None or isinstance(v, str) else float(v)

    def show(v):
        return "none" if v is None else v if isinstance(v, str) else f"{float(v):g}"

    values = [getattr(s.config, key) for s in scorers]
    if len({norm(v) for v in values}) > 1:
        each = ", ".join(f"{s.source or f'(in memory #{i})'}: {show(v)}"
                         for i, (s, v) in enumerate(zip(scorers, values)))
        raise ForesightError(f"average: the scorers record different {what} ({each}); {fix}")
    return values[0]


@torch.no_grad()
def average_scorers(scorers: list[Scorer], provenance: dict | None = None, temperature: float | None = None,
                    fix: str = "pass temperature=T") -> Scorer:
    """One scorer whose keep score is the mean of ``scorers``' scores, exactly (a seed/bagging ensemble as a
    single network, so the policy and every tool take it as they take any scorer).

    Each member's standardisation is folded into its first layer (``W1 / std``, ``b1 - W1 · mean / std``), the
    hidden units are concatenated (width = sum of the members') and the output weights divided by the number
    of members; the result standardises nothing (mean 0, std 1). Members must share the model, B, W, the
    feature window, the feature set and the decay. The ensemble's ``selection=sample`` temperature is
    ``temperature`` where given; otherwise the members must record the same one (or all none): members that
    differ (a recorded temperature beside another or beside none, which samples at 1) are refused, naming each
    member's, with ``fix`` as the way out, rather than the ensemble sampling at one member's temperature nobody
    chose. Its ``selection=topk`` defaults (:data:`~foresight.scorer.TOPK_DEFAULTS`) are the members' where they
    all record the same (or none); members that differ are refused likewise (re-export them with one value,
    ``foresight export --spread S``); its default selection (``ScorerConfig.selection``) likewise. Provenance keys
    of :data:`AVERAGE_SHARED_PROVENANCE` that every member records with the same value (their traces, labels and
    train/held-out split) are carried over, so the ensemble still names the problems it never trained on.
    """
    if not scorers:
        raise ForesightError("average: no scorers given")
    first = scorers[0].config
    for s in scorers[1:]:
        c = s.config
        s.check_compatible(first.fingerprint)
        diff = [k for k in ("budget", "interval", "window", "feature_set", "decay")
                if getattr(c, k) != getattr(first, k)]
        if diff:
            raise ForesightError(f"average: scorer {s.source or '(in memory)'} differs from "
                                 f"{scorers[0].source or '(in memory)'} in {', '.join(diff)}")
    if temperature is None:
        temperature = _members_agree(scorers, "temperature", "temperatures",
                                     f"choose the ensemble's explicitly ({fix})")
    topk = {name: _members_agree(scorers, name, f"top-k {name} defaults", "re-export them with one value "
                                 f"(foresight export --{name.replace('_', '-')} X)") for name in TOPK_DEFAULTS}
    selection = _members_agree(scorers, "selection", "default selections",
                               "re-export them with one (foresight export --selection S)")
    provenance = dict(provenance or {"average_of": [s.source for s in scorers]})
    for key in AVERAGE_SHARED_PROVENANCE:  # the data every member trained on, where they agree (e.g. the split)
        values = [(s.config.provenance or {}).get(key) for s in scorers]
        if values[0] is not None and all(v == values[0] for v in values):
            provenance.setdefault(key, values[0])
    config = ScorerConfig(first.fingerprint, first.budget, first.interval, first.feature_set,
                          hidden=sum(s.config.hidden for s in scorers), decay=first.decay,
                          temperature=temperature, **topk, selection=selection, window=first.window,
                          provenance=provenance)
    out = Scorer(config, seed=None)
    n = len(scorers)
    w1 = [s.w1 / s.feature_std[..., None] for s in scorers]
    out.w1.copy_(torch.cat(w1, dim=-1))
    out.b1.copy_(torch.cat([s.b1 - torch.einsum("lkd,lkdh->lkh", s.feature_mean, w)
                            for s, w in zip(scorers, w1)], dim=-1))
    out.w2.copy_(torch.cat([s.w2 for s in scorers], dim=-1) / n)
    out.b2.copy_(sum(s.b2 for s in scorers) / n)
    return out


__all__ = ["AVERAGE_SHARED_PROVENANCE", "average_scorers"]
