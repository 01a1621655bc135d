"""A GPU cluster in a box for development, demos and tests."""
