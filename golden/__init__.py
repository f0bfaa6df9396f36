"""Reasoning traces and the Golden Eviction oracle (DESIGN.md section 3). Importing the package registers the
``golden`` replay policy (:mod:`golden.policy`)."""

from golden import policy  # noqa: F401  (registers the "golden" policy)
