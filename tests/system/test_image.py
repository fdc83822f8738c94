"""The image (Dockerfile) built and run by podman (issue 27, item 2;
tests/support/containers.py): built with ``podman build --format docker`` on the stand-in
python:3.11-slim (ops/images/python), it keeps its HEALTHCHECK, user and command; a
container of it runs as uid 10001 with a read-only root filesystem (a tmpfs on /tmp, a
volume on its home, as the manifests' emptyDirs), ``leafpool serve`` answers on the published port,
and the HEALTHCHECK passes. The build's duration and the image's size are printed (README,
"Deploy"). The configuration podman runs with is the project's own: /etc/containers is
neither read nor written.
"""

from __future__ import annotations

import os
import urllib.request
from pathlib import Path

import pytest

from tests.support import containers as c
from tests.support.services import free_port, wait_until

# the first test to use the images builds them: 6 min on a machine without the cache
# one xdist worker runs every container test (./dev test -n): one image build, one podman
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800), pytest.mark.xdist_group("containers")]
pytest_plugins = ["tests.support.container_fixtures"]


def test_the_image_keeps_its_user_command_ports_and_healthcheck(
        podman: c.Podman, images: c.BuildReport) -> None:
    (info,) = podman.inspect(c.LEAFPOOL_IMAGE, kind="image")
    assert info["Config"]["User"] == "leafpool"
    assert info["Config"]["Cmd"] == ["leafpool", "serve"]
    assert set(info["Config"]["ExposedPorts"]) == {"8080/tcp", "5555/tcp"}
    # the Docker format keeps HEALTHCHECK (OCI has no field for it)
    assert info["Healthcheck"]["Test"] == ["CMD", "leafpool", "probe", "http"]
    size = c.image_size(podman, c.LEAFPOOL_IMAGE)
    print(f"{c.LEAFPOOL_IMAGE}: {size / 1e6:.0f} MB; built in "
          f"{images.seconds.get('leafpool image', 0):.1f} s")
    assert size < 600e6  # the stand-in base is Debian's Python: ~340 MB measured


def test_a_container_runs_read_only_as_10001_serves_and_is_healthy(
        podman: c.Podman, images: c.BuildReport) -> None:
    name = f"leafpool-image-test-{os.getpid()}"
    port = free_port()
    podman("run", "--detach", "--name", name, "--read-only", "--tmpfs", "/tmp",
           "--volume", "/var/lib/leafpool",  # anonymous, the image's owner copied up
           "--env", "LEAFPOOL_HTTP_HOST=0.0.0.0",
           "--env", "LEAFPOOL_DATABASE_URL=sqlite:////var/lib/leafpool/leafpool.sqlite3",
           "--publish", f"127.0.0.1:{port}:8080", c.LEAFPOOL_IMAGE)
    try:
        assert podman("exec", name, "id", "-u").stdout.strip() == "10001"
        wrote = podman("exec", name, "touch", "/usr/local/lib/x", check=False)
        assert wrote.returncode != 0 and "Read-only file system" in wrote.stderr

        def alive() -> bool:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=3) as r:
                return int(r.status) == 200

        wait_until(alive, 60, "leafpool serve on the published port", interval=0.2)
        assert podman("healthcheck", "run", name, check=False).returncode == 0
        state = podman("inspect", "--format", "{{.State.Health.Status}}", name).stdout
        assert state.strip() == "healthy"
    finally:
        podman("rm", "--force", "--time", "0", "--volumes", name, check=False)


def test_podman_runs_with_the_projects_configuration(podman: c.Podman,
                                                   images: c.BuildReport) -> None:
    """Read from the cache directory through CONTAINERS_CONF and CONTAINERS_STORAGE_CONF:
    a user's /etc/containers/containers.conf is neither read nor rewritten."""
    info = podman("info", "--format", "{{.Host.OCIRuntime.Name}} {{.Host.CgroupManager}} "
                  "{{.Store.GraphRoot}}").stdout.split()
    assert info == ["runc", "cgroupfs", str(podman.cache / "storage")]
    assert Path(podman.env["CONTAINERS_CONF"]).parent == podman.cache
    ulimits = podman("run", "--rm", c.LEAFPOOL_IMAGE, "sh", "-c", "ulimit -Hn").stdout
    assert int(ulimits) <= 1024
