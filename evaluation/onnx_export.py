"""A scorer as ONNX: the all-layers form ``scorer(x) -> scores`` with dynamic batch and n, checked against PyTorch
with onnxruntime (the ``onnx`` extra)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from foresight.errors import ForesightError

ONNX_NAME = "scorer.onnx"


class _AllLayers(torch.nn.Module):
    """``scorer(x)`` with ``layer_idx=None`` as a plain module for the ONNX exporter."""

    def __init__(self, scorer):
        super().__init__()
        self.scorer = scorer

    def forward(self, x):
        return self.scorer(x)


def export_onnx(scorer, path: Path, atol: float = 1e-5, opset: int = 18) -> float:
    """Export ``scorer(x)`` (all layers) to ONNX with dynamic batch and n; return the max |ONNX - PyTorch|
    over random inputs of two shapes, raising if it exceeds ``atol``."""
    import onnxruntime as ort  # optional (the onnx extra): only the export needs it

    cfg = scorer.config
    scorer = scorer.float().eval()
    L, K, D = cfg.num_layers, cfg.num_kv_heads, cfg.input_dim
    gen = torch.Generator().manual_seed(0)
    example = torch.randn(L, 2, K, 7, D, generator=gen)
    wrapper = _AllLayers(scorer)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.onnx.export(
        wrapper, (example,), str(path), input_names=["features"], output_names=["scores"], opset_version=opset,
        dynamo=False, dynamic_axes={"features": {1: "batch", 3: "n"}, "scores": {1: "batch", 3: "n"}},
    )
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    worst = 0.0
    for shape in ((L, 1, K, 5, D), (L, 3, K, 33, D)):
        x = torch.randn(*shape, generator=gen) * 2
        with torch.no_grad():
            ref = scorer(x).numpy()
        got = sess.run(["scores"], {"features": x.numpy()})[0]
        if got.shape != ref.shape:
            raise RuntimeError(f"ONNX output shape {got.shape} != PyTorch {ref.shape}")
        if not (np.isfinite(ref).all() and np.isfinite(got).all()):  # NaN "matches" NaN: never verify that
            raise ForesightError(f"the scorer gives NaN/Inf scores on random inputs (PyTorch: "
                                 f"{int((~np.isfinite(ref)).sum())}, ONNX: {int((~np.isfinite(got)).sum())}); "
                                 "it cannot be verified, nothing was exported")
        worst = max(worst, float(np.abs(got - ref).max()))
    if not worst <= atol:
        raise RuntimeError(f"ONNX export differs from PyTorch by {worst:.2e} > {atol:.0e}")
    return worst


__all__ = ["ONNX_NAME", "export_onnx"]
