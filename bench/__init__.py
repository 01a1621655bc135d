"""Tessera's benchmarks: `python -m bench.<name> --help`."""
