"""pytest fixtures for the container tests (tests/support/containers.py): podman with the
project's own configuration and store, and the images built once per session.

A test module using them declares ``pytest_plugins = ["tests.support.container_fixtures"]``.
Podman, mmdebstrap, runc, catatonit, netavark, aardvark-dns or iptables missing (`./dev
test` installs them), or not root: the tests skip saying so, and fail under ``CI=true``
(:func:`tests.support.services.unavailable`).

At the start of the session the store is emptied of containers, pods, volumes, networks
and secrets (an interrupted run's), and at its end the fixture fails the session's last
test if a test left any.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from tests.support import containers as c
from tests.support.services import unavailable

__all__ = ["images", "podman"]


@pytest.fixture(scope="session")
def podman() -> Iterator[c.Podman]:
    with contextlib.ExitStack() as stack:
        try:
            p = c.podman()
            stack.enter_context(c.store_lock(p.cache))
        except c.Unavailable as exc:
            unavailable(str(exc))
        p.wipe()
        yield p
        left = p.leftovers()
        p.wipe()
        assert not left, f"the container tests left {left}"


@pytest.fixture(scope="session")
def images(podman: c.Podman) -> c.BuildReport:
    """The stand-ins (kept between runs while what built them is unchanged) and the
    leafpool image (podman build with the store's layer cache)."""
    report = c.ensure_images(podman)
    for step, seconds in report.seconds.items():
        print(f"built {step} in {seconds:.1f} s")
    return report
