"""The README and the documentation are part of the contract: the README opens with the two
commands, the design is cited by the code section by section, and every path the docs name
exists. (Every setting, Redis key and CLI command is documented: tests/system/test_docs_site.py,
on the site's reference pages.)"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def test_readme_opens_with_the_two_commands_and_ci_runs_the_test_one() -> None:
    first_block = README.split("```")[1].splitlines()
    assert first_block[1:] == ["./dev up", "./dev test"]
    ci = (Path(__file__).resolve().parents[2] / ".ci" / "run").read_text()
    assert ci.strip().splitlines()[-1] == "exec ./dev test"


def test_the_design_document_is_in_the_repository_and_every_citation_resolves() -> None:
    root = Path(__file__).resolve().parents[2]
    design = (root / "docs" / "design.md").read_text()
    sections = set(re.findall(r"^## (\d+)\. ", design, re.MULTILINE))
    cited: list[tuple[str, str]] = []
    for path in [*root.glob("leafpool/**/*.py"), *root.glob("leafpool/**/*.lua"),
                 *root.glob("workers/*.py"), *root.glob("ops/**/*.conf")]:
        text = path.read_text()
        assert not re.search(r"(?<!docs/)design\.md", text), f"{path}: cite docs/design.md"
        cited += [(str(path), n) for n in re.findall(r"docs/design\.md §(\d+)", text)]
    assert cited, "the code points to its design"
    assert [c for c in cited if c[1] not in sections] == []


def test_the_shipped_redis_config_is_the_shipped_one() -> None:
    """Test servers run copies of it: a CONFIG REWRITE must never land in the repository."""
    conf = (Path(__file__).resolve().parents[2] / "ops" / "redis" / "redis.conf").read_text()
    assert "CONFIG REWRITE" not in conf and "\nport " not in conf and "replicaof" not in conf


def test_every_path_the_docs_name_exists() -> None:
    """A file or folder of the repository named in the README or a page of docs/ (in
    backticks, ``leafpool/...``, ``tests/...``, ``ops/...``, ``workers/...``) is there:
    a move that leaves the docs behind fails here."""
    root = ROOT
    text = README + "".join(p.read_text() for p in sorted((root / "docs").rglob("*.md")))
    named = set(re.findall(r"`((?:leafpool|tests|ops|workers|bench)/[^`\s]*)`", text))
    missing = []
    for name in sorted(named):
        path = name.split(" ")[0].rstrip("/")
        if "*" in path or "<" in path:
            matches = list(root.glob(re.sub(r"<[^>]+>", "*", path)))
            if not matches:
                missing.append(name)
        elif not (root / path).exists():
            missing.append(name)
    assert len(named) > 20 and missing == []
