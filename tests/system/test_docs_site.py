"""The documentation site (mkdocs.yml, docs/): it builds with ``mkdocs build --strict``
(every internal link and anchor resolves, every page is in the nav, the Python API renders
from the docstrings), and its reference pages are complete: every setting, every Redis
key, every CLI command with its options, every public Python name. The README stays short
and every section it once held has a page."""

from __future__ import annotations

import ast
import functools
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import typer
import yaml

from leafpool.cli import app
from leafpool.core.config import Settings
from leafpool.core.keys import Keys

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _page(name: str) -> str:
    return (DOCS / name).read_text()


#: the built sites' directories, removed when the test process ends
_KEEP: list[tempfile.TemporaryDirectory[str]] = []


@dataclass(frozen=True)
class Build:
    returncode: int
    output: str
    site: Path


@functools.cache
def _build() -> Build:
    """One strict build per test process, into a directory of its own (removed at exit
    with the process's temporary directory object)."""
    out = tempfile.TemporaryDirectory(prefix="leafpool-site-")
    _KEEP.append(out)
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", out.name],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    return Build(done.returncode, done.stdout + done.stderr, Path(out.name))



def _built() -> Build:
    build = _build()
    assert build.returncode == 0, f"mkdocs build --strict failed:\n{build.output}"
    return build


def test_the_site_builds_strictly() -> None:
    """A warning (a link to a page or an anchor that is not there, a page left out of the
    nav, a docstring mkdocstrings cannot read) fails the build, and the build's output is
    the failure's message."""
    build = _built()
    assert (build.site / "index.html").exists()
    assert "WARNING" not in build.output, build.output


def test_the_build_is_strict_and_offline() -> None:
    """The settings that make the build above a check: strict, links and anchors validated,
    nothing fetched from the network (Google fonts, the social and privacy plugins)."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    assert config["strict"] is True
    validation = config["validation"]
    for key in ("omitted_files", "absolute_links", "unrecognized_links", "anchors",
                "not_found"):
        assert validation[key] == "warn", key
    assert config["theme"]["font"] is False
    plugins = [p if isinstance(p, str) else next(iter(p)) for p in config["plugins"]]
    assert not {"social", "privacy", "material/social", "material/privacy"} & set(plugins)


def test_every_setting_is_documented() -> None:
    page = _page("reference/settings.md")
    rows = set(re.findall(r"^\| `(LEAFPOOL_[A-Z0-9_]+)` \|", page, re.MULTILINE))
    fields = {f"LEAFPOOL_{name.upper()}" for name in Settings.model_fields}
    assert sorted(fields - rows) == [], "settings without a row in docs/reference/settings.md"
    # LEAFPOOL_HOME is read before the settings, by the one function that finds the home
    # (leafpool.core.config.default_home)
    assert sorted(rows - fields - {"LEAFPOOL_HOME"}) == [], \
        "rows of docs/reference/settings.md that are no setting"


def test_every_key_is_documented() -> None:
    page = _page("reference/redis-keys.md")
    k = Keys("leafpool")
    tag_keys = [key.replace("{t}", "{TAG}") for key in k.tag("t").all()]
    rows = set(re.findall(r"^\| `([^`]+)` \|", page, re.MULTILINE))
    for key in [*tag_keys, k.tags, k.wanted, k.beat_lock]:
        assert key in rows, key


def _commands(command: object, path: list[str]) -> list[tuple[str, object]]:
    subs = getattr(command, "commands", None)
    if not subs:
        return [(" ".join(path), command)]
    return [found for name, sub in subs.items() for found in _commands(sub, [*path, name])]


def _section(page: str, heading: str) -> str:
    start = page.index(heading)
    end = re.search(r"^#{2,3} ", page[start + len(heading):], re.MULTILINE)
    return page[start:start + len(heading) + end.start()] if end else page[start:]


def test_every_cli_command_and_option_is_documented() -> None:
    """Walks the typer app (sub-apps included): each command has a heading of its own in
    docs/reference/cli.md, and its section names each of its options and arguments."""
    page = _page("reference/cli.md")
    root = typer.main.get_command(app)
    commands = _commands(root, ["leafpool"])
    assert len(commands) > 15, commands
    missing = []
    for name, command in commands:
        heading = f"### `{name}`\n"
        if heading not in page:
            missing.append(name)
            continue
        section = _section(page, heading)
        for param in command.params:  # type: ignore[attr-defined]
            if param.param_type_name == "argument":
                label = (param.metavar or param.name.upper()).strip("[]").rstrip(".")
                if f"`{label}`" not in section:
                    missing.append(f"{name} {label}")
            else:
                missing += [f"{name} {opt}" for opt in [*param.opts, *param.secondary_opts]
                            if f"`{opt}`" not in section]
    for param in root.params:  # the top level's own options (--version, ...)
        missing += [f"leafpool {opt}" for opt in param.opts if f"`{opt}`" not in page]
    assert missing == [], "not in docs/reference/cli.md"


def _public_names() -> list[str]:
    """The public API's qualified names: ``leafpool.__all__`` and the ORM modules'
    ``__all__`` (read from the source: importing leafpool.orm.django needs Django set up)."""
    import leafpool

    names = [f"{getattr(leafpool, n).__module__}.{n}" for n in leafpool.__all__
             if not n.startswith("_")]  # __version__: a string, said by the changelog
    for module in ("leafpool.orm.sqlalchemy", "leafpool.orm.django"):
        tree = ast.parse((ROOT / (module.replace(".", "/") + ".py")).read_text())
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
                names += [f"{module}.{ast.literal_eval(e)}"
                          for e in node.value.elts]  # type: ignore[attr-defined]
    names += ["leafpool.orm.batch.IdBatches", "leafpool.orm.batch.AsyncIdBatches",
              "leafpool.core.config.Settings", "leafpool.embedded.up",
              "leafpool.runtime.Runtime", "leafpool.http.app_from_env"]
    return names


def test_every_public_name_is_in_the_python_api_reference() -> None:
    """mkdocstrings renders each public name (the clients, the errors, the ORM helpers, the
    entry points) with an anchor of its qualified name on the built page."""
    html = (_built().site / "reference" / "python-api" / "index.html").read_text()
    ids = set(re.findall(r'id="([\w.]+)"', html))
    names = _public_names()
    assert len(names) > 20
    assert [n for n in names if n not in ids] == []


def test_every_link_of_the_readme_resolves() -> None:
    """The README's links into the repository are files that exist, and its links into
    the site's pages with an anchor land on a heading of the built page."""
    readme = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)\s]+)\)", readme)
    local = [link for link in links if not re.match(r"[a-z]+:", link)]
    assert len(local) > 20, local
    site = _built().site
    missing = []
    for link in local:
        path, _, anchor = link.partition("#")
        if not (ROOT / path).exists():
            missing.append(link)
        elif anchor and path.startswith("docs/"):
            html = site / path.removeprefix("docs/").removesuffix(".md") / "index.html"
            if f'id="{anchor}"' not in html.read_text():
                missing.append(link)
    assert missing == []


def test_the_readme_is_short_and_links_into_every_section_of_the_site() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())

    def pages(nav: object) -> list[str]:
        if isinstance(nav, str):
            return [nav]
        if isinstance(nav, list):
            return [p for item in nav for p in pages(item)]
        if isinstance(nav, dict):
            return [p for value in nav.values() for p in pages(value)]
        return []

    linked = set(re.findall(r"\]\(docs/([^)#\s]+)", readme))
    not_linked = [p for p in pages(config["nav"])
                  if p not in linked and p not in ("index.md", "changelog.md")]
    assert not_linked == [], "pages of the site the README does not link to"


#: Every section the README held before the site (issue 29), and the page that holds it
#: now: a page may be renamed, but none of these may be lost.
MOVED = {
    "First hour": "getting-started.md",
    "Guarantees, as tested": "reference/guarantees.md",
    "Redis keys (a compatibility promise)": "reference/redis-keys.md",
    "A first tag in your own database": "getting-started.md",  # was "Using it"
    "ORM integration": "how-to/orm.md",
    "SQLAlchemy": "how-to/orm.md",
    "Django": "how-to/orm.md",
    "Configuration": "reference/settings.md",
    "Snowflake mode": "explanation/snowflake-mode.md",
    "The refill protocol": "explanation/refill-protocol.md",
    "Database outages": "explanation/database-outages.md",
    "Redis durability and high availability": "how-to/sentinel-cluster.md",
    "Lost replies": "how-to/sentinel-cluster.md",
    "Security": "how-to/security.md",
    "Performance (measured)": "reference/performance.md",
    "HTTP service": "reference/http.md",
    "Metrics": "how-to/monitoring.md",
    "Flower and beat": "how-to/monitoring.md",
    "Deploy: the image": "how-to/image.md",
    "The image": "how-to/image.md",
    "Where no registry is reachable": "how-to/image.md",
    "docker compose (production-like)": "how-to/compose.md",
    "Kubernetes": "how-to/kubernetes.md",
    "Layout": "reference/layout.md",
}


def test_every_section_the_readme_dropped_has_a_page() -> None:
    missing = [f"{title} ({page})" for title, page in MOVED.items()
               if not re.search(rf"^#{{1,3}} {re.escape(title)}$", _page(page), re.MULTILINE)]
    assert missing == []
