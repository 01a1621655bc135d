"""The end-to-end tests share one running stack for the session."""

from tests.e2e.harness import stack  # noqa: F401  (the session's `tessera up`)
