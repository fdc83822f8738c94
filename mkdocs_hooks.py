"""MkDocs hooks of the documentation site (mkdocs.yml ``hooks:``).

- ``docs/changelog.md`` includes the repository's ``CHANGELOG.md`` whole. Its links are
  written for a reader of the repository (``docs/reference/compatibility.md``); on the
  site they are made relative to the docs folder, so the strict build checks them like
  any other link instead of failing on a path it does not know.
- The code's docstrings cite with Sphinx roles (``:class:`~leafpool.client.Client```),
  which mkdocstrings leaves as text: the Python API page shows the name in code instead
  (the last part with ``~``, as Sphinx does).
- ``docs/reference/http-api.md`` (the HTTP API from its OpenAPI description, written with
  the HTTP service's work) goes into the nav beside the HTTP service's page once it
  exists, so the strict build, which fails on a page left out of the nav, accepts it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

INCLUDE = re.compile(r'^--8<-- "([^"]+)"\s*$', re.MULTILINE)
ROLE = re.compile(r":(?:class|mod|meth|func|attr|data|exc|obj):<code>(~?)([\w.]+)</code>")


OPTIONAL_PAGES = {  # page: (nav section, the entry it follows, its title)
    "reference/http-api.md": ("Reference", "reference/http.md", "HTTP API (OpenAPI)"),
}


def on_config(config: Any) -> Any:
    docs = Path(config["docs_dir"])
    for page, (section, after, title) in OPTIONAL_PAGES.items():
        if not (docs / page).exists():
            continue
        entries = next(e[section] for e in config["nav"]
                       if isinstance(e, dict) and section in e)
        if any(page in e.values() for e in entries if isinstance(e, dict)):
            continue
        at = next(i for i, e in enumerate(entries)
                  if isinstance(e, dict) and after in e.values())
        entries.insert(at + 1, {title: page})
    return config


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    root = Path(config["config_file_path"]).parent

    def include(match: re.Match[str]) -> str:
        text = (root / match.group(1)).read_text(encoding="utf-8")
        return re.sub(r"\]\(docs/", "](", text)

    return INCLUDE.sub(include, markdown)


def on_page_content(html: str, page: Any, config: Any, files: Any) -> str:
    def name(match: re.Match[str]) -> str:
        shown = match.group(2).rpartition(".")[2] if match.group(1) else match.group(2)
        return f"<code>{shown}</code>"

    return ROLE.sub(name, html)
