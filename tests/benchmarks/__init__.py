"""The stand-alone scripts under benchmarks/."""
