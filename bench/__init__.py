"""leafpool benchmarks: ``python -m bench`` (or ``./dev bench``). Not part of the tests."""
