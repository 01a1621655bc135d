"""`python -m tessera.forecaster` runs the forecaster service."""

from tessera.forecaster.bootstrap import main

if __name__ == "__main__":
    main()
