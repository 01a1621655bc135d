"""GPU telemetry: inventory, samples, idle and unhealthy GPUs."""
