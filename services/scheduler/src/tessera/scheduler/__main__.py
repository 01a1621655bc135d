"""`python -m tessera.scheduler` runs the scheduler service."""

from tessera.scheduler.bootstrap import main

if __name__ == "__main__":
    main()
