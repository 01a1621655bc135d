"""Where GPU readings come from: the devcluster's simulated NVML, NVML itself, or dcgm-exporter."""
