"""GPU cluster domain model, GPU catalogue, and the Kubernetes adapter."""
