"""``foresight bench``: exact token counts, peak KV accounting, policy-hook timing and the CLI."""

from __future__ import annotations

import json

import pytest

from evaluation.efficiency import bench_table, benchmark, kv_bytes
from foresight.cli import main


def test_benchmark_records(tiny_llama):
    model, tok = tiny_llama
    prompt = "x" * 20  # 20 byte tokens, below the budget
    recs = benchmark(model, tok, ["streaming_llm", "h2o"], 32, 8, 40, repeats=2, prompt=prompt, warmup=False)
    by = {r["policy"]: r for r in recs}
    assert list(by) == ["full", "streaming_llm", "h2o"]
    # full holds the prompt and every generated token but the last (never fed back)
    assert by["full"]["peak_kv_entries"] == 20 + 40 - 1
    for name in ("streaming_llm", "h2o"):
        assert by[name]["peak_kv_entries"] == 32 + 8  # the cache peaks at B + W right before an event
        assert by[name]["evictions"] > 0
        assert by[name]["kv_bytes_vs_full"] == pytest.approx(40 / 59)
    # K and V, fp32, 2 layers x 2 KV heads x head_dim 16
    assert by["full"]["peak_kv_bytes"] == 59 * 2 * 2 * 16 * 2 * 4 == kv_bytes(model, [59, 59], 1)
    assert by["full"]["speed_vs_full"] == 1.0 and by["full"]["policy_seconds"] == 0.0
    assert by["h2o"]["policy_seconds"] > 0  # h2o observes attention at every step: its hooks are timed
    assert all(len(r["seconds"]) == 2 and r["tokens_per_s"] > 0 for r in recs)
    table = bench_table(recs)
    assert table.splitlines()[2].startswith("| full |")


def test_progress_bar_counts_every_timed_run(tiny_llama, capsys):
    model, tok = tiny_llama
    benchmark(model, tok, ["h2o"], 32, 8, 12, repeats=2, prompt="x" * 20, warmup=False, progress=True)
    err = capsys.readouterr().err
    assert "bench" in err and "4/4" in err  # full and h2o, twice each
    benchmark(model, tok, ["h2o"], 32, 8, 12, repeats=1, prompt="x" * 20, warmup=False)
    assert "bench" not in capsys.readouterr().err  # off unless asked


def test_two_specs_of_one_policy_class_are_both_measured(tiny_llama):
    """caote:h2o and caote:tova share the class name "caote": keyed by it, only the first was measured, as "caote"."""
    model, tok = tiny_llama
    recs = benchmark(model, tok, ["caote:h2o", "caote:tova"], 32, 8, 24, repeats=1, prompt="x" * 20, warmup=False)
    by = {r["policy"]: r for r in recs}
    assert list(by) == ["full", "caote:h2o", "caote:tova"]
    assert all(by[n]["evictions"] > 0 and by[n]["peak_kv_entries"] == 40 for n in ("caote:h2o", "caote:tova"))


def test_cli_writes_json_and_table(tmp_path, capsys):
    out = tmp_path / "bench"
    rc = main(["bench", "--model", "tiny-llama", "--policies", "random", "--budget", "32", "--interval", "8",
               "--new-tokens", "16", "--repeats", "1", "--prompt", "hello", "--out", str(out)])
    assert rc == 0
    data = json.loads((out / "bench.json").read_text())
    assert [r["policy"] for r in data["records"]] == ["full", "random"]
    assert all(r["new_tokens"] == 16 for r in data["records"])
    got = capsys.readouterr()
    assert "| random | 32 |" in got.out and "bench" in got.err  # the progress bar is on by default


def test_cli_records_the_sinks_and_policy_args_it_ran_with(tmp_path, capsys):
    """--sinks and --policy-arg changed what was timed, yet bench.json and bench.md read as without them."""
    out = tmp_path / "bench"
    assert main(["bench", "--model", "tiny-llama", "--policies", "random", "--budget", "32", "--interval", "8",
                 "--sinks", "4", "--policy-arg", "random.seed=3", "--new-tokens", "16", "--repeats", "1", "--prompt",
                 "hello", "--out", str(out), "--no-progress"]) == 0
    assert "bench" not in capsys.readouterr().err
    data = json.loads((out / "bench.json").read_text())
    assert [(r["policy"], r["sinks"]) for r in data["records"]] == [("full", None), ("random", 4)]
    assert data["settings"]["policy_args"]["random"] == {"seed": 3} and data["settings"]["scorer"] is None
    assert "B=32, W=8, 4 attention sinks," in (out / "bench.md").read_text()


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--policies", "nope"], "unknown policy"),
        (["--policies", "learned"], "needs --scorer"),
        (["--policies", "golden"], "cannot be benchmarked"),
        (["--policies", "random", "--interval", "40"], "interval"),
    ],
)
def test_cli_errors(capsys, extra, message):
    argv = ["bench", "--model", "tiny-llama", "--budget", "32", "--interval", "8", "--new-tokens", "4", *extra]
    assert main(argv) == 2
    assert message in capsys.readouterr().err
