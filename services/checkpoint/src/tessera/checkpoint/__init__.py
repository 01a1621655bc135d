"""Checkpoint before preemption and restore after."""
