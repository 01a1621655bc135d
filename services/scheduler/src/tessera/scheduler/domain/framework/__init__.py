"""A scheduling framework shaped like kube-scheduler's: one Protocol per extension point, run in order."""
