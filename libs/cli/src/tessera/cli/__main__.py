"""`python -m tessera.cli` is the `tessera` command."""

from tessera.cli.main import main

if __name__ == "__main__":
    main()
