"""The test project's app: models keyed by leafpool IDs, their admin, their tests."""
