"""The simulation behind the devcluster: nodes, kubelet, GPU Operator and NVML readings."""
