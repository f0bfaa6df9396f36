"""Eviction policies: the heuristics, the learned scorer and its selection."""
