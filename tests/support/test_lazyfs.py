"""The power-loss file system (tests/support/lazyfs.py): what survives drop_unsynced, and that no
mount outlives its owner.

The model (see the module docstring): file data and sizes are durable once fsynced;
namespace operations (create, rename, unlink, mkdir) are durable at once.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import services
from tests.support.lazyfs import FileState, LazyFS, is_mounted


@pytest.fixture
def fs(tmp_path: Path) -> Iterator[LazyFS]:
    services.require_fuse()
    with LazyFS(tmp_path / "disk", tmp_path / "mnt") as mounted:
        yield mounted


def write(path: Path, data: bytes, *, sync: bool, append: bool = False,
          datasync: bool = False) -> None:
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
    fd = os.open(path, flags, 0o644)
    try:
        assert os.write(fd, data) == len(data)
        if sync:
            (os.fdatasync if datasync else os.fsync)(fd)
    finally:
        os.close(fd)


def test_an_fsynced_write_survives_a_power_loss(fs: LazyFS) -> None:
    f = fs.mountpoint / "aof"
    write(f, b"SET a 1\n", sync=True)
    write(f, b"SET b 2\n", sync=True, append=True, datasync=True)
    assert (fs.backing / "aof").read_bytes() == b"SET a 1\nSET b 2\n"  # on the "disk"
    assert fs.unsynced() == []
    assert fs.drop_unsynced() == []
    assert f.read_bytes() == b"SET a 1\nSET b 2\n"


def test_a_write_not_fsynced_is_read_back_then_lost(fs: LazyFS) -> None:
    f = fs.mountpoint / "aof"
    write(f, b"durable\n", sync=True)
    write(f, b"cached\n", sync=False, append=True)
    assert f.read_bytes() == b"durable\ncached\n"  # reads see the cache
    assert f.stat().st_size == 15
    assert (fs.backing / "aof").read_bytes() == b"durable\n"  # the disk does not
    assert fs.unsynced() == [FileState("/aof", size=15, durable_size=8, dirty_pages=1)]

    lost = fs.drop_unsynced()

    assert lost == [FileState("/aof", size=15, durable_size=8, dirty_pages=1)]
    assert f.read_bytes() == b"durable\n"
    assert f.stat().st_size == 8
    assert fs.unsynced() == []


def test_close_does_not_sync_and_a_new_file_never_fsynced_comes_back_empty(
    fs: LazyFS,
) -> None:
    f = fs.mountpoint / "temp-1.rdb"
    write(f, b"x" * 10_000, sync=False)  # written and closed, never fsynced
    assert f.read_bytes() == b"x" * 10_000
    fs.drop_unsynced()
    assert f.exists()  # the create is durable (namespace), its data is not
    assert f.read_bytes() == b""


def test_an_fsync_makes_one_file_durable_not_the_others(fs: LazyFS) -> None:
    a, b = fs.mountpoint / "a", fs.mountpoint / "b"
    write(a, b"A" * 5000, sync=False)
    write(b, b"B" * 5000, sync=True)
    assert [s.path for s in fs.drop_unsynced()] == ["/a"]
    assert (a.read_bytes(), b.read_bytes()) == (b"", b"B" * 5000)


def test_truncation_is_data_it_waits_for_the_fsync_like_any_write(fs: LazyFS) -> None:
    f = fs.mountpoint / "aof"
    original = bytes(range(256)) * 40  # 10,240 bytes, 3 pages
    write(f, original, sync=True)
    fd = os.open(f, os.O_RDWR)
    try:
        os.ftruncate(fd, 100)
        os.pwrite(fd, b"tail", 6000)  # regrow past the cut: the gap reads as zeros
        expected = original[:100] + bytes(5900) + b"tail"
        assert f.read_bytes() == expected
        assert fs.drop_unsynced()[0].durable_size == len(original)
        assert f.read_bytes() == original  # the cut was not fsynced: undone

        os.ftruncate(fd, 100)
        os.pwrite(fd, b"tail", 6000)
        os.fsync(fd)
    finally:
        os.close(fd)
    assert fs.drop_unsynced() == []
    assert f.read_bytes() == expected
    assert (fs.backing / "aof").read_bytes() == expected


def test_open_with_o_trunc_is_undone_by_a_power_loss_until_fsynced(fs: LazyFS) -> None:
    f = fs.mountpoint / "manifest"
    write(f, b"old manifest\n", sync=True)
    write(f, b"new\n", sync=False)  # O_TRUNC then write, no fsync
    assert f.read_bytes() == b"new\n"
    fs.drop_unsynced()
    assert f.read_bytes() == b"old manifest\n"


def test_a_rename_is_durable_without_a_directory_fsync(fs: LazyFS) -> None:
    """Redis writes its AOF manifest to a temp file, fsyncs it and renames it over the
    old one. Namespace operations are durable at once in this model (a journaling file
    system commits them with the next fsync of anything): the renamed, fsynced file
    survives a power loss without an fsync of the directory."""
    d = fs.mountpoint / "appendonlydir"
    d.mkdir()
    write(d / "m", b"manifest v1\n", sync=True)
    write(d / "temp-m", b"manifest v2\n", sync=True)
    os.rename(d / "temp-m", d / "m")
    assert fs.drop_unsynced() == []
    assert sorted(os.listdir(d)) == ["m"]
    assert (d / "m").read_bytes() == b"manifest v2\n"


def test_a_rename_of_a_file_never_fsynced_leaves_an_empty_file(fs: LazyFS) -> None:
    """The zero-length-file hazard: the rename is durable, the data it points at is not."""
    write(fs.mountpoint / "m", b"manifest v1\n", sync=True)
    write(fs.mountpoint / "temp-m", b"manifest v2\n", sync=False)
    os.rename(fs.mountpoint / "temp-m", fs.mountpoint / "m")
    assert (fs.mountpoint / "m").read_bytes() == b"manifest v2\n"
    assert [s.path for s in fs.drop_unsynced()] == ["/m"]  # the cache followed the rename
    assert (fs.mountpoint / "m").read_bytes() == b""
    assert not (fs.mountpoint / "temp-m").exists()


def test_an_unlinked_file_stays_readable_while_open_and_loses_nothing_else(
    fs: LazyFS,
) -> None:
    f = fs.mountpoint / "old.incr.aof"
    write(f, b"gone soon\n", sync=False)
    fd = os.open(f, os.O_RDONLY)
    try:
        f.unlink()
        assert os.pread(fd, 100, 0) == b"gone soon\n"
    finally:
        os.close(fd)
    write(fs.mountpoint / "kept", b"kept\n", sync=True)
    fs.drop_unsynced()
    assert sorted(os.listdir(fs.mountpoint)) == ["kept"]


def test_stop_unmounts_and_the_disk_keeps_the_durable_state(tmp_path: Path) -> None:
    services.require_fuse()
    fs = LazyFS(tmp_path / "disk", tmp_path / "mnt")
    with fs:
        assert is_mounted(fs.mountpoint)
        write(fs.mountpoint / "a", b"synced", sync=True)
        write(fs.mountpoint / "b", b"unsynced", sync=False)
        child = fs.proc
    assert child is not None and child.returncode is not None
    assert not is_mounted(fs.mountpoint)
    assert (tmp_path / "disk" / "a").read_bytes() == b"synced"
    assert (tmp_path / "disk" / "b").read_bytes() == b""  # never fsynced: never on disk
    fs.stop()  # a second stop is harmless


def test_stop_unmounts_even_with_a_file_held_open(tmp_path: Path) -> None:
    services.require_fuse()
    fs = LazyFS(tmp_path / "disk", tmp_path / "mnt")
    fs.start()
    fd = os.open(fs.mountpoint / "held", os.O_CREAT | os.O_WRONLY, 0o644)
    try:
        fs.stop()  # a plain unmount is refused (busy): stop detaches it and ends the loop
        assert not is_mounted(fs.mountpoint)
        assert fs.proc is None
        with pytest.raises(OSError) as gone:  # the "device" is gone for its holder
            os.write(fd, b"x")
        assert gone.value.errno == errno.ENOTCONN
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)


def test_a_killed_file_system_process_leaves_no_mount(tmp_path: Path) -> None:
    services.require_fuse()
    fs = LazyFS(tmp_path / "disk", tmp_path / "mnt")
    fs.start()
    try:
        assert fs.proc is not None
        os.kill(fs.proc.pid, signal.SIGKILL)
        fs.proc.wait(timeout=10)
        # fusermount3 (auto_unmount) unmounts once the FUSE connection closes
        services.wait_until(lambda: not is_mounted(fs.mountpoint), 10, "auto unmount")
    finally:
        fs.stop()


def test_a_killed_owner_leaves_no_mount(tmp_path: Path) -> None:
    """The test process itself dies (SIGKILL): its file system child is told (parent-death
    signal), unmounts and exits."""
    services.require_fuse()
    mnt = tmp_path / "mnt"
    owner = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time\n"
         "from tests.support.lazyfs import LazyFS\n"
         f"LazyFS({str(tmp_path / 'disk')!r}, {str(mnt)!r}).start()\n"
         "print('mounted', flush=True)\n"
         "time.sleep(60)\n"],
        cwd=services.ROOT, stdout=subprocess.PIPE, start_new_session=True,
    )
    try:
        assert owner.stdout is not None
        assert owner.stdout.readline() == b"mounted\n"
        assert is_mounted(mnt)
        owner.kill()
        owner.wait(timeout=10)
        services.wait_until(lambda: not is_mounted(mnt), 10, "unmount after owner death")
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait(timeout=10)
        if is_mounted(mnt):
            subprocess.run(["fusermount3", "-u", "-z", str(mnt)], timeout=10, check=False)
