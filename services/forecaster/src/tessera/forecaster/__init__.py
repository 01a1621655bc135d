"""Load forecasts for the HPA and KEDA."""
