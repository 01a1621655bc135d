"""The tessera command line: up, migrate, jobs, contracts."""
