pytest_plugins = ["tessera.testing.plugin"]
