"""The house: arrows point down only, and no module imports itself back through others.

Layers, bottom to top: the library (``foresight``, with the command line's entry point and registries),
``golden`` (traces, oracle), ``evaluation`` (metrics, fidelity, export), ``training`` (which evaluates what it
trains). Each package above the library adds its commands (``<package>/cli``) and policies through entry points
(:mod:`foresight.plugins`), never by being imported from below. Every import counts, module level and inside
functions, with no exception.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("foresight", "golden", "training", "evaluation")
LEVEL = {"foresight": 0, "golden": 1, "evaluation": 2, "training": 3}


def _modules() -> dict[str, Path]:
    mods = {}
    for pkg in PACKAGES:
        for path in (REPO / pkg).rglob("*.py"):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join(parts)] = path
    return mods


def _imports(path: Path, name: str, known: set[str]) -> set[str]:
    """Project modules imported by ``path`` (resolved to the longest known module name)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = name.split(".")[: -node.level] if not path.name == "__init__.py" else name.split(".")[: len(name.split(".")) - node.level + 1]
                base = ".".join(pkg + ([base] if base else []))
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        else:
            continue
        for t in targets:
            parts = t.split(".")
            for i in range(len(parts), 0, -1):
                cand = ".".join(parts[:i])
                if cand in known:
                    if cand != name:
                        out.add(cand)
                    break
    return out


def _layer(mod: str) -> str:
    return mod.split(".")[0]


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    known = set(mods)
    return {m: _imports(p, m, known) for m, p in mods.items()}


def test_no_upward_imports():
    upward = [
        f"{m} -> {t}"
        for m, targets in _graph().items()
        for t in targets
        if LEVEL[_layer(t)] > LEVEL[_layer(m)]
    ]
    assert not upward, "imports that point up or sideways:\n" + "\n".join(sorted(upward))


def test_no_import_cycles():
    graph = _graph()
    # package __init__ modules re-export their children; an edge child -> parent package is not a cycle of logic
    edges = {m: {t for t in ts if not m.startswith(t + ".")} for m, ts in graph.items()}
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in sorted(edges.get(m, ())):
            if state.get(t) == 1:
                cycles.append(" -> ".join(stack[stack.index(t) :] + [t]))
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_checker_sees_an_upward_import(tmp_path):
    """The walker resolves function-level and relative imports (so the two tests above can fail)."""
    src = tmp_path / "x.py"
    src.write_text("def f():\n    from training.loop import run_task\n    from .views import StepView\n")
    known = {"training.loop", "foresight.views", "foresight.x"}
    assert _imports(src, "foresight.x", known) == {"training.loop", "foresight.views"}
