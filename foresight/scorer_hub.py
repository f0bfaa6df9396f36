"""Scorers as Hugging Face Hub models, by ``huggingface_hub``'s conventions (those of its ``ModelHubMixin``).

A scorer directory is a Hub model repository: ``config.json`` (with ``"model_type": "foresight-scorer"``),
``model.safetensors`` and a ``README.md`` model card whose YAML metadata names the ``library_name``, ``license``,
``tags``, the ``base_model`` (the language model it serves, as a Hub id) and, where it was evaluated, the metrics
with the traces they were measured on (``model-index``, written by ``foresight export``).
:meth:`foresight.scorer.Scorer.from_pretrained` takes a Hub id (:func:`download`) besides a directory or a shipped
name, and :meth:`~foresight.scorer.Scorer.push_to_hub` uploads one (:func:`push_scorer`).

The metadata is built with ``huggingface_hub.ModelCardData``, so ``huggingface_hub.ModelCard`` parses what is
written.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from foresight.errors import ForesightError

MODEL_TYPE = "foresight-scorer"
LIBRARY_NAME = "foresightkv"
LICENSE = "apache-2.0"
TAGS = ["foresightkv", "kv-cache", "kv-cache-eviction", "long-reasoning"]
#: Hub ids of the built-in models (``foresight.load_model`` names), for a card's ``base_model``.
HUB_IDS = {"smollm2-135m": "HuggingFaceTB/SmolLM2-135M-Instruct"}
#: The files a scorer repository holds (what :func:`download` fetches).
REPO_FILES = ["config.json", "model.safetensors", "README.md", "fidelity.json"]


def looks_like_hub_id(name: str) -> bool:
    """``org/name``: two non-empty parts, no path syntax (a local path that does not exist is not tried online)."""
    parts = str(name).split("/")
    return len(parts) == 2 and all(parts) and not str(name).startswith((".", "/", "~")) and "\\" not in str(name)


def base_model_id(fingerprint: dict) -> str | None:
    """The Hub id of the model a scorer serves: a built-in name's (:data:`HUB_IDS`), or the fingerprint's model name
    when it is a Hub id; None for a local directory (``foresight export --base-model`` names it then)."""
    name = str(fingerprint.get("model") or "")
    if name in HUB_IDS:
        return HUB_IDS[name]
    return name if looks_like_hub_id(name) else None


def card_data(config, *, records: list[dict] | None = None, source: str | None = None,
              base_model: str | None = None, name: str | None = None):
    """``huggingface_hub.ModelCardData`` of a scorer: library, license, tags, ``base_model`` and, from fidelity
    ``records`` (``foresight eval fidelity`` output, read from ``source``), each policy's loss ratio with the traces
    it was measured on."""
    from huggingface_hub import EvalResult, ModelCardData

    base = base_model or base_model_id(config.fingerprint)
    results = []
    for r in records or []:
        ratio = r.get("loss_ratio")
        if not isinstance(ratio, (int, float)) or ratio != ratio:
            continue
        budget = r.get("budget", config.budget)
        traces = f"{r['traces']} held-out traces" if isinstance(r.get("traces"), int) else "held-out traces"
        results.append(EvalResult(
            task_type="kv-cache-eviction", task_name=f"KV-cache eviction at B={budget}, W={config.interval}",
            dataset_type="foresightkv-traces", dataset_name=f"{traces} ({source})" if source else traces,
            metric_type="loss_ratio", metric_value=round(float(ratio), 4),
            metric_name=f"loss ratio, {r['policy']} (B={budget}; 1.0 = full cache, lower is better)"))
    return ModelCardData(
        library_name=LIBRARY_NAME, license=LICENSE, tags=list(TAGS), base_model=base,
        model_name=name or f"foresightkv scorer for {config.fingerprint.get('model', '?')} "
                           f"(B={config.budget}, W={config.interval})",
        eval_results=results or None)


def card_header(data) -> str:
    """The YAML front matter of a model card from :func:`card_data`."""
    return f"---\n{data.to_yaml()}\n---\n"


def download(repo_id: str, *, revision: str | None = None, token: str | bool | None = None,
             cache_dir: str | Path | None = None, local_files_only: bool = False) -> Path:
    """The local snapshot of the scorer repository ``repo_id`` (its :data:`REPO_FILES`), downloaded once into the
    Hugging Face cache. Offline, or a repository that cannot be read: one :class:`ForesightError` line."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, OfflineModeIsEnabled

    try:
        return Path(snapshot_download(repo_id, revision=revision, token=token, cache_dir=cache_dir,
                                      local_files_only=local_files_only, allow_patterns=REPO_FILES))
    except (LocalEntryNotFoundError, OfflineModeIsEnabled, HfHubHTTPError, OSError, ValueError) as exc:
        detail = " ".join(str(exc).split())[:300] or type(exc).__name__
        raise ForesightError(f"scorer {repo_id!r} is not a local directory nor a shipped scorer, and the Hugging Face "
                             f"Hub did not give it ({type(exc).__name__}: {detail}); offline, pass the directory of "
                             "a downloaded copy") from None


def push(directory: Path, repo_id: str, *, private: bool | None = None, token: str | None = None,
         revision: str | None = None, commit_message: str = "Upload foresightkv scorer") -> str:
    """Upload a saved scorer directory to the Hub model repository ``repo_id`` (created if missing); returns the
    commit URL."""
    from huggingface_hub import HfApi

    api = HfApi(token=token)
    repo_id = api.create_repo(repo_id=repo_id, private=private, exist_ok=True).repo_id
    return str(api.upload_folder(repo_id=repo_id, repo_type="model", folder_path=str(directory),
                                 commit_message=commit_message, revision=revision))


def push_scorer(scorer, repo_id: str, *, private: bool | None = None, token: str | None = None,
                revision: str | None = None, commit_message: str = "Upload foresightkv scorer") -> str:
    """Upload ``scorer`` (:meth:`foresight.scorer.Scorer.push_to_hub`): its ``save_pretrained`` files plus the
    model card and ``fidelity.json`` of the directory it was loaded from (``foresight export`` output), else a card
    with the YAML metadata alone (:func:`push`). Returns the commit URL."""
    with tempfile.TemporaryDirectory(prefix="foresight-scorer-") as tmp:
        out = Path(tmp) / "scorer"
        scorer.save_pretrained(out)
        for name in ("README.md", "fidelity.json"):
            if scorer.source and (Path(scorer.source) / name).is_file():
                shutil.copyfile(Path(scorer.source) / name, out / name)
        if not (out / "README.md").is_file():
            (out / "README.md").write_text(card_header(card_data(scorer.config)) + "\n# foresightkv eviction "
                                           "scorer\n\nLoad it with `Scorer.from_pretrained(repo_id)`.\n")
        return push(out, repo_id, private=private, token=token, revision=revision, commit_message=commit_message)


__all__ = ["HUB_IDS", "LIBRARY_NAME", "MODEL_TYPE", "base_model_id", "card_data", "card_header", "download",
           "looks_like_hub_id", "push", "push_scorer"]
