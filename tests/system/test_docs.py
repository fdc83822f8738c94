"""The README is part of the contract: every setting and every Redis key is documented."""

from __future__ import annotations

import re
from pathlib import Path

from leafpool.core.config import Settings
from leafpool.core.keys import Keys

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def test_every_setting_is_documented() -> None:
    missing = [f"LEAFPOOL_{name.upper()}" for name in Settings.model_fields
               if f"`LEAFPOOL_{name.upper()}`" not in README]
    assert missing == []


def test_every_key_is_documented() -> None:
    k = Keys("leafpool")
    tag_keys = [key.replace("{t}", "{TAG}") for key in k.tag("t").all()]
    for key in [*tag_keys, k.tags, k.wanted]:
        assert f"`{key}`" in README, key


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
    """A file or folder of the repository named in the README or docs/design.md (in
    backticks, ``leafpool/...``, ``tests/...``, ``ops/...``, ``workers/...``) is there:
    a move that leaves the docs behind fails here."""
    root = Path(__file__).resolve().parents[2]
    text = README + (root / "docs" / "design.md").read_text()
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
