"""benchmarks/gpu/bench_decode.py (run by benchmarks/gpu/run.sh): its CPU dry run with a tiny model prints the table."""

from __future__ import annotations

import pytest

from tests.conftest import load_script


@pytest.mark.slow
def test_dry_run_prints_every_side(capsys):
    mod = load_script("gpu/bench_decode.py")
    assert mod.main(["--dry-run"]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("| shape"))
    assert all(side in header for side in mod.SIDES)
    row = next(line for line in out.splitlines() if line.startswith("| tiny, 2, 40+24, 16/4"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert len(cells) == len(mod.SIDES) + 2 and float(cells[-1]) < 0.5  # h2o held at most B + W of 64 entries
    assert all(float(c.split()[0]) > 0 for c in cells[1:-1])
