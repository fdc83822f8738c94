# Shortcuts for ./dev (which works without make on a fresh machine).
.PHONY: up test bench lint
up:
	./dev up
test:
	./dev test
bench:
	./dev bench
lint:
	.venv/bin/ruff check leafpool workers tests bench && .venv/bin/mypy
