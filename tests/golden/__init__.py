"""The Golden Eviction oracle, traces and labels."""
