"""Evaluation: fidelity, AIME accuracy, bench, export, quality statistics."""
