"""Your model, from traces to a shareable scorer, on N GPUs of one machine (docs/gpu.md).

Stages, each a ``foresight`` command (printed before it runs, so you can rerun any one by hand):

1. ``trace``: reasoning traces of the training problems (``foresight launch``, sharded across the GPUs);
2. ``trace``: traces of the evaluation problems, for fidelity;
3. ``golden``: Golden Eviction labels of the training traces at B, W (``foresight launch``);
4. ``train sl``: distil the labels into a scorer under DeepSpeed's launcher (``deepspeed --module foresight``);
5. ``eval fidelity``: loss ratio of learned, full and two heuristics on the evaluation traces (one GPU);
6. ``eval aime``: pass@1 under the learned policy (``foresight launch``);
7. ``export``: the scorer as a Hub model directory, its card quoting the fidelity.

Every stage resumes: rerun the script with the same arguments after an interruption and finished work is kept
(``train sl`` continues from its last checkpoint). B and W default to those of the shipped scorers' larger
cache, B = 128, W = 32 (``configs/sl.yaml``).

``--dry-run`` runs the same stages on the CPU (two ranks, DS_ACCELERATOR=cpu) with small sizes: with
``--model tiny-llama`` it checks the mechanics in a few minutes on a machine without GPUs (the slow test suite
does). ``--print-only`` prints the commands without running them.

    python examples/gpu_recipe.py --model Qwen/Qwen3-4B --gpus 8 --out runs/qwen3-4b
    python examples/gpu_recipe.py --model tiny-llama --gpus 2 --out /tmp/recipe --dry-run
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Sizes:
    """How much work each stage does."""

    train_data: str
    train_problems: int
    eval_data: str
    eval_problems: int
    max_new_tokens: int
    aime_max_new_tokens: int
    sl_steps: int
    budget: int
    interval: int


REAL = Sizes(train_data="math500", train_problems=500, eval_data="aime24", eval_problems=30, max_new_tokens=4096,
             aime_max_new_tokens=16384, sl_steps=2400, budget=128, interval=32)
DRY = Sizes(train_data="synthetic", train_problems=8, eval_data="synthetic", eval_problems=2, max_new_tokens=48,
            aime_max_new_tokens=24, sl_steps=4, budget=16, interval=4)


def stages(model: str, gpus: int, out: Path, sizes: Sizes, dry_run: bool) -> list[tuple[str, list[str]]]:
    """``(name, argv)`` of every stage, in order."""
    foresight = [sys.executable, "-m", "foresight"]
    launch = [*foresight, "launch", "--nproc-per-node", str(gpus)]
    deepspeed = shutil.which("deepspeed") or str(Path(sys.executable).with_name("deepspeed"))
    device = ["--device", "cpu"] if dry_run else []
    b, w = str(sizes.budget), str(sizes.interval)
    train, held = out / "traces_train", out / "traces_eval"
    labels, sl = out / f"golden_B{b}_W{w}", out / "sl"
    trace = ["--temperature", "0.6", "--max-new-tokens", str(sizes.max_new_tokens), "--no-progress"]
    resume = ["--resume"] if (sl / "checkpoints" / "latest").is_file() else []
    return [
        ("traces (train)", [*launch, "trace", "--model", model, *device, "--data", sizes.train_data,
                            "--limit", str(sizes.train_problems), "--out", str(train), *trace]),
        ("traces (eval)", [*launch, "trace", "--model", model, *device, "--data", sizes.eval_data,
                           "--limit", str(sizes.eval_problems), "--seed", "1", "--out", str(held), *trace]),
        ("golden labels", [*launch, "golden", "--model", model, *device, "--traces", str(train), "--out", str(labels),
                           "--budget", b, "--interval", w, "--no-progress"]),
        ("train sl", [deepspeed, "--num_gpus", str(gpus), "--module", "foresight", "train", "sl",
                      "--config", str(REPO / "configs" / "sl.yaml"), f"model={model}", f"traces={train}",
                      f"labels={labels}", f"budget={b}", f"interval={w}", f"steps={sizes.sl_steps}",
                      f"out_dir={sl}", f"deepspeed={REPO / 'configs' / 'deepspeed' / 'zero0.json'}",
                      *(["device=cpu", "micro_batch=2", "warmup_steps=1", "checkpoint_every=2", "eval_every=0",
                         "eval_fidelity=false", "heldout=2"] if dry_run else []), *resume]),
        ("eval fidelity", [*foresight, "eval", "fidelity", "--model", model, *device, "--traces", str(held),
                           "--policies", "full,learned,tova,h2o", "--scorer", str(sl / "scorer"), "--budget", b,
                           "--interval", w, "--out", str(out / "fidelity"), "--quiet"]),
        ("eval aime", [*launch, "eval", "aime", "--model", model, *device, "--data", sizes.eval_data,
                       "--limit", str(sizes.eval_problems), "--policy", "learned", "--scorer", str(sl / "scorer"),
                       "--budget", b, "--interval", w, "--max-new-tokens", str(sizes.aime_max_new_tokens),
                       "--out", str(out / "aime"), "--quiet"]),
        ("export", [*foresight, "export", str(sl), "--out", str(out / "scorer"), "--fidelity",
                    str(out / "fidelity" / "fidelity.json"), "--overwrite",
                    *(["--base-model", model] if "/" in model and not Path(model).exists() else [])]),
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a Hugging Face model id or directory (or a built-in name)")
    p.add_argument("--gpus", type=int, default=1, help="GPUs of this machine to use (ranks in --dry-run)")
    p.add_argument("--out", required=True, type=Path, help="output directory (rerun to resume)")
    p.add_argument("--budget", type=int, default=None, help="B (default 128; 16 in --dry-run)")
    p.add_argument("--interval", type=int, default=None, help="W (default 32; 4 in --dry-run)")
    p.add_argument("--dry-run", action="store_true", help="CPU ranks, small sizes: the mechanics only")
    p.add_argument("--print-only", action="store_true", help="print the commands, run nothing")
    args = p.parse_args(argv)
    if args.gpus < 1:
        p.error(f"--gpus must be at least 1, got {args.gpus}")
    sizes = DRY if args.dry_run else REAL
    sizes = Sizes(**{**sizes.__dict__, "budget": args.budget or sizes.budget,
                     "interval": args.interval or sizes.interval})
    env = dict(os.environ)
    if args.dry_run:
        env.update(DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    for name, cmd in stages(args.model, args.gpus, args.out, sizes, args.dry_run):
        print(f"== {name}: {shlex.join(cmd)}", flush=True)
        if args.print_only:
            continue
        code = subprocess.run(cmd, cwd=REPO, env=env).returncode
        if code:
            print(f"== {name} failed (exit status {code}); fix it and rerun this script to resume", file=sys.stderr)
            return code
    if not args.print_only:
        print(f"== done: the scorer is {args.out / 'scorer'} (a Hub model directory; see docs/models.md)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
