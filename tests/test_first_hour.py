"""The first hour on a fresh machine (issue 20, item 7), each papercut run as a real process:
the commands ``leafpool up`` prints work as typed with neither curl nor the venv on PATH;
``./dev`` prints no BuildBackendWarning; ``leafpool status`` piped or in a 60-column
terminal keeps each tag on one line, and ``--format tsv`` is for a script; ``bench --smoke``
says its figures are not measurements; a passing test keeps no temporary directory."""

from __future__ import annotations

import json
import os
import pty
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from leafpool.cli_status import TSV_FIELDS
from leafpool.redis.lock import RefillLock
from leafpool.redis.pool import Pool, Range
from tests.support import services
from tests.support.bench_smoke import Smoke
from tests.support.processes import Proc, leafpool_env

ROOT = Path(__file__).resolve().parents[1]
LEAFPOOL = Path(sys.executable).parent / "leafpool"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _bare_path(tmp_path: Path, *tools: str) -> str:
    """A PATH with only these tools: no curl, no venv (a minimal Debian's shell)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in tools:  # python3: the interpreter itself (a version manager's shim
        # may need the manager on PATH)
        found = str(Path(sys.executable).resolve()) if tool == "python3" else shutil.which(tool)
        if found:
            (bin_dir / tool).symlink_to(found)
    return str(bin_dir)


@pytest.mark.slow
def test_every_command_up_prints_works_as_typed(tmp_path: Path) -> None:
    if shutil.which("redis-server") is None:
        services.missing("redis-server")
    if not LEAFPOOL.exists():
        pytest.skip("no leafpool script beside this Python (not installed in a venv)")
    port, http_port = services.free_port(), services.free_port()
    env = leafpool_env(home=tmp_path / "home", redis_url=f"redis://127.0.0.1:{port}/0",
                       http_port=http_port)
    env["PATH"] = _bare_path(tmp_path, "redis-server", "redis-cli", "python3", "bash", "env")
    assert shutil.which("curl", path=env["PATH"]) is None
    up = Proc([str(LEAFPOOL), "up"], env)  # as ./dev up starts it: the venv's script
    try:
        up.wait_line("Ctrl-C stops everything", 120)
        services.wait_until(lambda: services.port_open(http_port), 30, "HTTP service")
        start = max(i for i, line in enumerate(up.seen) if line.startswith("IDs served"))
        commands = [line.strip() for line in up.seen[start + 1:]
                    if line.startswith("  ") and line.strip()]
        assert len(commands) >= 5, up.seen
        assert not [c for c in commands if c.startswith(("leafpool ", "curl "))], commands
        def bash(command: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(["bash", "-c", command], cwd=ROOT, env=env, timeout=60,
                                  capture_output=True, text=True)

        for command in commands:
            done = bash(command)
            assert done.returncode == 0 and done.stdout.strip(), (command, done.stderr)
            if " pop " in command or "LPOP" in command or "urlopen" in command:
                assert re.search(r"\d", done.stdout), (command, done.stdout)
        _readme_opening_works_as_printed(bash, port, http_port)
        # the warnings nobody saw in the logs (issue 27): Redis's said by up, each with
        # its fix; Celery's about root silenced (JSON only: its pickle hazard is not ours)
        logs = tmp_path / "home" / "logs"
        assert "superuser privileges" not in (logs / "worker.log").read_text()
        warned = [line for line in (logs / "redis.log").read_text().splitlines()
                  if " # WARNING " in line]
        said = [line for line in up.seen if line.startswith("  redis-server warns")]
        assert [w.split(" # WARNING ", 1)[1] for w in warned] == [
            s.split("(its log): ", 1)[1] for s in said], (warned, said)
    finally:
        up.kill()


def _readme_opening_works_as_printed(bash: Callable[[str], subprocess.CompletedProcess[str]],
                                     port: int, http_port: int) -> None:
    """The README's first examples with ``leafpool up`` running (issue 27: they used a tag
    ``order`` it does not make): its LPOPs take IDs, its HTTP line without curl serves one,
    and the tags the rest of the README uses are added as its "First hour" says, then
    filled by up's worker."""
    opening = (ROOT / "README.md").read_text().split("\n## ", 1)[0]
    lpops = re.findall(r"^(redis-cli LPOP .*?)\s+#", opening, re.M)
    assert len(lpops) == 2, lpops
    for line in lpops:
        done = bash(line.replace("redis-cli", f"redis-cli -p {port}", 1))
        assert re.search(r"^\d+$", done.stdout, re.M), (line, done.stdout, done.stderr)
    (http,) = re.findall(r"^  `(python3 -c .*)`$", opening, re.M)
    done = bash(http.replace(":8080/", f":{http_port}/"))
    assert re.fullmatch(r"\d+\s*", done.stdout), (http, done.stdout, done.stderr)
    adds = re.findall(r"`\./dev leafpool (tag add [^`]+)`", opening.replace("\n  ", " "))
    assert [a.split()[2] for a in adds] == ["order", "orderno"], adds
    for add in adds:
        done = bash(f"{LEAFPOOL} {add}")
        assert done.returncode == 0, (add, done.stderr)
    for tag in ("order", "orderno"):
        services.wait_until(lambda tag=tag: bash(f"{LEAFPOOL} pop {tag} -n 5").returncode == 0,
                            30, f"IDs of {tag}, added while up runs")


def test_dev_runs_leafpool_without_a_build_backend_warning(tmp_path: Path) -> None:
    """The editable install is a .pth entry (pyproject: package-dir ""), which setuptools
    makes without its BuildBackendWarning; and ./dev installs only when a lock changed."""
    if not (ROOT / ".venv" / "bin" / "leafpool").exists():
        pytest.skip("no .venv: ./dev has not installed the project here")
    for _ in range(2):  # the second run finds nothing to install
        done = subprocess.run([str(ROOT / "dev"), "leafpool", "--help"], cwd=ROOT,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr
        assert "Usage" in done.stdout and "leafpool" in done.stdout
        assert "Warning" not in done.stderr + done.stdout, done.stderr
    # pip's own editable install of this project, as ./dev makes it, into a scratch venv
    subprocess.run([sys.executable, "-m", "venv", str(tmp_path / "v")], check=True,
                   timeout=120)
    done = subprocess.run([str(tmp_path / "v" / "bin" / "pip"), "install", "--no-deps",
                           "--disable-pip-version-check", "-e", str(ROOT)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "Warning" not in done.stdout + done.stderr, done.stderr
    where = subprocess.run([str(tmp_path / "v" / "bin" / "python"), "-c",
                            "import importlib.util as u; print(u.find_spec('leafpool').origin)"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert where.stdout.strip() == str(ROOT / "leafpool" / "__init__.py"), where.stderr


def _cli(env: dict[str, str], *args: str, tty: bool = False) -> str:
    """``leafpool ARGS``'s output, piped or (``tty``) on a terminal."""
    argv = [sys.executable, "-m", "leafpool.cli", *args]
    if not tty:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout
    leader, follower = pty.openpty()
    proc = subprocess.Popen(argv, env=env, stdout=follower, stderr=subprocess.PIPE)
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the terminal's other end closed
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    assert proc.wait(timeout=60) == 0
    return ANSI.sub("", b"".join(chunks).decode().replace("\r\n", "\n"))


def _status(env: dict[str, str], *args: str, tty: bool = False) -> str:
    return _cli(env, "status", *args, tty=tty)


def test_status_piped_or_narrow_keeps_each_tag_on_one_line(
    pool: Pool, redis_url: str, tmp_path: Path
) -> None:
    error = "order.long: the database said something long enough to wrap a narrow terminal"
    tags = ["order.long", "pay", "user"]
    for tag in tags:
        pool.register(tag, "segment", 0, last_error=error if tag == "order.long" else "",
                      last_error_ms=1_700_000_000_000 if tag == "order.long" else 0)
    lock = RefillLock(pool.redis, pool.tag("pay").lock, 10_000)
    assert lock.acquire()
    pool.record("pay", target=8000, peak_rate="10", last_refill_ms=1_700_000_000_000,
                step=4000, table_step=1000)
    pool.append_reserve("pay", lock.token, Range(1, 20_001))
    pool.push("pay", lock.token, Range(1, 20_001), 6614, 0)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEAFPOOL_")}
    env.update({"LEAFPOOL_REDIS_URL": redis_url, "COLUMNS": "60", "TERM": "xterm",
                "LEAFPOOL_DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
                "LEAFPOOL_HOME": os.environ["LEAFPOOL_HOME"]})

    for out in (_status(env), _status(env, tty=True)):  # a pipe; a 60-column terminal
        lines = [line for line in out.splitlines() if line.strip()]
        assert lines[0].split()[:2] == ["tag", "mode"], out
        assert lines[-1].startswith("step: the step allocations use now")  # pay's 4,000
        rows = lines[1:-1]
        assert [r.split()[0] for r in rows] == tags, out  # one line a tag, nothing else
        assert error in rows[0]  # whole, not folded nor cut
        assert not any(ch in out for ch in "│┃━─"), out  # not rich's table

    wide = _status({**env, "COLUMNS": "400"}, tty=True)
    assert "┃" in wide or "│" in wide  # a terminal wide enough: the table

    tsv = _status(env, "--format", "tsv").splitlines()
    table = [line.split("\t") for line in tsv]
    assert table[0] == list(TSV_FIELDS)
    assert all(len(row) == len(TSV_FIELDS) for row in table)
    by_tag = {row[0]: dict(zip(TSV_FIELDS, row, strict=True)) for row in table[1:]}
    assert list(by_tag) == tags and error in by_tag["order.long"][TSV_FIELDS[-1]]
    # for a script (issue 27): plain values, the JSON's, not 6,614, 15m ago or 28s+12m
    pay = by_tag["pay"]
    assert (pay["mode"], pay["length"], pay["target"], pay["reserve_size"]) == (
        "segment", "6614", "8000", "13386")
    assert (pay["step"], pay["table_step"]) == ("4000", "1000")
    assert pay["last_refill_ms"] == "1700000000000" and pay["max_id"] == ""  # none
    assert (pay["list_seconds"], pay["reserve_seconds"]) == ("661.4", "1338.6")
    assert by_tag["order.long"]["last_error_ms"] == "1700000000000"
    as_json = {st["tag"]: st for st in json.loads(_status(env, "--json"))}
    for tag, row in by_tag.items():
        for name, cell in row.items():
            value = as_json[tag][name]
            if isinstance(value, float):
                assert float(cell) == pytest.approx(value, abs=0.001), (tag, name, cell)
            else:
                plain = ",".join(value) if isinstance(value, list) else value
                assert cell == ("" if plain is None else str(plain)), (tag, name, cell)


def test_tag_list_follows_the_rule_status_does(redis_url: str, tmp_path: Path) -> None:
    """Plain lines when stdout is not a terminal, rich's table on a wide terminal, and the
    same ``--format`` (issue 27: it drew a box table into a pipe)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEAFPOOL_")}
    env.update({"LEAFPOOL_REDIS_URL": redis_url, "COLUMNS": "200", "TERM": "xterm",
                "LEAFPOOL_DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
                "LEAFPOOL_HOME": os.environ["LEAFPOOL_HOME"]})
    _cli(env, "db", "init")
    _cli(env, "tag", "add", "order", "--step", "1000", "--description", "the orders")
    _cli(env, "tag", "add", "orderno", "--mode", "snowflake")
    for piped in (_cli(env, "tag", "list"), _cli(env, "tag", "list", "--format", "plain",
                                                 tty=True)):
        lines = piped.splitlines()
        assert not any(ch in piped for ch in "│┃━─"), piped
        assert lines[0].split() == ["tag", "mode", "max_id", "table", "step", "description"]
        assert lines[1].split() == ["order", "segment", "1", "1000", "the", "orders"]
        assert lines[2].split() == ["orderno", "snowflake", "-", "-"] and len(lines) == 3
    wide = _cli(env, "tag", "list", tty=True)
    assert "┃" in wide or "│" in wide
    assert _cli(env, "tag", "list", "--format", "tsv").splitlines() == [
        "tag\tmode\tmax_id\ttable_step\tdescription",
        "order\tsegment\t1\t1000\tthe orders", "orderno\tsnowflake\t\t\t"]
    assert json.loads(_cli(env, "tag", "list", "--format", "json")) == json.loads(
        _cli(env, "tag", "list", "--json"))


@pytest.mark.slow
def test_bench_smoke_says_its_figures_are_not_measurements(
        bench_smoke: Callable[[str], Smoke]) -> None:
    """The banner opens and closes the output, even of a section that stops early (the
    session's one run of the section: tests/support/bench_smoke.py)."""
    if shutil.which("redis-server") is None:
        services.missing("redis-server")
    done = bench_smoke("tls")
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    assert lines, done.stderr
    assert "NOT measurements" in lines[0] and "NOT measurements" in lines[-1], lines
    assert done.stdout.count("NOT measurements") == 2


@pytest.mark.slow
@pytest.mark.parametrize("section", ["pools", "outage"])
def test_bench_smoke_reads_as_working(bench_smoke: Callable[[str], Smoke],
                                      section: str) -> None:
    """Issue 27: a smoke run printed "refill failed: ... Can't connect to MySQL server" (the
    outage section kills MariaDB on purpose) and a targets table of NO rows (its figures
    mean nothing by design): the killed database's warnings are not printed (the table
    counts them) and no target is judged. (The session's one run of the section, 200
    columns wide: tests/support/bench_smoke.py.)"""
    for binary in ("redis-server", "mariadbd"):
        if shutil.which(binary) is None and not Path(f"/usr/sbin/{binary}").exists():
            services.missing(binary)
    done = bench_smoke(section)
    said = done.stdout + done.stderr
    assert done.returncode == 0, said[-3000:]
    assert "refill failed" not in said and "Can't connect" not in said, said[-3000:]
    assert not re.search(r"\bNO\b", said), said
    if section == "pools":
        assert said.count("not judged (smoke)") >= 10, said
    else:
        assert "refills failed" in said and "as this section means them to" in said, said


def test_a_passing_test_keeps_no_temporary_directory(tmp_path: Path) -> None:
    """pyproject's tmp_path_retention_policy = "failed": the MariaDB data directory of a
    passing test does not stay in the temporary folder; a failed test's does, for a look.
    Nor does a directory a fixture shared (a CA's keys: ``pki`` in tests/conftest.py),
    which pytest kept once any test failed (tests/support/tmp_retention.py)."""
    (tmp_path / "test_scratch.py").write_text(
        "import pytest\n\n"
        "@pytest.fixture(scope='session')\n"
        "def pki(tmp_path_factory):\n"
        "    path = tmp_path_factory.mktemp('pki')\n"
        "    (path / 'ca.key').write_text('secret')\n"
        "    return path\n\n"
        "def test_passes(tmp_path, pki):\n    (tmp_path / 'data').write_text('x' * 1000)\n\n"
        "def test_fails(tmp_path):\n    (tmp_path / 'data').write_text('x')\n"
        "    assert False\n")
    temp = tmp_path / "temp"
    temp.mkdir()
    env = {**os.environ, "TMPDIR": str(temp), "PYTEST_DEBUG_TEMPROOT": str(temp),
           "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
         "tests.support.tmp_retention", "-c", str(ROOT / "pyproject.toml"), "--rootdir",
         str(tmp_path), str(tmp_path / "test_scratch.py")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert "1 failed, 1 passed" in done.stdout, done.stdout
    kept = sorted(p.name for p in temp.glob("pytest-of-*/pytest-[0-9]*/*")
                  if p.is_dir() and not p.is_symlink())
    assert kept == ["test_fails0"], kept


@pytest.mark.slow
def test_the_tests_that_run_chromium_and_checkov_leave_nothing_in_home_or_tmp() -> None:
    """They wrote ``~/.config/chromium/Crash Reports``, ``~/.cache/checkov`` and a lark
    cache in /tmp (issue 27): run here with a HOME and a TMPDIR of their own, which must
    stay empty but for pytest's own folder (tests/support/processes.py ``own_home``). A
    short TMPDIR: chromium's socket path in it has a length limit."""
    with tempfile.TemporaryDirectory(prefix="lp-") as scratch:
        home, temp = Path(scratch) / "h", Path(scratch) / "t"
        home.mkdir()
        temp.mkdir()
        env = {k: v for k, v in os.environ.items() if not k.startswith("XDG_")}
        env.update({"HOME": str(home), "TMPDIR": str(temp)})
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
             "tests/http/test_status_page.py",
             "tests/system/test_lock.py::test_checkov_runs_beside_the_overridden_packaging"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout[-3000:]
        assert "2 passed" in done.stdout, done.stdout[-3000:]
        assert sorted(str(p.relative_to(home)) for p in home.rglob("*")) == []
        assert [p.name for p in temp.iterdir() if not p.name.startswith("pytest-of-")] == []
