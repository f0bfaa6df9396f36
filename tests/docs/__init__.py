"""The README, the docs' snippets and the shipped examples."""
