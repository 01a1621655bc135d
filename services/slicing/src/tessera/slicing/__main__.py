"""`python -m tessera.slicing` runs the slicing service."""

from tessera.slicing.bootstrap import main

if __name__ == "__main__":
    main()
