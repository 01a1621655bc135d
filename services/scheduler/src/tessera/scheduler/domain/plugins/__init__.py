"""The scheduler's plugins: thin adapters from extension points to choices that can be tested alone."""
