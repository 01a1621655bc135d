"""`python -m tessera.admission` runs the admission service."""

from tessera.admission.bootstrap import main

if __name__ == "__main__":
    main()
