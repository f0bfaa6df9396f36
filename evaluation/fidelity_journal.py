"""Crash-safe progress of :func:`evaluation.fidelity.evaluate_fidelity`: every finished batch of traces appends
its per-trace sums to a JSON-lines journal, so a killed evaluation resumes at the batch where it stopped and ends
with exactly the numbers of an uninterrupted run (the same sums, added in the same order).

The first line names what the sums belong to: the model's fingerprint, a digest of the very token ids and trace
ids, every (policy, budget) with its settings and a digest of what it learned or replays (a scorer's weights,
golden's labels), W, sinks, the batch size, the weights' dtype (when not float32, so earlier journals resume) and the
reference dtype. A journal of anything else is refused in one line, never mixed in; a last line cut short by a crash
is dropped and that batch is replayed; a record that is not its batch's (other traces, another plan, a damaged line)
is refused (:func:`evaluation.fidelity.evaluate_fidelity` checks each before reusing it). Every record carries the
SHA-256 of its own content (:func:`record_checksum`), so a number edited by hand (one trace's sum changed) is
refused by line, never reported.

Sharded over ranks (``rank``/``world_size``), each rank appends to its own file beside the journal
(``<stem>.rank<r>of<w><suffix>``, :func:`rank_path`) and reads every rank's file, so an evaluation run again in one
process (or by any rank) finds the batches the others finished; :func:`remove_journal` deletes them all.
"""

from __future__ import annotations

import glob
import hashlib
import json
from pathlib import Path
from typing import Sequence

import torch

from foresight.atomic import append_text
from foresight.errors import ForesightError

FORMAT = "foresight-fidelity-journal/2"  # /2: a checksum per record


def record_checksum(record: dict) -> str:
    """SHA-256 of a journal record's content (its keys sorted, ``sha256`` itself left out)."""
    body = {k: v for k, v in record.items() if k != "sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def tokens_digest(trace_ids: Sequence[str], sequences: Sequence[Sequence[int]]) -> str:
    """SHA-256 of the trace ids and their token ids, in evaluation order."""
    h = hashlib.sha256()
    for tid, seq in zip(trace_ids, sequences):
        h.update(json.dumps([str(tid), [int(t) for t in seq]]).encode())
    return h.hexdigest()


def weights_digest(policy) -> str | None:
    """SHA-256 of the parameters of a policy's scorer (``None`` for a policy without one)."""
    scorer = getattr(policy, "_scorer", None)
    if not isinstance(scorer, torch.nn.Module):
        return None
    h = hashlib.sha256()
    for name, tensor in sorted(scorer.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().to("cpu", torch.float64).contiguous().numpy().tobytes())
    return h.hexdigest()


def policy_digest(policy) -> str | None:
    """What identifies a policy beyond its ``config()``: its scorer's weights (:func:`weights_digest`), or the
    content of what it replays (``content_digest()``, e.g. the golden policy's labels); ``None`` for neither."""
    content = getattr(policy, "content_digest", None)
    return content() if callable(content) else weights_digest(policy)


def _normal(obj) -> object:
    return json.loads(json.dumps(obj, sort_keys=True, default=str))


def rank_path(path: str | Path, rank: int, world_size: int) -> Path:
    """The file rank ``rank`` of ``world_size`` appends to: ``path`` itself in one process."""
    path = Path(path)
    return path if world_size == 1 else path.with_name(f"{path.stem}.rank{rank}of{world_size}{path.suffix}")


def journal_files(path: str | Path) -> list[Path]:
    """The files of the journal at ``path`` on disk: the one-process file and every rank's (:func:`rank_path`)."""
    path = Path(path)
    ranks = sorted(path.parent.glob(f"{glob.escape(path.stem)}.rank*of*{glob.escape(path.suffix)}"))
    return [f for f in [path, *ranks] if f.is_file()]


def remove_journal(path: str | Path) -> None:
    """Delete the journal at ``path``, every rank's file with it (the evaluation's results are written)."""
    for f in journal_files(path):
        f.unlink(missing_ok=True)


def rank_done_note(rank: int, world_size: int, out: str | Path) -> str:
    """What a rank of a sharded evaluation prints when its share is journalled in ``out``: the results are written
    once, by the same command run in one process, which finds every rank's batches."""
    return (f"rank {rank}/{world_size}: my batches are journalled in {out}; once every rank is done, run the same "
            "command in one process (without RANK/WORLD_SIZE) to write the results")


class FidelityJournal:
    """The journal at ``path`` for the evaluation ``identity`` (a JSON-able dict), written by ``rank`` of
    ``world_size``; ``done`` maps the first trace index of every finished batch, of any rank's file, to its record."""

    def __init__(self, path: str | Path, identity: dict, rank: int = 0, world_size: int = 1):
        self.main, self.identity = Path(path), _normal(identity)
        self.path = rank_path(path, rank, world_size)
        self.done: dict[int, dict] = {}
        for f in journal_files(self.main):
            self._load(f, write=f == self.path)

    def _load(self, path: Path, write: bool) -> None:
        """Read ``path``'s finished batches; a last line cut short is dropped (from the file too when it is this
        rank's own: another rank's file may be growing)."""
        lines = path.read_text().splitlines()
        try:
            header = json.loads(lines[0]) if lines else None
        except json.JSONDecodeError:
            header = None
        if isinstance(header, dict) and str(header.get("format", "")).startswith("foresight-fidelity-journal/"):
            if header["format"] != FORMAT:
                raise ForesightError(f"{path}: a fidelity journal of another version ({header['format']}, not "
                                     f"{FORMAT}); delete it to start over")
        else:
            raise ForesightError(f"{path}: not a fidelity journal ({FORMAT}); move it away or choose another "
                                 "output directory")
        theirs = header.get("identity") or {}
        for key in sorted(set(theirs) | set(self.identity)):
            if theirs.get(key) != self.identity.get(key):
                raise ForesightError(f"{path}: the journal of another evaluation ({key} differs); delete it to "
                                     "start over, or choose another output directory")
        kept = [lines[0]]
        for i, line in enumerate(lines[1:], 2):
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                break  # cut short by a crash: that batch is replayed
            if not (isinstance(rec, dict) and isinstance(rec.get("start"), int) and not isinstance(rec["start"], bool)
                    and isinstance(rec.get("policies"), dict)):
                raise ForesightError(f"{path}: line {i} is not a batch record (a 'start' index and "
                                     "'policies'); delete the journal to start over")
            if rec.get("sha256") != record_checksum(rec):
                raise ForesightError(f"{path}: line {i} was changed since it was written (its SHA-256 differs); "
                                     "delete the journal to start over")
            self.done[rec["start"]] = rec
            kept.append(line)
        if write and len(kept) < len(lines):
            self._write("".join(k + "\n" for k in kept), "w")

    def _write(self, text: str, mode: str) -> None:
        append_text(self.path, text, mode)

    def add(self, record: dict) -> None:
        """Append one finished batch's record (written through to disk before the next batch starts)."""
        if not self.path.exists():
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._write(json.dumps({"format": FORMAT, "identity": self.identity}) + "\n", "w")
        record = {**record, "sha256": record_checksum(record)}
        self._write(json.dumps(record) + "\n", "a")
        self.done[int(record["start"])] = record


__all__ = ["FORMAT", "FidelityJournal", "journal_files", "policy_digest", "rank_done_note", "rank_path",
           "record_checksum", "remove_journal", "tokens_digest", "weights_digest"]
