"""Training: SL, DAgger, GRPO, adaptation, launchers and recorded events."""
