"""KEDA's external scaler interface: the proto and the stubs generated from it (regenerate.sh)."""
