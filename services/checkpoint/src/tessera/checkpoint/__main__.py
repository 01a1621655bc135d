"""`python -m tessera.checkpoint` runs the checkpoint service."""

from tessera.checkpoint.bootstrap import main

if __name__ == "__main__":
    main()
