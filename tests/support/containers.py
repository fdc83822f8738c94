"""Podman for the tests that build and run what leafpool ships beyond the Python package:
the image (Dockerfile), the compose stack (docker-compose.yml) and the Kubernetes dev
overlay's workloads (README, "Deploy" > "Where no registry is reachable").

Podman here runs with a configuration and a store of the project's own, in the cache
directory (``LEAFPOOL_CONTAINER_CACHE``, else ``$XDG_CACHE_HOME/leafpool/containers``, else
``~/.cache/leafpool/containers``): ``CONTAINERS_CONF``, ``CONTAINERS_STORAGE_CONF`` and
``CONTAINERS_REGISTRIES_CONF`` point at files written there, so /etc/containers is neither
read nor written, and nothing of a user's own podman (images, containers, networks) is
seen or touched. What podman needs on these machines is set there: the cgroupfs cgroup
manager and a file events log (no systemd), the runc runtime (crun fails on hybrid
cgroups), ulimits within the machine's hard limits, pulls blocked (no registry is
reachable: a missing image fails at once, naming it).

The images the Dockerfile and compose name are made from Debian's packages
(:data:`STAND_INS`, ``ops/images/``): a root filesystem from mmdebstrap, imported, finished
by a Containerfile, tagged with the official image's name (``docker.io/library/redis:7``,
...) in this store only. Each is kept while what built it is unchanged (a key over the
package list, the mmdebstrap options and the Containerfile's directory); the leafpool image
too (a key over the Dockerfile, what it copies and the base image), and built with podman's
layer cache when its key changed, so a change to leafpool/ rebuilds only the last layers.

Podman 4.3 runs health checks from systemd timers; where there is no systemd,
:class:`HealthChecks` does what the timer would: ``podman healthcheck run`` every
interval, the first one an interval after the container started.

``python -m tests.support.containers build`` builds the images into that store (and says
how long each step took and how big the image is); ``stack [ha]`` times docker-compose.yml's
start; ``env`` prints the variables that point podman at it; ``reset`` removes the store.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from leafpool.children import die_with_parent

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "ops" / "images"
LEAFPOOL_IMAGE = "localhost/leafpool:latest"
SUITE = "bookworm"
#: a machine whose apt trusts a proxy's CA: the image build's RUN steps see that bundle
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
KEY_LABEL = "io.leafpool.stand-in.key"
#: what mmdebstrap is given besides the packages (part of each root filesystem's key)
MMDEBSTRAP_OPTIONS = (
    "--variant=minbase",
    '--aptopt=APT::Install-Recommends "false"',
    "--dpkgopt=path-exclude=/usr/share/doc/*",
    "--dpkgopt=path-exclude=/usr/share/man/*",
    "--dpkgopt=path-exclude=/usr/share/locale/*",
    # update-alternatives links a man page there (openjdk): the directory must exist
    '--essential-hook=mkdir -p "$1/usr/share/man/man1"',
)
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class StandIn:
    """An official image made from Debian's packages: ``ops/images/<name>/Containerfile``
    on the root filesystem ``ops/images/<rootfs>/packages`` lists, tagged ``tags``."""

    name: str
    rootfs: str
    tags: tuple[str, ...]


STAND_INS = (
    StandIn("python", "python", ("docker.io/library/python:3.11-slim",)),
    StandIn("redis", "services", ("docker.io/library/redis:7",)),
    StandIn("mariadb", "services", ("docker.io/library/mysql:8.0",
                                    "docker.io/library/mariadb:11.4")),
    StandIn("zookeeper", "services", ("docker.io/library/zookeeper:3.8",)),
)

#: the Debian packages each tool comes from (`./dev test` installs them)
TOOLS = {"podman": "podman", "runc": "runc", "mmdebstrap": "mmdebstrap",
         "iptables": "iptables", "catatonit": "catatonit"}
HELPERS = {"/usr/lib/podman/netavark": "netavark", "/usr/lib/podman/aardvark-dns": "aardvark-dns"}


class Unavailable(RuntimeError):
    """Podman cannot run here; ``reason`` says why (and what installs it)."""


def cache_dir() -> Path:
    explicit = os.environ.get("LEAFPOOL_CONTAINER_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "leafpool" / "containers"


CACHE = cache_dir()  # read once: the tests' fixtures clear LEAFPOOL_* from the environment


def check_tools(extra: Sequence[str] = ()) -> None:
    """Raise :class:`Unavailable` naming what is missing."""
    if os.geteuid() != 0:
        raise Unavailable("the container tests run podman as root (rootless podman needs "
                          "subordinate IDs this setup does not configure)")
    missing = [pkg for tool, pkg in {**TOOLS, **{t: t for t in extra}}.items()
               if shutil.which(tool) is None]
    missing += [pkg for path, pkg in HELPERS.items() if not Path(path).exists()]
    if missing:
        raise Unavailable(f"{', '.join(sorted(set(missing)))} not installed (Debian packages; "
                          "`./dev test` installs them)")


def _hard_limit(which: int, want: int) -> int:
    hard = resource.getrlimit(which)[1]
    return want if hard == resource.RLIM_INFINITY else min(want, hard)


@dataclass
class Podman:
    """podman with the project's configuration and store (:func:`podman`)."""

    cache: Path

    @property
    def run_dir(self) -> Path:
        return self.cache / "run"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ,
                "CONTAINERS_CONF": str(self.cache / "containers.conf"),
                "CONTAINERS_STORAGE_CONF": str(self.cache / "storage.conf"),
                "CONTAINERS_REGISTRIES_CONF": str(self.cache / "registries.conf"),
                "TMPDIR": str(self.cache / "tmp")}

    def __call__(self, *args: str, check: bool = True, timeout: float = 120,
                 stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(["podman", *args], env=self.env, capture_output=True, text=True,
                              timeout=timeout, input=stdin)
        if check and done.returncode != 0:
            raise RuntimeError(f"podman {' '.join(args)}: exit {done.returncode}: "
                               f"{done.stderr.strip()[-3000:]}")
        return done

    def inspect(self, *names: str, kind: str = "container") -> list[dict[str, Any]]:
        out = self(kind, "inspect", *names).stdout
        result: list[dict[str, Any]] = json.loads(out)
        return result

    def exists(self, kind: str, name: str) -> bool:
        return self(kind, "exists", name, check=False).returncode == 0

    def exec(self, container: str, *argv: str, timeout: float = 60,
             check: bool = False) -> subprocess.CompletedProcess[str]:
        """``podman exec`` with HOSTNAME set to the container's hostname, as Docker and the
        kubelet's runtimes give every process of a container: podman 4.3 leaves it out of
        an exec'd process's environment (a check naming ``$HOSTNAME``, as the Celery ping
        of compose and the manifests does, would ask for a worker named ``segment@``)."""
        host = self("inspect", "--format", "{{.Config.Hostname}}", container).stdout.strip()
        return self("exec", "--env", f"HOSTNAME={host}", container, *argv, timeout=timeout,
                    check=check)

    def pid(self, container: str) -> int:
        return int(self("inspect", "--format", "{{.State.Pid}}", container).stdout.strip())

    def leftovers(self) -> dict[str, list[str]]:
        """Every container, pod, volume and network (but podman's default) in the store."""
        names = {
            "containers": self("ps", "-a", "--format", "{{.Names}}").stdout.split(),
            "pods": self("pod", "ps", "--format", "{{.Name}}").stdout.split(),
            "volumes": self("volume", "ls", "--format", "{{.Name}}").stdout.split(),
            "networks": [n for n in self("network", "ls", "--format", "{{.Name}}").stdout.split()
                         if n != "podman"],
            "secrets": self("secret", "ls", "--format", "{{.Name}}").stdout.split(),
        }
        return {kind: found for kind, found in names.items() if found}

    def wipe(self) -> None:
        """Remove every container, pod, volume, network and secret of the store: what an
        interrupted run left (the store is the tests' alone)."""
        self("pod", "rm", "--all", "--force", "--time", "0", check=False)
        self("rm", "--all", "--force", "--time", "0", "--volumes", check=False)
        self("volume", "prune", "--force", check=False)
        self("network", "prune", "--force", check=False)
        for secret in self("secret", "ls", "--format", "{{.Name}}", check=False).stdout.split():
            self("secret", "rm", secret, check=False)


def _write_if_changed(path: Path, text: str) -> None:
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def podman(cache: Path = CACHE) -> Podman:
    """Podman pointed at the project's configuration and store in ``cache`` (written or
    refreshed here); raises :class:`Unavailable` when it cannot run."""
    check_tools()
    cache.mkdir(parents=True, exist_ok=True)
    run = cache / "run"
    # runtime state from an earlier boot describes processes and mounts that are gone
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    stamp = run / "boot_id"
    if run.exists() and (not stamp.exists() or stamp.read_text() != boot):
        shutil.rmtree(run, ignore_errors=True)
    run.mkdir(exist_ok=True)
    stamp.write_text(boot)
    for sub in ("tmp", "networks", "storage"):
        (cache / sub).mkdir(exist_ok=True)
    nofile = _hard_limit(resource.RLIMIT_NOFILE, 1024)
    nproc = _hard_limit(resource.RLIMIT_NPROC, 4096)
    header = "# written by tests/support/containers.py: leafpool's container tests\n"
    _write_if_changed(cache / "containers.conf", header + f"""
[containers]
default_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]

[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
# an exec session's conmon waits this long for an API client to read its exit code
# (podman's default, 300 s, leaves one behind for five minutes after every check)
exit_command_delay = 10
events_logfile_path = "{run}/events.log"
runtime = "runc"
tmp_dir = "{run}/libpod"
image_copy_tmp_dir = "{cache}/tmp"

[network]
network_config_dir = "{cache}/networks"
""")
    _write_if_changed(cache / "storage.conf", header + f"""
[storage]
driver = "overlay"
graphroot = "{cache}/storage"
runroot = "{run}/storage"
""")
    # short names (redis:7) resolve to docker.io/library/...; nothing is ever pulled
    _write_if_changed(cache / "registries.conf", header + """
unqualified-search-registries = ["docker.io"]
short-name-mode = "permissive"

[[registry]]
location = "docker.io"
blocked = true
""")
    return Podman(cache)


@contextlib.contextmanager
def store_lock(cache: Path = CACHE) -> Iterator[None]:
    """The store for one test session at a time (a second one would remove the first's
    containers as leftovers)."""
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / "lock", "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise Unavailable(f"another test session is using the container store {cache}"
                              ) from None
        yield


# -- the images ------------------------------------------------------------------------

def _digest(*parts: bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return h.hexdigest()


def _tree_bytes(directory: Path) -> list[bytes]:
    out = []
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        out += [str(path.relative_to(directory)).encode(),
                oct(path.stat().st_mode & 0o777).encode(), path.read_bytes()]
    return out


def packages(rootfs: str) -> list[str]:
    lines = (IMAGES / rootfs / "packages").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def rootfs_key(rootfs: str) -> str:
    """Over the suite, mmdebstrap's options and ``ops/images/<rootfs>/`` (the package list
    and the customize hook, if any)."""
    return _digest(SUITE.encode(), *(o.encode() for o in MMDEBSTRAP_OPTIONS),
                   *_tree_bytes(IMAGES / rootfs))


def mmdebstrap_argv(rootfs: str, out: Path) -> list[str]:
    hook = IMAGES / rootfs / "customize.sh"
    hooks = [f"--customize-hook={hook}"] if hook.exists() else []
    return ["mmdebstrap", *MMDEBSTRAP_OPTIONS, *hooks,
            f"--include={','.join(packages(rootfs))}", SUITE, str(out)]


def rootfs_tag(rootfs: str) -> str:
    return f"localhost/leafpool-rootfs-{rootfs}:{rootfs_key(rootfs)[:16]}"


def stand_in_key(stand_in: StandIn) -> str:
    return _digest(rootfs_key(stand_in.rootfs).encode(), *_tree_bytes(IMAGES / stand_in.name))


@dataclass
class BuildReport:
    """Seconds each step took; a step that was cached is absent."""

    seconds: dict[str, float] = field(default_factory=dict)
    log: list[str] = field(default_factory=list)


def _label(p: Podman, image: str, label: str = KEY_LABEL) -> str | None:
    if not p.exists("image", image):
        return None
    return p("image", "inspect", "--format", f'{{{{index .Labels "{label}"}}}}',
             image).stdout.strip() or None


def ensure_rootfs(p: Podman, rootfs: str, report: BuildReport) -> str:
    """The imported root filesystem ``rootfs``, made by mmdebstrap unless kept."""
    tag = rootfs_tag(rootfs)
    if p.exists("image", tag):
        return tag
    started = time.monotonic()
    tar = p.cache / "tmp" / f"rootfs-{rootfs}.tar"
    try:
        done = subprocess.run(
            mmdebstrap_argv(rootfs, tar), env=p.env, capture_output=True, text=True,
            timeout=1800)
        if done.returncode != 0:
            raise RuntimeError(f"mmdebstrap ({rootfs}) failed: {done.stderr[-3000:]}")
        p("import", "--change", f"ENV PATH={BASE_PATH}", "--change",
          f"LABEL {KEY_LABEL}={rootfs_key(rootfs)}", str(tar), tag, timeout=600)
    finally:
        tar.unlink(missing_ok=True)
    report.seconds[f"rootfs {rootfs}"] = time.monotonic() - started
    # an earlier key's root filesystem: untagged (its layers go once nothing uses them)
    for old in p("images", "--format", "{{.Repository}}:{{.Tag}}",
                 f"localhost/leafpool-rootfs-{rootfs}").stdout.split():
        if old != tag:
            p("untag", old, check=False)
    return tag


def ensure_stand_in(p: Podman, stand_in: StandIn, report: BuildReport) -> None:
    key = stand_in_key(stand_in)
    if all(_label(p, tag) == key for tag in stand_in.tags):
        return
    base = ensure_rootfs(p, stand_in.rootfs, report)
    started = time.monotonic()
    tags = [arg for tag in stand_in.tags for arg in ("--tag", tag)]
    directory = IMAGES / stand_in.name
    p("build", "--format", "docker", "--pull=never", "--build-arg", f"ROOTFS={base}",
      "--label", f"{KEY_LABEL}={key}", *tags, "--file", str(directory / "Containerfile"),
      str(directory), timeout=900)
    report.seconds[f"stand-in {stand_in.name}"] = time.monotonic() - started


#: the Dockerfile, its ignore file and what it copies (the context the ignore file lets in)
LEAFPOOL_CONTEXT = ("Dockerfile", ".dockerignore", "requirements/run.txt", "pyproject.toml",
                    "README.md", "leafpool", "workers")
CONTEXT_LABEL = "io.leafpool.context.key"


def _context_bytes(path: Path) -> list[bytes]:
    if path.is_dir():
        files = sorted(f for f in path.rglob("*") if f.is_file()
                       and "__pycache__" not in f.parts and f.suffix != ".pyc")
    else:
        files = [path] if path.exists() else []
    return [part for f in files for part in (
        str(f.relative_to(ROOT)).encode(), oct(f.stat().st_mode & 0o777).encode(),
        f.read_bytes())]


def leafpool_key(p: Podman) -> str:
    """Over the build's inputs: the files of :data:`LEAFPOOL_CONTEXT` (names, modes,
    contents) and the base image's ID (a stand-in rebuilt is a new base)."""
    base = p("image", "inspect", "--format", "{{.Id}}",
             "docker.io/library/python:3.11-slim").stdout.strip()
    return _digest(base.encode(), *(part for name in LEAFPOOL_CONTEXT
                                    for part in _context_bytes(ROOT / name)))


def build_leafpool(p: Podman, report: BuildReport) -> None:
    """``podman build`` of the Dockerfile (its layers cached in the store), tagged
    leafpool:latest as compose and the manifests name it; not run while the image's
    label holds the key of the same inputs (:func:`leafpool_key`): a build from the
    layer cache still reads the whole context and commits a new image."""
    key = leafpool_key(p)
    if _label(p, LEAFPOOL_IMAGE, CONTEXT_LABEL) == key:
        return
    started = time.monotonic()
    volume = ["--volume", f"{HOST_CA}:{HOST_CA}:ro"] if HOST_CA.exists() else []
    done = p("build", "--format", "docker", "--pull=never", *volume, "--tag", LEAFPOOL_IMAGE,
             "--label", f"{CONTEXT_LABEL}={key}",
             "--file", str(ROOT / "Dockerfile"), str(ROOT), timeout=1500, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"podman build of the Dockerfile failed:\n{done.stdout[-4000:]}\n"
                           f"{done.stderr[-2000:]}")
    report.seconds["leafpool image"] = time.monotonic() - started
    report.log.append(done.stdout)
    p("image", "prune", "--force", check=False)  # the previous leafpool:latest, untagged


def ensure_images(p: Podman) -> BuildReport:
    """Every stand-in (kept while its key holds) and the leafpool image."""
    report = BuildReport()
    for stand_in in STAND_INS:
        ensure_stand_in(p, stand_in, report)
    build_leafpool(p, report)
    return report


def image_size(p: Podman, image: str) -> int:
    return int(p("image", "inspect", "--format", "{{.Size}}", image).stdout.strip())


# -- health checks without systemd -------------------------------------------------------

def _nanoseconds(value: Any) -> float:
    return float(value or 0) / 1e9


class HealthChecks:
    """Runs every running container's health check as podman's systemd timer would: one
    ``podman healthcheck run`` an interval after the container (re)started, then an
    interval after each run ended. One thread per container start; stops with
    :meth:`stop`."""

    def __init__(self, p: Podman) -> None:
        self.p = p
        self.stopping = threading.Event()
        self.seen: set[tuple[str, str]] = set()  # (container ID, StartedAt)
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def start(self) -> HealthChecks:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        if self.thread.is_alive():
            self.thread.join(timeout=30)

    def _watch(self) -> None:
        while not self.stopping.is_set():
            ids = self.p("ps", "--quiet", "--no-trunc", check=False).stdout.split()
            found = self.p("inspect", *ids, check=False).stdout if ids else ""
            for info in json.loads(found or "[]"):
                check = (info.get("Config") or {}).get("Healthcheck")
                if not check or not check.get("Test") or check["Test"][0] == "NONE":
                    continue
                key = (info["Id"], info["State"]["StartedAt"])
                if key in self.seen:
                    continue
                self.seen.add(key)
                interval = _nanoseconds(check.get("Interval")) or 30.0
                threading.Thread(target=self._run, args=(info["Id"], key[1], interval),
                                 daemon=True).start()
            self.stopping.wait(1)

    def _run(self, container: str, started: str, interval: float) -> None:
        while not self.stopping.wait(interval):
            found = self.p("inspect", container, check=False)
            if found.returncode != 0:
                return  # removed
            state = json.loads(found.stdout)[0]["State"]
            if not state["Running"] or state["StartedAt"] != started:
                return  # stopped, or restarted: the watcher starts another thread
            self.p("healthcheck", "run", container, check=False, timeout=max(interval, 60))


# -- podman's Docker API for docker-compose ---------------------------------------------

class ApiService:
    """``podman system service`` on a socket in the store's run directory: the Docker API
    docker-compose talks to."""

    def __init__(self, p: Podman, log: Path) -> None:
        self.p = p
        self.socket = p.run_dir / "docker.sock"
        self.socket.unlink(missing_ok=True)
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                ["podman", "system", "service", "--time=0", f"unix://{self.socket}"],
                env=p.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=die_with_parent(signal.SIGKILL))
        deadline = time.monotonic() + 30
        while not self._answers():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"podman system service did not start: {log.read_text()}")
            time.sleep(0.1)

    def _answers(self) -> bool:
        with socket.socket(socket.AF_UNIX) as s:
            try:
                s.connect(str(self.socket))
            except OSError:
                return False
            return True

    @property
    def docker_host(self) -> str:
        return f"unix://{self.socket}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.socket.unlink(missing_ok=True)


COMPOSE_FILE = ROOT / "docker-compose.yml"
#: variables of the developer's shell that compose would read into the file
_LEAKY = ("LEAFPOOL_", "MYSQL_", "COMPOSE_", "REDIS_", "FLOWER_", "DOCKER_")


class Compose:
    """docker-compose (Debian's, 1.29) on docker-compose.yml against podman's Docker API,
    as project ``project``, with ``env`` as the only variables it reads (no developer's
    .env or shell variable leaks in)."""

    def __init__(self, api: ApiService, project: str, env: dict[str, str], workdir: Path,
                 profiles: Sequence[str] = ()) -> None:
        binary = shutil.which("docker-compose")
        if binary is None:
            raise Unavailable("docker-compose not installed (Debian package docker-compose; "
                              "`./dev test` installs it)")
        self.binary, self.api, self.project = binary, api, project
        self.empty = workdir / "empty.env"
        self.empty.write_text("")
        base = {k: v for k, v in os.environ.items() if not k.startswith(_LEAKY)}
        self.env = {**base, **env, "DOCKER_HOST": api.docker_host}
        self.profiles = [arg for profile in profiles for arg in ("--profile", profile)]

    def __call__(self, *args: str, timeout: float = 600,
                 check: bool = True) -> subprocess.CompletedProcess[str]:
        argv = [self.binary, "--file", str(COMPOSE_FILE), "--project-directory", str(ROOT),
                "--env-file", str(self.empty), "--project-name", self.project,
                *self.profiles, *args]
        done = subprocess.run(argv, env=self.env, cwd=ROOT, capture_output=True, text=True,
                              timeout=timeout)
        if check and done.returncode != 0:
            raise RuntimeError(f"docker-compose {' '.join(args)}: exit {done.returncode}:\n"
                               f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        return done

    def container(self, service: str, index: int = 1) -> str:
        """The name docker-compose gives the service's container."""
        return f"{self.project}_{service}_{index}"


# -- the command line ------------------------------------------------------------------

def _main(argv: list[str], out: TextIO) -> int:
    command = argv[0] if argv else ""
    if command == "build":
        p = podman()
        with store_lock(p.cache):
            report = ensure_images(p)
        for step, seconds in report.seconds.items():
            print(f"{step}: {seconds:.1f} s", file=out)
        print(f"{LEAFPOOL_IMAGE}: {image_size(p, LEAFPOOL_IMAGE) / 1e6:.0f} MB", file=out)
        return 0
    if command == "stack":  # stack [PROFILE...]: how long compose takes to serve
        return _measure_stack(argv[1:], out)
    if command == "env":
        p = podman()
        for name in ("CONTAINERS_CONF", "CONTAINERS_STORAGE_CONF", "CONTAINERS_REGISTRIES_CONF"):
            print(f"export {name}={p.env[name]}", file=out)
        return 0
    if command == "reset":
        p = podman()
        user_config = Path.home() / ".config" / "containers"
        had_config = user_config.exists()
        with store_lock(p.cache):
            p.wipe()
            p("system", "reset", "--force", check=False)
        if not had_config:  # `podman system reset` makes it (empty)
            shutil.rmtree(user_config, ignore_errors=True)
        shutil.rmtree(p.cache, ignore_errors=True)
        return 0
    print("usage: python -m tests.support.containers build|stack [PROFILE...]|env|reset",
          file=out)
    return 2


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return int(resp.status) == 200
    except OSError:
        return False


def _measure_stack(profiles: list[str], out: TextIO) -> int:
    """docker-compose.yml up with the tests' dummy secrets, timed until the HTTP service
    (and with ``ha``, http-ha) answers, then down -v (README, "Deploy")."""
    import tempfile

    from tests.system.test_compose import HA_SECRETS, SECRETS

    p = podman()
    with store_lock(p.cache), tempfile.TemporaryDirectory(dir=p.cache / "tmp") as scratch:
        ensure_images(p)
        api = ApiService(p, Path(scratch) / "service.log")
        health = HealthChecks(p).start()
        compose = Compose(api, "lpmeasure", {**SECRETS, **HA_SECRETS}, Path(scratch),
                          profiles=profiles)
        try:
            started = time.monotonic()
            compose("up", "--detach", "--no-build", timeout=900)
            print(f"up -d returned after {time.monotonic() - started:.1f} s", file=out)
            urls = ["http://127.0.0.1:8080/health"]
            urls += ["http://127.0.0.1:8081/readyz"] if "ha" in profiles else []
            for url in urls:
                deadline = time.monotonic() + 300
                while not _answers(url) and time.monotonic() < deadline:
                    time.sleep(0.2)
                print(f"{url} answered after {time.monotonic() - started:.1f} s", file=out)
        finally:
            stopping = time.monotonic()
            compose("down", "--volumes", "--timeout", "5", timeout=300, check=False)
            print(f"down -v took {time.monotonic() - stopping:.1f} s", file=out)
            health.stop()
            api.stop()
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:], sys.stdout))
