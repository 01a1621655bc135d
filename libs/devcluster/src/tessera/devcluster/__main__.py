"""`python -m tessera.devcluster serve|replay`."""

from tessera.devcluster.cli import main

raise SystemExit(main())
