"""The bad-input matrix: every subcommand refuses each bad input with exit status 2 and one stderr line naming the
offending file, key or value, no traceback, and leaves the output directory as it was.

Cases run the command line in-process (``foresight.cli.main``) on tiny models; two run as subprocesses to show
that no traceback escapes the real entry point. Damaged shards are redone on rerun (size + SHA-256 manifests).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from foresight.cli import build_parser, main
from foresight.outputs import MARKER

REPO = Path(__file__).resolve().parents[2]
DS = str(REPO / "configs" / "deepspeed" / "zero0.json")
B, W = 16, 4
TINY = ["--model", "tiny-llama"]


# ---------------------------------------------------------------------------------------------------------------
# Inputs: good ones (traces, labels, a scorer) and damaged copies, made once for the module
# ---------------------------------------------------------------------------------------------------------------


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, Path]:
    from foresight.scorer import Scorer, ScorerConfig
    from tests.conftest import get_model, save_random_adapter

    root = tmp_path_factory.mktemp("bad_inputs")
    assert main(["trace", *TINY, "--data", "synthetic", "--limit", "3", "--max-new-tokens", "40", "--batch-size",
                 "2", "--out", str(root / "traces"), "--no-progress"]) == 0
    assert main(["golden", *TINY, "--traces", str(root / "traces"), "--out", str(root / "labels"), "--budget",
                 str(B), "--interval", str(W), "--no-progress"]) == 0
    model, _ = get_model("tiny-llama")
    import foresight

    Scorer(ScorerConfig(foresight.model_fingerprint(model), budget=B, interval=W, hidden=4), seed=0) \
        .save_pretrained(root / "scorer")

    p = {"root": root, "traces": root / "traces", "labels": root / "labels", "scorer": root / "scorer"}
    p["labels_cut"] = root / "labels_cut"
    shutil.copytree(p["labels"], p["labels_cut"])
    _truncate(next((p["labels_cut"] / "shards").glob("*.safetensors")))
    p["scorer_cut"] = root / "scorer_cut"
    shutil.copytree(p["scorer"], p["scorer_cut"])
    _truncate(p["scorer_cut"] / "model.safetensors")
    for name, text in {"plan_list": "[]", "plan_keys": '{"kind": "foresight-traces"}', "plan_json": "{oops"}.items():
        shutil.copytree(p["traces"], root / name)
        (root / name / MARKER).unlink()  # a directory of any sharded kind, made before output markers
        (root / name / "plan.json").write_text(text)
        p[name] = root / name
    files = {
        "bad.yaml": "steps: [1,\nlr: 0.1\n", "list.yaml": "- a\n- b\n", "lr.yaml": "lr: fast\n",
        "steps.yaml": "steps: [1, 2]\n", "hidden.yaml": 'hidden: "16"\n', "lr_ok.yaml": "lr: 0.5\n",
        "rows.jsonl": '{"problem": "1+1?", "answer": "2"}\n[1, 2]\n', "empty.jsonl": "",
        "answer_list.jsonl": '{"problem": "1+1?", "answer": ["2"]}\n', "fid_dict.json": '{"policy": "full"}\n',
        "fid_bad.json": '[{"policy": \n',
        # DeepSpeed configs this trainer cannot use: a TypeError (exit 1) after the feature extraction, or refused
        # only at the first checkpoint / by DeepSpeed with split.json written
        "ds_zero_int.json": '{"zero_optimization": 1}', "ds_stage3.json": '{"zero_optimization": {"stage": 3}}',
        "ds_fp16.json": '{"fp16": {"enabled": true}}',
    }
    for name, text in files.items():
        (root / name).write_text(text)
        p[name] = root / name
    (root / "latin1.jsonl").write_bytes(b'{"problem": "1+1?", "answer": "2"}\n{"problem": "\xe9"}\n')
    p["latin1.jsonl"] = root / "latin1.jsonl"
    (root / "a_dir").mkdir()
    p["a_dir"] = root / "a_dir"
    p["lora_pickle"] = save_random_adapter(root / "lora_pickle")
    (p["lora_pickle"] / "adapter_model.safetensors").rename(p["lora_pickle"] / "adapter_model.bin")
    p["lora_qwen"] = save_random_adapter(root / "lora_qwen", "tiny-qwen3")
    return p


def _sl_keys(p) -> list[str]:
    return ["model=tiny-llama", f"traces={p['traces']}", f"labels={p['labels']}", f"budget={B}", f"interval={W}",
            "heldout=1", "eval_fidelity=false", "device=cpu", f"deepspeed={DS}", f"out_dir={p['out']}"]


def _sl(p, *extra, config=None) -> list[str]:
    return ["train", "sl", *(["--config", str(p[config])] if config else []), *_sl_keys(p), *extra]


def _grpo(p, *extra) -> list[str]:
    return ["train", "grpo", "model=tiny-llama", f"traces={p['traces']}", f"init_scorer={p['scorer']}", "steps=2",
            "device=cpu", f"deepspeed={DS}", f"out_dir={p['out']}", *extra]


def _gen(p, *extra) -> list[str]:
    return ["generate", *TINY, "--prompt", "hi", "--max-new-tokens", "4", *extra]


def _trace(p, *extra, out=None) -> list[str]:
    return ["trace", *TINY, "--data", "synthetic", "--limit", "3", "--max-new-tokens", "40", "--batch-size", "2",
            "--out", str(out or p["out"]), "--no-progress", *extra]


def _fid(p, *extra, traces="traces") -> list[str]:
    return ["eval", "fidelity", *TINY, "--traces", str(p[traces]), "--budget", str(B), "--interval", str(W),
            "--out", str(p["out"]), "--quiet", *extra]


def _aime(p, *extra) -> list[str]:
    return ["eval", "aime", *TINY, "--data", "synthetic", "--limit", "1", "--max-new-tokens", "4", "--out",
            str(p["out"]), "--quiet", *extra]


# (case id, argv(p), what the one line must name); ``p["out"]`` is a directory holding earlier results.
CASES = [
    # generate
    ("generate-empty-prompt", lambda p: _gen(p, "--prompt", ""), "--prompt"),
    ("generate-temperature-hot", lambda p: _gen(p, "--temperature", "hot"), "'hot'"),
    ("generate-top-p", lambda p: _gen(p, "--top-p", "7"), "--top-p"),
    ("generate-temperature-inf", lambda p: _gen(p, "--temperature", "inf"), "--temperature"),
    ("generate-device", lambda p: _gen(p, "--device", "tpu9"), "tpu9"),
    ("generate-top-p-greedy", lambda p: _gen(p, "--top-p", "0.5"), "--top-p 0.5"),  # ignored by greedy decoding
    ("generate-top-k-greedy", lambda p: _gen(p, "--temperature", "0", "--top-k", "5"), "--top-k 5"),
    ("generate-budget-full", lambda p: _gen(p, "--budget", "16"), "--budget 16"),  # full keeps every entry
    ("generate-max-new-tokens", lambda p: _gen(p, "--max-new-tokens", "0"), "--max-new-tokens"),
    ("generate-dtype", lambda p: _gen(p, "--dtype", "float64"), "'float64'"),
    ("generate-policy-config-list", lambda p: _gen(p, "--policy", "random", "--budget", "16", "--interval", "4",
                                                   "--policy-config", str(p["list.yaml"])), "list.yaml"),
    ("generate-policy-config-yaml", lambda p: _gen(p, "--policy", "random", "--budget", "16", "--interval", "4",
                                                   "--policy-config", str(p["bad.yaml"])), "bad.yaml"),
    ("generate-policy-arg-type", lambda p: _gen(p, "--policy", "random", "--budget", "16", "--interval", "4",
                                                "--policy-arg", "seed=abc"), "`seed`"),
    ("generate-corrupt-scorer", lambda p: _gen(p, "--policy", "learned", "--budget", "16", "--interval", "4",
                                               "--policy-arg", f"scorer={p['scorer_cut']}"), "model.safetensors"),
    # trace
    ("trace-data-dir", lambda p: _trace(p, "--data", str(p["a_dir"])), "a_dir"),
    ("trace-jsonl-not-object", lambda p: _trace(p, "--data", str(p["rows.jsonl"])), "rows.jsonl:2"),
    ("trace-data-not-utf8", lambda p: _trace(p, "--data", str(p["latin1.jsonl"])), "latin1.jsonl:2: not UTF-8"),
    ("trace-data-empty", lambda p: _trace(p, "--data", str(p["empty.jsonl"])), "empty.jsonl: no problems"),
    ("trace-data-answer-list", lambda p: _trace(p, "--data", str(p["answer_list.jsonl"])), "answer_list.jsonl"),
    ("trace-split-builtin", lambda p: _trace(p, "--split", "train"), "--split train"),  # would be ignored
    ("trace-split-jsonl", lambda p: _trace(p, "--data", str(p["rows.jsonl"]), "--split", "train"), "--split train"),
    ("trace-template-missing", lambda p: _trace(p, "--template", str(p["root"] / "nope.txt")), "nope.txt not found"),
    ("trace-template-missing-rel", lambda p: _trace(p, "--template", "prompts/nope"), "prompts/nope not found"),
    ("trace-template-not-utf8", lambda p: _trace(p, "--template", str(p["latin1.jsonl"])), "latin1.jsonl"),
    ("trace-template-dir", lambda p: _trace(p, "--template", str(p["a_dir"])), "a_dir is not a file"),
    ("trace-template-no-placeholder", lambda p: _trace(p, "--template", str(p["lr_ok.yaml"])), "lr_ok.yaml"),
    ("trace-top-p-greedy", lambda p: _trace(p, "--temperature", "0", "--top-p", "0.95"), "--top-p 0.95"),
    ("trace-top-k-greedy", lambda p: _trace(p, "--temperature", "0", "--top-k", "20"), "--top-k 20"),  # the default
    ("trace-negative-limit", lambda p: _trace(p, "--limit", "-2"), "--limit"),
    ("trace-top-p", lambda p: _trace(p, "--top-p", "7"), "--top-p"),
    ("trace-temperature-inf", lambda p: _trace(p, "--temperature", "inf"), "--temperature"),
    ("trace-device", lambda p: _trace(p, "--device", "tpu9"), "tpu9"),
    ("trace-plan-list", lambda p: _trace(p, out=p["plan_list"]), "plan.json"),
    ("trace-plan-missing-keys", lambda p: _trace(p, out=p["plan_keys"]), "plan.json"),
    ("trace-plan-corrupt-json", lambda p: _trace(p, out=p["plan_json"]), "plan.json"),
    ("trace-other-settings", lambda p: _trace(p, "--seed", "3", "--top-p", "0.5", out=p["traces"]),
     ("settings.seed", "settings.top_p")),
    # golden
    ("golden-negative-chunk", lambda p: ["golden", *TINY, "--traces", str(p["traces"]), "--out", str(p["out"]),
                                         "--budget", "16", "--interval", "4", "--chunk", "-3"], "--chunk"),
    ("golden-negative-limit", lambda p: ["golden", *TINY, "--traces", str(p["traces"]), "--out", str(p["out"]),
                                         "--budget", "16", "--interval", "4", "--limit", "-1"], "--limit"),
    ("golden-damaged-trace-plan", lambda p: ["golden", *TINY, "--traces", str(p["plan_keys"]), "--out",
                                             str(p["out"]), "--budget", "16", "--interval", "4"], "plan.json"),
    ("golden-out-plan-list", lambda p: ["golden", *TINY, "--traces", str(p["traces"]), "--out", str(p["plan_list"]),
                                        "--budget", "16", "--interval", "4"], "plan.json"),
    # train sl / grpo
    ("sl-yaml-syntax", lambda p: _sl(p, config="bad.yaml"), "bad.yaml"),
    ("sl-config-list", lambda p: _sl(p, config="list.yaml"), "list.yaml"),
    ("sl-lr-fast", lambda p: _sl(p, config="lr.yaml"), "`lr`"),
    ("sl-steps-list", lambda p: _sl(p, config="steps.yaml"), "`steps`"),
    ("sl-hidden-string", lambda p: _sl(p, config="hidden.yaml"), "`hidden`"),
    ("sl-budget-abc", lambda p: _sl(p, "budget=abc"), "`budget`"),
    ("sl-lr-inf", lambda p: _sl(p, "lr=.inf"), "`lr`"),  # YAML's infinity: trains to NaN
    ("sl-weight-decay-nan", lambda p: _sl(p, "weight_decay=.nan"), "`weight_decay`"),
    ("sl-device", lambda p: _sl(p, "device=tpu9"), "tpu9"),
    ("sl-max-traces", lambda p: _sl(p, "max_traces=-1"), "max_traces"),
    ("sl-dtype", lambda p: _sl(p, "dtype=float64"), "float64"),
    ("sl-fidelity-policy-typo", lambda p: _sl(p, "fidelity_policies=[h2o, h2oo]"), "h2oo"),
    ("sl-deepspeed-path", lambda p: _sl(p, "deepspeed=/nonexistent/zero9.json"), "zero9.json"),
    ("sl-deepspeed-zero-int", lambda p: _sl(p, f"deepspeed={p['ds_zero_int.json']}"), "zero_optimization must be"),
    ("sl-deepspeed-stage3", lambda p: _sl(p, f"deepspeed={p['ds_stage3.json']}"), "ZeRO stage 3"),
    ("sl-unknown-key", lambda p: _sl(p, "learning_rate=0.1"), "learning_rate"),
    ("sl-truncated-labels", lambda p: _sl(p, f"labels={p['labels_cut']}"), "labels-00000.safetensors"),
    ("grpo-temperature-hot", lambda p: _grpo(p, "temperature=hot"), "`temperature`"),
    ("grpo-max-traces", lambda p: _grpo(p, "max_traces=-5"), "max_traces"),
    # eval fidelity / aime
    ("fidelity-policy-arg-type", lambda p: _fid(p, "--policies", "full,random", "--policy-arg", "random.seed=abc"),
     "`seed`"),
    ("fidelity-scorer-twice", lambda p: _fid(p, "--policies", "full,learned", "--scorer", str(p["scorer"]),
                                             "--policy-arg", f"learned.scorer={p['scorer_cut']}"), "learned.scorer"),
    ("fidelity-labels-twice", lambda p: _fid(p, "--policies", "full,golden", "--golden", str(p["labels"]),
                                             "--policy-arg", f"golden.labels={p['labels_cut']}"), "golden.labels"),
    ("fidelity-truncated-labels", lambda p: _fid(p, "--policies", "full,golden", "--golden", str(p["labels_cut"])),
     "labels-00000.safetensors"),
    ("fidelity-negative-limit", lambda p: _fid(p, "--policies", "full", "--limit", "-1"), "--limit"),
    ("fidelity-unknown-policy", lambda p: _fid(p, "--policies", "full,nope"), "'nope'"),
    ("fidelity-damaged-plan", lambda p: _fid(p, "--policies", "full", traces="plan_list"), "plan.json"),
    ("aime-top-p", lambda p: _aime(p, "--top-p", "7"), "--top-p"),
    ("aime-temperature-inf", lambda p: _aime(p, "--temperature", "inf"), "--temperature"),
    ("aime-jsonl-not-object", lambda p: _aime(p, "--data", str(p["rows.jsonl"])), "rows.jsonl:2"),
    ("aime-data-not-utf8", lambda p: _aime(p, "--data", str(p["latin1.jsonl"])), "latin1.jsonl:2: not UTF-8"),
    ("aime-data-answer-list", lambda p: _aime(p, "--data", str(p["answer_list.jsonl"])), "answer_list.jsonl"),
    ("aime-budget-full", lambda p: _aime(p, "--budget", "16"), "--budget 16"),  # full keeps every entry
    ("aime-interval-full", lambda p: _aime(p, "--interval", "4"), "--interval 4"),
    ("aime-sinks-full", lambda p: _aime(p, "--sinks", "2"), "--sinks 2"),
    ("aime-template-missing", lambda p: _aime(p, "--template", str(p["root"] / "nope.txt")), "nope.txt not found"),
    ("aime-top-p-greedy", lambda p: _aime(p, "--temperature", "0", "--top-p", "0.5"), "--top-p 0.5"),
    ("aime-top-k-greedy", lambda p: _aime(p, "--temperature", "0", "--top-k", "20"), "--top-k 20"),  # the default
    ("aime-negative-limit", lambda p: _aime(p, "--limit", "-3"), "--limit"),
    ("aime-damaged-settings", lambda p: _aime(p), "settings.json"),
    ("aime-scorer-twice", lambda p: _aime(p, "--policy", "learned", "--budget", "16", "--interval", "4", "--scorer",
                                          str(p["scorer"]), "--policy-arg", f"scorer={p['scorer']}"), "--policy-arg scorer="),
    # demo, bench, export
    ("demo-zero-problems", lambda p: ["demo", "--fast", "--problems", "0", "--out", str(p["out"])], "--problems"),
    ("bench-empty-prompt", lambda p: ["bench", *TINY, "--budget", "16", "--interval", "4", "--prompt", ""],
     "--prompt"),
    ("bench-scorer-twice", lambda p: ["bench", *TINY, "--budget", "16", "--interval", "4", "--policies", "learned",
                                      "--scorer", str(p["scorer"]), "--policy-arg", f"learned.scorer={p['scorer']}"],
     "learned.scorer"),
    # --scorer / --golden while their policy is not in play: ignored, yet recorded with the results
    ("bench-scorer-unused", lambda p: ["bench", *TINY, "--budget", "16", "--interval", "4", "--policies", "h2o",
                                       "--scorer", str(p["scorer"])], "--scorer"),
    ("fidelity-golden-unused", lambda p: _fid(p, "--policies", "full,h2o", "--golden", str(p["labels"])), "--golden"),
    ("aime-scorer-unused", lambda p: _aime(p, "--scorer", str(p["scorer"])), "--scorer"),
    ("bench-budget-abc", lambda p: ["bench", *TINY, "--budget", "abc", "--interval", "4"], "'abc'"),
    ("export-fidelity-dict", lambda p: ["export", str(p["scorer"]), "--out", str(p["out"]), "--overwrite",
                                        "--fidelity", str(p["fid_dict.json"])], "fid_dict.json"),
    ("export-fidelity-corrupt", lambda p: ["export", str(p["scorer"]), "--out", str(p["out"]), "--overwrite",
                                           "--fidelity", str(p["fid_bad.json"])], "fid_bad.json"),
    ("export-corrupt-scorer", lambda p: ["export", str(p["scorer_cut"]), "--out", str(p["out"]), "--overwrite"],
     "model.safetensors"),
    # --adapter (every command that loads a model) and the trainers' `adapter` key: a bad directory, named
    *[(f"{name}-adapter-{bad}", (lambda argv, bad: lambda p: [*argv(p), "--adapter", str(p[bad])])(argv, bad), bad)
      for name, argv in [("generate", _gen), ("trace", _trace), ("fidelity", lambda p: _fid(p, "--policies", "full")),
                         ("aime", _aime), ("golden", lambda p: ["golden", *TINY, "--traces", str(p["traces"]), "--out",
                                                               str(p["out"]), "--budget", "16", "--interval", "4"]),
                         ("bench", lambda p: ["bench", *TINY, "--budget", "16", "--interval", "4"])]
      for bad in ("a_dir", "scorer")],
    ("sl-adapter-missing", lambda p: _sl(p, f"adapter={p['root'] / 'no_such_lora'}"), "no_such_lora"),
    ("grpo-adapter-not-peft", lambda p: _grpo(p, f"adapter={p['scorer']}"), "adapter_config.json"),
    ("adapt-adapter-pickle", lambda p: ["train", "adapt", "model=tiny-llama", f"traces={p['traces']}", "policy=h2o",
                                        f"adapter={p['lora_pickle']}", f"deepspeed={DS}", f"out_dir={p['out']}"],
     "adapter_model.bin is a pickle"),
    ("export-adapter-not-peft", lambda p: ["export", str(p["scorer"]), "--out", str(p["out"]), "--overwrite",
                                           "--adapter", str(p["a_dir"])], "a_dir"),
    ("export-adapter-other-model", lambda p: ["export", str(p["scorer"]), "--out", str(p["out"]), "--overwrite",
                                              "--adapter", str(p["lora_qwen"])], ("'tiny-qwen3'", "'tiny-llama'")),
    # a seed torch's generators cannot take: "Overflow when unpacking long long" after the model load
    ("generate-seed-past-int64", lambda p: _gen(p, "--temperature", "0.7", "--seed", str(2**64)), "--seed"),
    ("random-seed-past-int64", lambda p: _gen(p, "--policy", "random", "--budget", str(B), "--interval", str(W),
                                              "--policy-arg", f"seed={2**64}"), "seed"),
    ("adapt-policy-full", lambda p: ["train", "adapt", "model=tiny-llama", f"traces={p['traces']}", "policy=full",
                                     f"deepspeed={DS}", f"out_dir={p['out']}"], "never evicts"),
]


def _snapshot(*roots: Path) -> dict[str, str]:
    """SHA-256 of every file under ``roots`` (and each root's existence)."""
    out = {}
    for root in roots:
        out[f"{root}:exists"] = str(root.exists())
        for f in sorted(root.rglob("*")) if root.is_dir() else []:
            if f.is_file():
                out[str(f)] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out


@pytest.mark.parametrize("case,argv,names", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_exit_2(inputs, tmp_path, capsys, case, argv, names):
    out = tmp_path / "out"
    out.mkdir()
    p = {**inputs, "out": out}
    args = argv(p)
    kind = " ".join(args[:2]) if args[0] in ("eval", "train") else args[0]
    (out / MARKER).write_text(json.dumps({"format": "foresight-output/1", "kind": kind}))  # an earlier run's output
    earlier = "README.md" if kind == "export" else "earlier-result.json"  # --overwrite replaces an export's own files
    (out / earlier).write_text('{"keep": true}\n')  # what an earlier run left there
    if case == "aime-damaged-settings":  # an earlier, interrupted `eval aime` whose settings file was damaged
        (out / "samples-rank0.jsonl").write_text('{"problem_id": "synthetic-0", "sample": 0}\n')
        (out / "settings.json").write_text('{"model": "tiny-llama", ')
    watched = [out, inputs["traces"], inputs["labels"], *(Path(a) for a in args if a.startswith(str(inputs["root"])))]
    before = _snapshot(*watched)
    rc = main(args)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 2, f"{case}: exit {rc}, stderr:\n{err}"
    assert len(lines) == 1, f"{case}: expected one line, got:\n{err}"
    assert "Traceback" not in err
    for name in (names,) if isinstance(names, str) else names:
        assert name in lines[0], f"{case}: {name!r} not named in: {lines[0]}"
    assert _snapshot(*watched) == before, f"{case}: files changed"


@pytest.mark.parametrize("argv,names", [
    (lambda p: ["train", "sl", "--config", str(p["bad.yaml"]), f"deepspeed={DS}"], "bad.yaml"),
    (lambda p: _fid(p, "--policies", "full,golden", "--golden", str(p["labels_cut"])), "labels-00000.safetensors"),
], ids=["yaml-syntax", "truncated-labels"])
def test_no_traceback_escapes_the_entry_point(inputs, tmp_path, argv, names):
    p = {**inputs, "out": tmp_path / "out"}
    proc = subprocess.run([sys.executable, "-m", "foresight", *argv(p)], capture_output=True, text=True, cwd=REPO,
                          timeout=300)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr and names in lines[0]


def test_overrides_before_and_after_config_are_accepted(inputs, capsys):
    from training.cli.train import build_config
    from training.registry import TRAINERS

    p = {**inputs, "out": inputs["root"] / "unused"}
    # an override before --config is parsed (not "unrecognized arguments") and wins over the file
    rc = main(["train", "sl", "lr=fast", "--config", str(inputs["lr_ok.yaml"]), *_sl_keys(p)])
    assert rc == 2 and "config key `lr`" in capsys.readouterr().err
    # overrides on both sides of --config reach the config; the file gives the rest
    args, extra = build_parser().parse_known_args(["train", "sl", "steps=3", "--config", str(inputs["lr_ok.yaml"]),
                                                   "micro_batch=2", *_sl_keys(p)])
    cfg = build_config(TRAINERS["sl"], args.config, args.overrides + extra)
    assert (cfg.lr, cfg.steps, cfg.micro_batch) == (0.5, 3, 2)


def test_typed_config_values_are_checked_and_coerced_losslessly():
    from foresight.config import ConfigError
    from training.sl_config import SLConfig

    base = dict(traces="t", labels="l", deepspeed=DS)
    cfg = SLConfig.from_dict({**base, "steps": 1e3, "lr": "1e-3", "heldout": 2})
    assert (cfg.steps, cfg.lr) == (1000, 1e-3) and isinstance(cfg.steps, int)
    for key, value in [("steps", 2.5), ("eval_fidelity", "yes"), ("model", 7), ("feature_set", "key"),
                       ("fidelity_policies", ["h2o", 3]), ("lr", "1e400")]:  # text past the float range: inf
        with pytest.raises(ConfigError, match=key):
            SLConfig.from_dict({**base, key: value})
    with pytest.raises(ConfigError, match="must be a mapping"):
        SLConfig.from_dict([1, 2])


def _label_content(labels: Path) -> dict:
    from safetensors import safe_open

    out = {}
    for f in sorted((labels / "shards").glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            out[f.name] = (st.metadata(), {k: st.get_tensor(k).tolist() for k in st.keys()})
    return out


@pytest.mark.parametrize("argv", [
    lambda p, out: ["bench", *TINY, "--budget", "16", "--interval", "4", "--new-tokens", "4", "--repeats", "1",
                    "--out", out],
    lambda p, out: _trace(p, out=out),
    lambda p, out: ["golden", *TINY, "--traces", str(p["traces"]), "--out", out, "--budget", "16", "--interval", "4"],
    lambda p, out: _aime({**p, "out": out}),
], ids=["bench", "trace", "golden", "aime"])
def test_an_out_that_is_a_file_is_refused_before_the_model_loads(inputs, tmp_path, capsys, monkeypatch, argv):
    import foresight

    def no_load(*a, **k):
        raise AssertionError("the model was loaded before --out was checked")

    monkeypatch.setattr(foresight, "load_model", no_load)
    out = tmp_path / "results.json"
    out.write_text("{}\n")
    assert main(argv({**inputs, "out": tmp_path}, str(out))) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"--out {out}: exists and is not a directory" in err, err
    assert out.read_text() == "{}\n"


@pytest.mark.parametrize("argv", [
    lambda p, out: _trace(p, out=out),
    lambda p, out: ["golden", *TINY, "--traces", str(p["traces"]), "--out", out, "--budget", "16", "--interval", "4"],
    lambda p, out: _aime({**p, "out": out}),
], ids=["trace", "golden", "aime"])
def test_a_bad_launcher_environment_is_refused_before_the_model_loads(inputs, tmp_path, capsys, monkeypatch, argv):
    """RANK / WORLD_SIZE that are not integers gave `invalid literal for int()` (trace and golden with plan.json
    already written), and a RANK outside WORLD_SIZE failed in eval aime after the model load."""
    import foresight

    def no_load(*a, **k):
        raise AssertionError("the model was loaded before RANK / WORLD_SIZE were checked")

    monkeypatch.setattr(foresight, "load_model", no_load)
    out = tmp_path / "out"
    for rank, world, shown in (("x", "2", "RANK='x'"), ("0", "two", "WORLD_SIZE='two'"), ("3", "2", "RANK=3")):
        monkeypatch.setenv("RANK", rank)
        monkeypatch.setenv("WORLD_SIZE", world)
        assert main(argv(inputs, str(out))) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and "invalid" in err and shown in err, err
        assert not out.exists()


def test_damaged_shards_are_refused_by_readers_and_redone_on_rerun(inputs, tmp_path, capsys):
    from golden.labels import load_labels
    from golden.traces import load_traces

    traces, labels = tmp_path / "traces", tmp_path / "labels"
    shutil.copytree(inputs["traces"], traces)
    shutil.copytree(inputs["labels"], labels)
    rows = load_traces(traces).to_dict()
    label_content = _label_content(labels)

    arrow = next((traces / "shards" / "traces-00000").glob("*.arrow"))
    _truncate(arrow)
    (traces / "manifests" / "traces-00001.json").unlink()  # a shard nothing can vouch for is redone too
    label_file = next((labels / "shards").glob("*.safetensors"))
    label_file.write_bytes(label_file.read_bytes()[:-7] + b"\0" * 7)  # same size, other bytes

    with pytest.raises(Exception, match="traces-00000"):
        load_traces(traces)  # a reader refuses the truncated shard by name (size check)
    assert main(_trace({"out": traces})) == 0
    err = capsys.readouterr().err
    assert "redoing shard" in err and "traces-00000" in err and "traces-00001" in err
    assert load_traces(traces).to_dict() == rows  # the redone shards are the same

    assert main(["golden", *TINY, "--traces", str(traces), "--out", str(labels), "--budget", str(B), "--interval",
                 str(W), "--no-progress"]) == 0
    assert "redoing shard" in capsys.readouterr().err  # the hash caught an edit that kept the size
    assert _label_content(labels) == label_content  # same tensors and metadata (the header's key order may vary)
    assert len(load_labels(labels)) == 3

    # killed between writing the manifest and the final rename: the complete file is still a temporary
    (labels / "shards" / label_file.name).rename(labels / "shards" / f".tmp-{label_file.name}-pid99999")
    assert main(["golden", *TINY, "--traces", str(traces), "--out", str(labels), "--budget", str(B), "--interval",
                 str(W), "--no-progress"]) == 0
    assert not any(p.name.startswith(".tmp") for p in (labels / "shards").iterdir())
    assert _label_content(labels) == label_content


def test_a_filtered_traces_dataset_leaves_its_shards_readable(inputs, tmp_path):
    """``Dataset.filter`` on loaded traces writes a ``cache-*.arrow`` file into a shard directory (datasets'
    behaviour): that derived file is not shard data, so readers and the oracle still accept the shard."""
    from golden.traces import load_traces

    traces = tmp_path / "traces"
    shutil.copytree(inputs["traces"], traces)
    rows = load_traces(traces).to_dict()
    kept = load_traces(traces).filter(lambda r: r["trace_id"] == rows["trace_id"][0])
    assert len(kept) == 1 and any(traces.rglob("cache-*.arrow"))
    assert load_traces(traces).to_dict() == rows
    assert main(["golden", *TINY, "--traces", str(traces), "--out", str(tmp_path / "labels"), "--budget", str(B),
                 "--interval", str(W), "--no-progress"]) == 0


def test_scorer_is_written_before_the_final_evaluation(inputs, tmp_path, monkeypatch):
    """A final evaluation that fails (or is killed) after a long training run must not cost the trained scorer."""
    from foresight.config import parse_overrides
    from tests.conftest import get_model
    from training.sl import SLTask, run_sl
    from training.sl_config import SLConfig

    def evaluate(self, step, final):
        if final:
            raise RuntimeError("the final evaluation failed")
        return {}

    monkeypatch.setattr(SLTask, "evaluate", evaluate)
    out = tmp_path / "sl"
    cfg = SLConfig.from_dict({**parse_overrides(_sl_keys({**inputs, "out": out})), "steps": 1, "micro_batch": 2,
                              "warmup_steps": 0, "checkpoint_every": 0, "eval_every": 0})
    with pytest.raises(RuntimeError, match="final evaluation"):
        run_sl(cfg, model=get_model("tiny-llama")[0])
    assert (out / "scorer" / "model.safetensors").is_file() and (out / "scorer" / "config.json").is_file()


def test_an_internal_error_is_one_line_exit_1(monkeypatch, capsys):
    import foresight.cli.commands.policies as policies_cmd

    def broken(args):
        raise TypeError("unsupported operand\n  spread over lines")

    monkeypatch.setattr(policies_cmd, "run", broken)
    assert main(["policies"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "internal error: TypeError: unsupported operand spread over lines" in err
    assert main(["--help"]) == 0 and main(["policies", "--bogus"]) == 2
    assert capsys.readouterr().err.strip() == "foresight: error: unrecognized arguments: --bogus"


@pytest.mark.skipif(torch.cuda.is_available(), reason="mixed precision is refused without a GPU only")
def test_mixed_precision_without_a_gpu_is_refused_before_any_work(inputs, tmp_path, capsys):
    p = {**inputs, "out": tmp_path / "out"}
    assert main(_sl(p, f"deepspeed={p['ds_fp16.json']}")) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "fp16.enabled needs a GPU" in err, err
    assert not (tmp_path / "out").exists()
