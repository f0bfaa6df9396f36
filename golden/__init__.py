"""Reasoning traces and the Golden Eviction oracle (docs/oracle.md). The ``golden`` replay policy
(:mod:`golden.policy`) and the ``trace`` and ``golden`` commands (:mod:`golden.cli`) are registered with the library
as entry points (``pyproject.toml``), not by importing this package."""
