"""The learned eviction scorer: a tiny MLP per (layer, KV head) (docs/training.md).

``score = Linear(H->1)(GELU(Linear(D->H)(standardise(x))))`` with separate weights for every layer and KV
head, evaluated for all heads at once with batched matmuls (``einsum``). The output is a *keep* score
(higher = keep), the convention of every :class:`~foresight.policies.base.EvictionPolicy`; the method's
eviction score is its negation ``phi = -score``.

Inputs are the features of :class:`foresight.features.FeatureExtractor`; they are standardised per
(layer, KV head, feature) with ``feature_mean`` / ``feature_std`` buffers fitted on training features
(:meth:`Scorer.fit_normalizer`) and saved with the weights, so the exported scorer is self-contained.

A scorer directory holds ``config.json`` (:class:`ScorerConfig`: base-model fingerprint, B, W, feature set,
hidden size, provenance; ``"model_type": "foresight-scorer"``) and ``model.safetensors``: a Hugging Face Hub model
repository (:mod:`foresight.scorer_hub`), loaded with :meth:`Scorer.from_pretrained` from a directory, a shipped
scorer's name or a Hub id, written with :meth:`Scorer.save_pretrained` and uploaded with :meth:`Scorer.push_to_hub`.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from foresight.atomic import atomic_directory
from foresight.config import check_fields, check_keys, check_value
from foresight.errors import ForesightError
from foresight.features import DEFAULT_FEATURE_SET, FeatureExtractor, check_feature_set, feature_dim
from foresight.fingerprint import check_same_model, file_sha256
from foresight.scorer_files import carry_files, read_weights, write_weights
from foresight.scorer_hub import MODEL_TYPE, download, looks_like_hub_id, push_scorer

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
#: Scorers shipped with the package, one directory per short name (``foresight/scorers/<name>/``).
SHIPPED_DIR = Path(__file__).resolve().parent / "scorers"
#: The ``learned`` policy arguments a scorer may record as its ``selection=topk`` defaults (ScorerConfig fields of
#: these names, written by ``foresight export``); an explicit policy argument overrides them.
TOPK_DEFAULTS = ("spread", "newcomer_bonus", "age_prior")
#: The ``learned`` policy's selections: ``topk`` keeps the highest scores, ``sample`` draws the evicted set
#: (:func:`foresight.sampling.sample_eviction`). A scorer may record one as its default (``ScorerConfig.selection``).
SELECTIONS = ("topk", "sample")


def shipped_scorers() -> dict[str, Path]:
    """The pretrained scorers shipped with the package, by short name (usable wherever a scorer dir is)."""
    if not SHIPPED_DIR.is_dir():
        return {}
    return {d.name: d for d in sorted(SHIPPED_DIR.iterdir()) if (d / CONFIG_NAME).is_file()}


def resolve_scorer(path_or_name: str | Path) -> Path:
    """A scorer directory from a path or a shipped scorer's short name (an existing path wins)."""
    path = Path(path_or_name)
    if path.exists():
        return path
    return shipped_scorers().get(str(path_or_name), path)


def scorer_sha256(path_or_name: str | Path) -> str:
    """SHA-256 of a scorer's weights file (a directory or a shipped short name), the identity results record:
    a short name may later point at newer weights."""
    weights = resolve_scorer(path_or_name) / WEIGHTS_NAME
    if not weights.is_file():
        raise ForesightError(f"scorer {path_or_name}: no {WEIGHTS_NAME} in {weights.parent}")
    return file_sha256(weights)


class ScorerMismatchError(ForesightError):
    """A scorer was trained for a different model (layers, heads or head dim differ)."""


@dataclass
class ScorerConfig:
    """Everything needed to rebuild a scorer and to check it fits a model.

    Parameters
    ----------
    fingerprint
        :func:`foresight.model_fingerprint` of the base model.
    budget, interval
        B and W of the cache the scorer runs in: the (B, W) it was trained at, unless ``foresight export --budget B
        --interval W`` moved it to another cache (then ``window`` keeps the W it was trained at).
    feature_set
        Feature groups of :mod:`foresight.features`.
    hidden
        Hidden width of the per-head MLP (the method: 16).
    decay
        Decay of the decayed cumulative attention feature.
    temperature
        Plackett–Luce temperature the scorer's sampled evictions were trained with (written by GRPO;
        ``None`` for a distilled scorer); the default of the ``learned`` policy's ``selection=sample``.
    spread
        The default ``spread`` of the ``learned`` policy's ``selection=topk`` (:func:`foresight.sampling.spread_keep`),
        chosen on validation traces when the scorer is exported; ``None`` is plain top-k.
    newcomer_bonus
        The default ``newcomer_bonus`` of the ``learned`` policy's ``selection=topk`` (a margin for the candidates
        judged for the first time), chosen likewise; ``None`` is no margin.
    age_prior
        The default ``age_prior`` of the ``learned`` policy's ``selection=topk`` (``lam``: every score less
        ``lam * log1p(age)``, :func:`foresight.feature_groups.log_age`), chosen on long validation traces;
        ``None`` is no prior.
    window
        The extractor's recent-query window (its max/min/sum statistics over the last ``window`` queries) when it
        differs from ``interval``: the W a scorer moved to another cache was trained at, so its features are the
        ones it learned from; ``None`` is ``interval``.
    selection
        The ``learned`` policy's default selection for this scorer (one of :data:`SELECTIONS`), chosen on trace sets
        when the scorer is exported; ``None`` is ``topk``. ``sample`` needs a recorded ``temperature``.
    provenance
        Free-form record of how the scorer was made (data, steps, git commit, ...).
    """

    fingerprint: dict
    budget: int
    interval: int
    feature_set: tuple[str, ...] = DEFAULT_FEATURE_SET
    hidden: int = 16
    decay: float = 0.9
    temperature: float | None = None
    spread: float | None = None
    newcomer_bonus: float | None = None
    age_prior: float | None = None
    selection: str | None = None
    window: int | None = None
    provenance: dict = field(default_factory=dict)

    def __post_init__(self):
        check_fields(self, "scorer config key")  # the type of every key (4.0 -> 4; 4.5, "16" or null refused)
        missing = [k for k in ("num_layers", "num_kv_heads", "num_heads", "head_dim") if k not in self.fingerprint]
        if missing:
            raise ValueError(f"fingerprint lacks {', '.join(missing)}; use foresight.model_fingerprint(model)")
        for k in ("num_layers", "num_kv_heads", "num_heads", "head_dim"):  # the network's shape is built from them
            if check_value(f"fingerprint.{k}", self.fingerprint[k], "int", "scorer config key") <= 0:
                raise ValueError(f"fingerprint.{k} must be a positive integer, got {self.fingerprint[k]!r}")
        if int(self.fingerprint["num_heads"]) % int(self.fingerprint["num_kv_heads"]):
            raise ValueError(f"fingerprint.num_heads ({self.fingerprint['num_heads']}) must be a multiple of "
                             f"fingerprint.num_kv_heads ({self.fingerprint['num_kv_heads']})")
        if self.budget <= 0 or self.interval <= 0 or self.interval >= self.budget:
            raise ValueError(f"need 0 < interval < budget, got budget={self.budget} interval={self.interval}")
        if self.window is not None and self.window <= 0:
            raise ValueError(f"window must be a positive integer (or null), got {self.window}")
        if self.window == self.interval:  # one way to write each scorer: the default is the interval
            self.window = None
        if self.hidden <= 0:
            raise ValueError(f"hidden must be positive, got {self.hidden}")
        if not 0.0 <= self.decay <= 1.0:  # the feature extractor's range, checked when the scorer loads
            raise ValueError(f"decay must be in [0, 1], got {self.decay}")
        if self.temperature is not None and not (math.isfinite(float(self.temperature)) and self.temperature > 0):
            raise ValueError(f"temperature must be a finite number > 0 (or null), got {self.temperature}")
        for name in TOPK_DEFAULTS:
            value = getattr(self, name)
            if value is not None and not (math.isfinite(float(value)) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0 (or null), got {value}")
        if self.selection is not None and self.selection not in SELECTIONS:
            raise ValueError(f"selection must be one of {', '.join(SELECTIONS)} (or null), got {self.selection!r}")
        if self.selection == "sample" and self.temperature is None:  # it would sample at 1.0, which nobody chose
            raise ValueError("selection 'sample' needs a recorded temperature (the one its draws run at)")
        self.feature_set = check_feature_set(self.feature_set)

    @property
    def num_layers(self) -> int:
        return int(self.fingerprint["num_layers"])

    @property
    def num_kv_heads(self) -> int:
        return int(self.fingerprint["num_kv_heads"])

    @property
    def num_groups(self) -> int:
        return int(self.fingerprint["num_heads"]) // self.num_kv_heads

    @property
    def input_dim(self) -> int:
        return feature_dim(self.feature_set, int(self.fingerprint["head_dim"]), self.num_groups)

    @property
    def feature_window(self) -> int:
        """The extractor's recent-query window: ``window``, else ``interval``."""
        return self.window or self.interval

    def moved_to(self, budget: int, interval: int) -> "ScorerConfig":
        """This config for a cache of another (B, W), keeping the feature window the scorer was trained with (its
        features stay the ones it learned from); moved back to its window's W, ``window`` is the default again.
        ``foresight export --budget --interval`` and GRPO at another (B, W) move a scorer this way."""
        return replace(self, budget=budget, interval=interval, window=self.feature_window)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["feature_set"] = list(self.feature_set)
        if d["window"] is None:  # written only when set, so every earlier config reads and writes as it was
            d.pop("window")
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "ScorerConfig":
        d = dict(d)
        kind = d.pop("model_type", MODEL_TYPE)  # written by save_config; configs made before it have none
        if kind != MODEL_TYPE:
            raise ValueError(f"model_type is {kind!r}, not {MODEL_TYPE!r}: not a foresightkv scorer config")
        # an unknown key (a misspelt "decy") would be dropped and its default used without a word
        return cls(**check_keys(d, (f.name for f in fields(cls) if f.init), "scorer config"))

    def extractor(self) -> FeatureExtractor:
        """The feature extractor matching this scorer (the only way features are built)."""
        return FeatureExtractor(window=self.feature_window, feature_set=self.feature_set, decay=self.decay)


def layer_scores(x: torch.Tensor, w1, b1, w2, b2, mean, std) -> torch.Tensor:
    """One layer's (..., Hkv, n) keep scores of features ``x`` (..., Hkv, n, D), given that layer's parameters
    (:meth:`Scorer.layer_params`): standardise, then each KV head's MLP."""
    x = (x.to(w1.dtype) - mean[:, None, :]) / std[:, None, :]
    h = F.gelu(torch.einsum("...knd,kdh->...knh", x, w1) + b1[:, None, :])
    return torch.einsum("...knh,kh->...kn", h, w2) + b2[:, None]


def layers_scores(x: torch.Tensor, w1, b1, w2, b2, mean, std) -> torch.Tensor:
    """:func:`layer_scores` of several layers at once: features ``x`` (L, ..., Hkv, n, D) and the layers' stacked
    parameters (:meth:`Scorer.layer_params` of a slice) give (L, ..., Hkv, n) scores."""
    lead = x.shape[1:-3]
    L, K, n, D = x.shape[0], x.shape[-3], x.shape[-2], x.shape[-1]
    x = x.reshape(L, -1, K, n, D).to(w1.dtype)
    x = (x - mean[:, None, :, None, :]) / std[:, None, :, None, :]
    h = F.gelu(torch.einsum("lbknd,lkdh->lbknh", x, w1) + b1[:, None, :, None, :])
    out = torch.einsum("lbknh,lkh->lbkn", h, w2) + b2[:, None, :, None]
    return out.reshape(L, *lead, K, n)


class Scorer(nn.Module):
    """Per-(layer, KV head) MLP ranking cache entries; see the module docstring.

    ``scorer(x, layer_idx)`` maps (..., Hkv, n, D) features of one layer to (..., Hkv, n) keep scores;
    ``scorer(x)`` maps (L, ..., Hkv, n, D) features of all layers to (L, ..., Hkv, n), and ``scorer(x, layers)``
    with a slice those of the layers it picks.
    """

    def __init__(self, config: ScorerConfig, seed: int | None = 0):
        super().__init__()
        self.config = config
        self.source: str | None = None  # the directory it was loaded from, for messages
        L, K, D, H = config.num_layers, config.num_kv_heads, config.input_dim, config.hidden
        self.w1 = nn.Parameter(torch.empty(L, K, D, H))
        self.b1 = nn.Parameter(torch.empty(L, K, H))
        self.w2 = nn.Parameter(torch.empty(L, K, H))
        self.b2 = nn.Parameter(torch.zeros(L, K))
        self.register_buffer("feature_mean", torch.zeros(L, K, D))
        self.register_buffer("feature_std", torch.ones(L, K, D))
        gen = torch.Generator().manual_seed(seed) if seed is not None else None
        with torch.no_grad():  # nn.Linear's default init, per head
            b = 1.0 / math.sqrt(D)
            self.w1.copy_(torch.rand(L, K, D, H, generator=gen) * 2 * b - b)
            self.b1.copy_(torch.rand(L, K, H, generator=gen) * 2 * b - b)
            b = 1.0 / math.sqrt(H)
            self.w2.copy_(torch.rand(L, K, H, generator=gen) * 2 * b - b)

    def forward(self, x: torch.Tensor, layer_idx: int | slice | None = None) -> torch.Tensor:
        if isinstance(layer_idx, int):
            return layer_scores(x, *self.layer_params(layer_idx))
        return layers_scores(x, *self.layer_params(slice(None) if layer_idx is None else layer_idx))

    def layer_params(self, layer_idx: int | slice) -> tuple[torch.Tensor, ...]:
        """Layer ``layer_idx``'s ``(w1, b1, w2, b2, feature_mean, feature_std)``, the arguments of
        :func:`layer_scores` (of :func:`layers_scores` for a slice of layers)."""
        return (self.w1[layer_idx], self.b1[layer_idx], self.w2[layer_idx], self.b2[layer_idx],
                self.feature_mean[layer_idx], self.feature_std[layer_idx])

    # -- normalisation ----------------------------------------------------------------------------------------
    @torch.no_grad()
    def fit_normalizer(self, features: torch.Tensor, min_std: float = 1e-4) -> None:
        """Set per-(layer, head, feature) mean/std from training features (L, ..., Hkv, n, D)."""
        L, K, D = features.shape[0], features.shape[-3], features.shape[-1]
        x = features.float().transpose(1, -3).reshape(L, K, -1, D) if features.dim() > 4 else features.float()
        self.feature_mean.copy_(x.mean(2))
        self.feature_std.copy_(x.std(2, unbiased=False).clamp(min=min_std))

    # -- compatibility ----------------------------------------------------------------------------------------
    def check_compatible(self, model_or_fingerprint) -> None:
        """Raise :class:`ScorerMismatchError` unless the model is the one this scorer was trained for
        (:func:`foresight.fingerprint.check_same_model`)."""
        check_same_model(self.config.fingerprint, model_or_fingerprint, f"scorer {self.source or '(in memory)'}",
                         fix="run it with the model it was trained for, or use a scorer trained for this model",
                         error=ScorerMismatchError)

    def check_shape(self, num_layers: int, num_kv_heads: int | None = None, num_groups: int | None = None,
                    head_dim: int | None = None) -> None:
        """Like :meth:`check_compatible` from the shapes a policy sees at run time."""
        cfg = self.config
        got = {"num_layers": num_layers, "num_kv_heads": num_kv_heads, "num_groups": num_groups, "head_dim": head_dim}
        want = {"num_layers": cfg.num_layers, "num_kv_heads": cfg.num_kv_heads, "num_groups": cfg.num_groups,
                "head_dim": int(cfg.fingerprint["head_dim"])}
        diff = [f"{k}: scorer {want[k]} vs model {v}" for k, v in got.items() if v is not None and v != want[k]]
        if diff:
            raise ScorerMismatchError(
                f"scorer trained for {cfg.fingerprint.get('model', '?')!r} does not fit this model ({'; '.join(diff)})"
            )

    # -- persistence ------------------------------------------------------------------------------------------
    def save_config(self, directory: str | Path) -> Path:
        """Write ``config.json`` into ``directory`` (:meth:`save_pretrained` adds the weights)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        config = {"model_type": MODEL_TYPE, **self.config.to_dict()}
        (directory / CONFIG_NAME).write_text(json.dumps(config, indent=2, default=str))
        return directory

    def save_pretrained(self, directory: str | Path) -> Path:
        """Write ``config.json`` and ``model.safetensors`` into ``directory``, atomically: both go into a hidden
        temporary sibling, which then takes ``directory``'s place by renames, so an error or a kill never leaves a
        torn scorer (:func:`~foresight.atomic.atomic_directory`: an existing ``directory`` stays whole until the new one is complete; its
        other files are kept)."""
        directory = Path(directory)
        target = directory.resolve()  # through a symlink, as writing into it did
        with atomic_directory(directory) as tmp:
            carry_files(target, tmp, skip=(CONFIG_NAME, WEIGHTS_NAME))
            self.save_config(tmp)
            write_weights(self.state_dict(), tmp / WEIGHTS_NAME)
        return directory

    def push_to_hub(self, repo_id: str, *, private: bool | None = None, token: str | None = None,
                    revision: str | None = None, commit_message: str = "Upload foresightkv scorer") -> str:
        """Upload this scorer to the Hub model repository ``repo_id`` with its model card
        (:func:`foresight.scorer_hub.push_scorer`); returns the commit URL."""
        return push_scorer(self, repo_id, private=private, token=token, revision=revision,
                           commit_message=commit_message)

    @classmethod
    def from_pretrained(cls, directory: str | Path, model=None, device: str | torch.device | None = None, *,
                        revision: str | None = None, token: str | bool | None = None,
                        cache_dir: str | Path | None = None, local_files_only: bool = False) -> "Scorer":
        """Load a scorer from a directory, a shipped scorer's name or a Hugging Face Hub id (``org/name``, fetched
        into the Hub cache with ``revision``, ``token``, ``cache_dir``, ``local_files_only`` as in
        ``huggingface_hub``; offline, one line saying so); with ``model`` given, also :meth:`check_compatible`.

        Only JSON and safetensors are read (nothing is unpickled). Every tensor must be finite: a NaN or Inf
        weight raises :class:`ForesightError` naming the file and the tensor (such a scorer ranks at random
        while looking healthy).
        """
        directory = resolve_scorer(directory)
        if not directory.exists() and looks_like_hub_id(str(directory)):
            directory = download(str(directory), revision=revision, token=token, cache_dir=cache_dir,
                                 local_files_only=local_files_only)
        if not (directory / CONFIG_NAME).is_file() or not (directory / WEIGHTS_NAME).is_file():
            names = ", ".join(shipped_scorers()) or "none"
            raise ForesightError(f"{directory} is not a scorer directory (needs {CONFIG_NAME} and {WEIGHTS_NAME}) "
                                 f"nor the name of a shipped scorer ({names})")
        try:
            config = ScorerConfig.from_dict(json.loads((directory / CONFIG_NAME).read_text()))
        except (json.JSONDecodeError, TypeError, ValueError, AttributeError) as exc:
            raise ForesightError(f"{directory / CONFIG_NAME} is not a valid scorer config ({exc})") from None
        scorer = cls(config, seed=None)
        weights = directory / WEIGHTS_NAME
        state = read_weights(weights)
        try:
            scorer.load_state_dict(state)
        except RuntimeError as exc:
            raise ForesightError(f"{weights} does not match {directory / CONFIG_NAME}: "
                                 f"{' '.join(str(exc).split())[:300]}") from None
        scorer.source = str(directory)
        if model is not None:
            scorer.check_compatible(model)
        if device is not None:
            scorer.to(device)
        return scorer.eval()


__all__ = ["CONFIG_NAME", "WEIGHTS_NAME", "Scorer", "ScorerConfig", "ScorerMismatchError"]
