"""MkDocs hooks of the documentation site (mkdocs.yml ``hooks:``).

``docs/changelog.md`` includes the repository's ``CHANGELOG.md`` whole. Its links are
written for a reader of the repository (``docs/reference/compatibility.md``); on the site
they are made relative to the docs folder, so the strict build checks them like any other
link instead of failing on a path it does not know.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

INCLUDE = re.compile(r'^--8<-- "([^"]+)"\s*$', re.MULTILINE)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    root = Path(config["config_file_path"]).parent

    def include(match: re.Match[str]) -> str:
        text = (root / match.group(1)).read_text(encoding="utf-8")
        return re.sub(r"\]\(docs/", "](", text)

    return INCLUDE.sub(include, markdown)
