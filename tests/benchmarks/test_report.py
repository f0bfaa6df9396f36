"""benchmarks/report.py: the half- and quarter-memory comparison (its by-length groups, the records it needs)."""

from __future__ import annotations

import json
import random

import pytest

from foresight.errors import ForesightError
from tests.conftest import load_script


def test_by_length_groups_and_pools_as_by_hand():
    by_length = load_script("report.py").by_length
    rng = random.Random(0)
    ids = [f"t{i}" for i in range(10)]
    positions = {t: rng.randint(5, 400) for t in ids}
    small = {t: [rng.uniform(1, 9), rng.uniform(1, 5), positions[t]] for t in ids}
    large = {t: [rng.uniform(1, 9), small[t][1], positions[t]] for t in ids}
    groups = by_length(small, large, ids)
    order = sorted(ids, key=lambda t: (positions[t], t))
    expect = [order[:3], order[3:6], order[6:]]  # the last group takes the remainder
    assert [g["traces"] for g in groups] == [3, 3, 4]
    for g, members in zip(groups, expect):
        assert g["positions"] == (positions[members[0]], positions[members[-1]])
        full = sum(small[t][1] for t in members)
        assert g["small"] == pytest.approx(sum(small[t][0] for t in members) / full)
        assert g["large"] == pytest.approx(sum(large[t][0] for t in members) / full)
        assert g["wins"] == sum(small[t][0] < large[t][0] for t in members)  # same full-cache CE per trace


def test_across_numbers_needs_golden_beside_learned(tmp_path, monkeypatch):
    """A record of learned alone is refused in one line naming the file and the missing policy, not reported without
    the oracle's row."""
    report = load_script("report.py")
    monkeypatch.setattr(report, "RECORDS", tmp_path)
    (tmp_path / "across_B64_from160").mkdir()
    rec = {"policy": "learned", "budget": 64, "interval": 16, "score_from": 160}
    (tmp_path / "across_B64_from160" / "fidelity.json").write_text(json.dumps([rec]))
    with pytest.raises(ForesightError, match=r"across_B64_from160/fidelity\.json: no golden record at B=64, W=16 "
                                             r"scored from position 160"):
        report.across_numbers((64, 16), (128, 32), [])
