"""The release this code is (docs/reference/compatibility.md): one place names it, and
``pyproject.toml``'s ``version``, ``CHANGELOG.md``'s newest heading and this constant are
kept equal by ``tests/test_version.py``.

Read from here, not from the installed package's metadata: the metadata is written at
install time (an editable install keeps the version it was installed at), and a tree run
from its sources (``PYTHONPATH``, as the mixed-version test runs the previous release)
would report whatever leafpool is installed beside it.
"""

from __future__ import annotations

__version__ = "0.2.0"
