"""The gang scheduler."""
