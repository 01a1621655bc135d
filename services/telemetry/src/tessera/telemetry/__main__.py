"""`python -m tessera.telemetry` runs the telemetry service."""

from tessera.telemetry.bootstrap import main

if __name__ == "__main__":
    main()
