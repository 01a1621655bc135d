"""Fixtures, builders and fakes for tests."""
