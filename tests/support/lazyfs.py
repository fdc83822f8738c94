"""LazyFS for the tests: a FUSE file system that loses what was not fsynced, on command.

In the style of Jepsen's LazyFS: a passthrough file system over a backing directory that
keeps every file's written data in memory (a page cache of its own) until the file is
fsynced, and on :meth:`LazyFS.drop_unsynced` throws that cache away, as a power loss does.
A process crash (SIGKILL) loses nothing on a real machine, because the kernel keeps what
the process wrote; a power loss loses everything not yet on the disk. This module makes
the second one reproducible on loopback, so a test can show which Redis configurations
keep an acknowledged pop through it.

What is modelled (the page cache only, as LazyFS does):

* File **data and size** (``write``, ``truncate``/``ftruncate``, ``O_TRUNC``) stay in the
  cache until ``fsync`` or ``fdatasync`` of that file (through any of its descriptors);
  ``close`` does not sync. Reads see the cache. After a drop, each file's content is its
  content at its last fsync; a file created and never fsynced is empty.
* **Namespace operations** (create, mkdir, rename, unlink, rmdir, symlink, chmod, utimens)
  go to the backing directory at once and survive a drop, as on a journaling file system
  where they reach the disk with the next journal commit, which any later fsync forces
  (ext4's default). So a rename is durable without an fsync of the directory; ``fsyncdir``
  is accepted and changes nothing. An application that renames a file it never fsynced
  gets, after a drop, the new name with the old (empty or shorter) content: the classic
  zero-length-file hazard, which this model does reproduce.
* The backing directory stands for the disk: it is not lost, and not fsynced itself.

The file system runs in a child process (``python tests/support/lazyfs.py BACKING MOUNT ...``)
controlled over a pair of pipes; the child dies with its parent (SIGTERM, on which libfuse
unmounts) and mounts with ``auto_unmount``, so no mount outlives a test run even when the
child is SIGKILLed. Use :class:`LazyFS` as a context manager.

This module does not import pytest: benchmarks may use it too. A missing FUSE device,
``fusermount3`` or the ``mfusepy`` binding raises :class:`FuseMissing`.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

PAGE = 4096


class FuseMissing(RuntimeError):
    """FUSE cannot be used here; the message says what is missing."""


def fuse_missing() -> str | None:
    """Why FUSE cannot be used here (None when it can): the device, fusermount3 (Debian's
    ``fuse3``), libfuse (``libfuse3-3``) or the ``mfusepy`` binding (the ``test`` extra)."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse does not exist (no FUSE in this kernel or container)"
    if shutil.which("fusermount3") is None:
        return "fusermount3 is not installed (Debian package fuse3; `./dev test` installs it)"
    try:
        import mfusepy  # type: ignore[import-untyped]  # noqa: F401
    except ImportError as exc:
        return f"the FUSE binding mfusepy is missing ({exc}; the `test` extra installs it)"
    except OSError as exc:  # mfusepy raises OSError when it finds no libfuse
        return f"libfuse is missing ({exc}; Debian package libfuse3-3)"
    return None


@dataclass(frozen=True)
class FileState:
    """One file with data not yet fsynced: ``size`` is what reads see now,
    ``durable_size`` what it would have after a power loss."""

    path: str
    size: int
    durable_size: int
    dirty_pages: int


# -- the cache ---------------------------------------------------------------------------

class _File:
    """One inode's cached state over its backing file (opened read-write: we are root,
    or the file is ours).

    The backing file always holds the content as of the last sync. ``dirty`` holds the
    pages written since; ``low`` is the lowest size the file had since the last sync: the
    backing bytes at or past it are stale and read as zeros unless a dirty page covers
    them (a truncation followed by a regrowth)."""

    def __init__(self, path: str | None, fd: int) -> None:
        self.path = path
        self.fd = fd
        self.opens = 0
        self.durable = os.fstat(fd).st_size
        self.size = self.durable
        self.low = self.durable
        self.dirty: dict[int, bytearray] = {}

    def unsynced(self) -> bool:
        return bool(self.dirty) or self.size != self.durable or self.low < self.durable

    def state(self) -> FileState:
        return FileState(self.path or "(unlinked)", self.size, self.durable, len(self.dirty))

    def _page(self, no: int) -> bytearray:
        page = self.dirty.get(no)
        if page is not None:
            return page
        start = no * PAGE
        buf = bytearray(PAGE)
        if start < self.low:
            data = os.pread(self.fd, min(PAGE, self.low - start), start)
            buf[: len(data)] = data
        return buf

    def read(self, offset: int, size: int) -> bytes:
        end = min(offset + size, self.size)
        out = bytearray()
        pos = offset
        while pos < end:
            no, at = divmod(pos, PAGE)
            take = min(PAGE - at, end - pos)
            out += self._page(no)[at: at + take]
            pos += take
        return bytes(out)

    def write(self, offset: int, data: bytes) -> None:
        pos, view = offset, memoryview(data)
        while view:
            no, at = divmod(pos, PAGE)
            take = min(PAGE - at, len(view))
            page = self.dirty.get(no)
            if page is None:
                page = self.dirty[no] = self._page(no)
            page[at: at + take] = view[:take]
            view, pos = view[take:], pos + take
        self.size = max(self.size, offset + len(data))

    def truncate(self, length: int) -> None:
        if length < self.size:
            for no in [n for n in self.dirty if n * PAGE >= length]:
                del self.dirty[no]
            no, at = divmod(length, PAGE)
            if at:  # the page holding the new end keeps its head only
                page = self.dirty.get(no)
                if page is None:
                    page = self.dirty[no] = self._page(no)
                page[at:] = bytes(PAGE - at)
            self.low = min(self.low, length)
        self.size = length

    def sync(self) -> None:
        if not self.unsynced():
            return
        if self.low < self.durable:
            os.ftruncate(self.fd, self.low)
        for no in sorted(self.dirty):
            os.pwrite(self.fd, self.dirty[no], no * PAGE)
        os.ftruncate(self.fd, self.size)
        self.dirty.clear()
        self.durable = self.low = self.size

    def drop(self) -> None:
        self.dirty.clear()
        self.size = self.low = self.durable


class LazyOperations:
    """The mfusepy operations: a passthrough over ``backing`` with :class:`_File` caches."""

    use_ns = True

    def __init__(self, backing: str) -> None:
        self.backing = os.path.realpath(backing)
        self.mutex = threading.RLock()
        self.files: dict[str, _File] = {}  # path -> cached inode, while open or unsynced
        self.handles: dict[int, tuple[_File, bool]] = {}  # fh -> (inode, O_APPEND)
        self.next_fh = 1
        self.fsyncs = 0
        self.drops = 0

    def _real(self, path: str) -> str:
        return os.path.join(self.backing, path.lstrip("/"))

    # -- control (the child's pipe) --------------------------------------------------

    def status(self) -> list[FileState]:
        with self.mutex:
            live = [f for f in self.files.values() if f.unsynced()]
            live += [f for f, _ in self.handles.values() if f.path is None and f.unsynced()]
            return sorted((f.state() for f in live), key=lambda s: s.path)

    def drop_unsynced(self) -> list[FileState]:
        """The power loss: every file's content goes back to its last fsync. Returns what
        was lost (the files that had unsynced data), taken atomically with the drop."""
        with self.mutex:
            lost = self.status()
            for path, f in list(self.files.items()):
                f.drop()
                if f.opens == 0:
                    self._forget(path, f)
            for f, _ in self.handles.values():
                f.drop()
            self.drops += 1
            return lost

    # -- bookkeeping -------------------------------------------------------------------

    def _forget(self, path: str | None, f: _File) -> None:
        if path is not None and self.files.get(path) is f:
            del self.files[path]
        os.close(f.fd)

    def _file(self, path: str) -> _File:
        f = self.files.get(path)
        if f is None:
            f = self.files[path] = _File(path, os.open(self._real(path), os.O_RDWR))
        return f

    def _open(self, path: str, flags: int) -> int:
        f = self._file(path)
        f.opens += 1
        if flags & os.O_TRUNC:
            f.truncate(0)
        fh, self.next_fh = self.next_fh, self.next_fh + 1
        self.handles[fh] = (f, bool(flags & os.O_APPEND))
        return fh

    # -- files -------------------------------------------------------------------------

    def create(self, path: str, mode: int, flags: int = os.O_RDWR) -> int:
        with self.mutex:
            os.close(os.open(self._real(path), os.O_CREAT | os.O_RDWR | (flags & os.O_EXCL), mode))
            return self._open(path, flags)

    def open(self, path: str, flags: int) -> int:
        with self.mutex:
            return self._open(path, flags)

    def read(self, path: str | None, size: int, offset: int, fh: int) -> bytes:
        with self.mutex:
            return self.handles[fh][0].read(offset, size)

    def write(self, path: str | None, data: bytes, offset: int, fh: int) -> int:
        with self.mutex:
            f, append = self.handles[fh]
            f.write(f.size if append else offset, data)
            return len(data)

    def truncate(self, path: str | None, length: int, fh: int | None = None) -> int:
        with self.mutex:
            if fh is not None:
                f = self.handles[fh][0]
            elif path is not None:
                f = self._file(path)
            else:
                raise OSError(errno.EBADF, "truncate without a path or a file")
            f.truncate(length)
            if f.opens == 0 and not f.unsynced():
                self._forget(f.path, f)
            return 0

    def fsync(self, path: str | None, datasync: int, fh: int) -> int:
        with self.mutex:
            self.handles[fh][0].sync()
            self.fsyncs += 1
            return 0

    def fsyncdir(self, path: str | None, datasync: int, fh: int) -> int:
        return 0  # namespace operations are durable at once (see the module docstring)

    def flush(self, path: str | None, fh: int) -> int:
        return 0  # close(2) does not sync

    def release(self, path: str | None, fh: int) -> int:
        with self.mutex:
            f, _ = self.handles.pop(fh)
            f.opens -= 1
            if f.opens == 0 and (f.path is None or not f.unsynced()):
                self._forget(f.path, f)
            return 0

    def getattr(self, path: str | None, fh: int | None = None) -> dict[str, Any]:
        with self.mutex:
            f: _File | None = None
            if fh is not None and fh in self.handles:
                f = self.handles[fh][0]
            elif path is not None:
                f = self.files.get(path)
            st = os.fstat(f.fd) if f is not None else os.lstat(self._real(path or "/"))
            attrs = {key: getattr(st, key) for key in (
                "st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_blocks",
                "st_atime_ns", "st_mtime_ns", "st_ctime_ns")}
            for key in ("atime", "mtime", "ctime"):
                attrs[f"st_{key}"] = attrs.pop(f"st_{key}_ns")
            if f is not None:
                attrs["st_size"] = f.size
                attrs["st_blocks"] = (f.size + 511) // 512
            return attrs

    # -- the namespace: straight to the backing directory -----------------------------

    def access(self, path: str, amode: int) -> int:
        if not os.access(self._real(path), amode):
            raise OSError(errno.EACCES, "access denied")
        return 0

    def readdir(self, path: str, fh: int) -> list[str]:
        return [".", "..", *os.listdir(self._real(path))]

    def mkdir(self, path: str, mode: int) -> int:
        os.mkdir(self._real(path), mode)
        return 0

    def rmdir(self, path: str) -> int:
        os.rmdir(self._real(path))
        return 0

    def unlink(self, path: str) -> int:
        with self.mutex:
            os.unlink(self._real(path))
            f = self.files.pop(path, None)
            if f is not None:
                f.path = None
                if f.opens == 0:
                    self._forget(None, f)
            return 0

    def rename(self, old: str, new: str) -> int:
        with self.mutex:
            os.rename(self._real(old), self._real(new))
            replaced = self.files.pop(new, None)
            if replaced is not None:
                replaced.path = None
                if replaced.opens == 0:
                    self._forget(None, replaced)
            for path in [p for p in self.files if p == old or p.startswith(old + "/")]:
                f = self.files.pop(path)
                f.path = new + path[len(old):]
                self.files[f.path] = f
            return 0

    def symlink(self, target: str, source: str) -> int:
        os.symlink(source, self._real(target))
        return 0

    def readlink(self, path: str) -> str:
        return os.readlink(self._real(path))

    def chmod(self, path: str, mode: int) -> int:
        os.chmod(self._real(path), mode)
        return 0

    def chown(self, path: str, uid: int, gid: int) -> int:
        os.chown(self._real(path), uid, gid)
        return 0

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        if times is None:
            os.utime(self._real(path))
        else:
            os.utime(self._real(path), ns=times)
        return 0

    def statfs(self, path: str) -> dict[str, int]:
        st = os.statvfs(self._real(path))
        return {key: getattr(st, key) for key in (
            "f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files",
            "f_flag", "f_frsize", "f_namemax")}


# -- the child process ---------------------------------------------------------------------

def _serve_control(ops: LazyOperations, cmd_fd: int, reply_fd: int, mountpoint: str) -> None:
    """Answer the parent's commands (one JSON object a line); on EOF (the parent closed
    the pipe or died) unmount, which ends the FUSE loop."""
    with os.fdopen(cmd_fd, "rb", buffering=0) as cmd, os.fdopen(reply_fd, "wb", 0) as reply:
        for line in iter(cmd.readline, b""):
            op = json.loads(line)["op"]
            if op == "drop":
                answer: dict[str, Any] = {"files": [asdict(s) for s in ops.drop_unsynced()]}
            elif op == "status":
                answer = {"files": [asdict(s) for s in ops.status()], "fsyncs": ops.fsyncs}
            else:
                answer = {"error": f"unknown op {op!r}"}
            reply.write(json.dumps(answer).encode() + b"\n")
    subprocess.run(["fusermount3", "-u", "-z", mountpoint], capture_output=True, timeout=10)


def main(argv: list[str]) -> None:
    backing, mountpoint, cmd_fd, reply_fd = argv[0], argv[1], int(argv[2]), int(argv[3])
    import mfusepy  # type: ignore[import-untyped]

    ops = LazyOperations(backing)
    control = threading.Thread(target=_serve_control, daemon=True,
                               args=(ops, cmd_fd, reply_fd, mountpoint))
    control.start()
    # direct_io and zero timeouts: the kernel caches neither data nor sizes, so a read
    # after a drop sees the dropped state; auto_unmount: fusermount3 unmounts if we die
    mfusepy.FUSE(ops, mountpoint, foreground=True, fsname="lazyfs", subtype="lazyfs",
                 auto_unmount=True, direct_io=True, attr_timeout=0, entry_timeout=0,
                 negative_timeout=0)


# -- the parent's handle -------------------------------------------------------------------

def is_mounted(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a mount point, by the kernel's mount table: a FUSE mount whose
    process died fails every stat with ENOTCONN, which :func:`os.path.ismount` takes for
    "not a mount"."""
    target = os.path.realpath(path)
    with open("/proc/self/mounts", "rb") as mounts:
        for line in mounts:
            point = line.split(b" ")[1].decode(errors="replace")
            if _unescape(point) == target:
                return True
    return False


def _unescape(field: str) -> str:
    """/proc/mounts writes space, tab, newline and backslash as octal escapes."""
    for code in ("040", "011", "012", "134"):
        field = field.replace("\\" + code, chr(int(code, 8)))
    return field


def _unmount(mountpoint: Path, lazy: bool = False) -> bool:
    argv = ["fusermount3", "-u", *(["-z"] if lazy else []), str(mountpoint)]
    try:
        return subprocess.run(argv, capture_output=True, timeout=10).returncode == 0
    except subprocess.TimeoutExpired:
        return False


class LazyFS:
    """A LazyFS mount of ``backing_dir`` at ``mountpoint`` (both made if missing).

    ``with LazyFS(backing, mnt) as fs:`` mounts, and unmounts on the way out whatever
    happened; :meth:`drop_unsynced` is the power loss."""

    def __init__(self, backing_dir: str | os.PathLike[str], mountpoint: str | os.PathLike[str],
                 timeout: float = 10.0, log: str | os.PathLike[str] | None = None) -> None:
        self.backing = Path(backing_dir)
        self.mountpoint = Path(mountpoint)
        self.timeout = timeout
        # the child's output (libfuse's complaints, our tracebacks): beside the backing dir
        self.log = Path(log) if log else self.backing.parent / f"{self.mountpoint.name}.lazyfs.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self._cmd: int | None = None
        self._reply: Any = None
        self._lock = threading.Lock()

    def start(self) -> None:
        reason = fuse_missing()
        if reason is not None:
            raise FuseMissing(reason)
        if is_mounted(self.mountpoint):
            raise RuntimeError(f"{self.mountpoint} is already a mount point")
        self.backing.mkdir(parents=True, exist_ok=True)
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        cmd_r, cmd_w = os.pipe()
        reply_r, reply_w = os.pipe()
        log = open(self.log, "ab")  # noqa: SIM115
        try:
            self.proc = subprocess.Popen(
                [sys.executable, __file__, str(self.backing), str(self.mountpoint),
                 str(cmd_r), str(reply_w)],
                pass_fds=(cmd_r, reply_w), stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=_die_with_parent(),
            )
        finally:
            os.close(cmd_r)
            os.close(reply_w)
            log.close()
        self._cmd = cmd_w
        self._reply = os.fdopen(reply_r, "rb", buffering=0)
        deadline = time.monotonic() + self.timeout
        while not is_mounted(self.mountpoint):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"lazyfs did not mount {self.mountpoint}: "
                                   f"{self.log.read_text(errors='replace')[-2000:]}")
            time.sleep(0.02)

    def _ask(self, op: str) -> dict[str, Any]:
        if self.proc is None or self._cmd is None:
            raise RuntimeError("lazyfs is not running")
        with self._lock:
            os.write(self._cmd, json.dumps({"op": op}).encode() + b"\n")
            line = b""
            deadline = time.monotonic() + self.timeout
            while not line.endswith(b"\n"):
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([self._reply], [], [], left)[0]:
                    raise TimeoutError(f"lazyfs did not answer {op!r} in {self.timeout}s")
                chunk = self._reply.read(4096)
                if not chunk:
                    raise RuntimeError(f"lazyfs exited while answering {op!r}")
                line += chunk
            answer: dict[str, Any] = json.loads(line)
            if "error" in answer:
                raise RuntimeError(f"lazyfs: {answer['error']}")
            return answer

    def drop_unsynced(self) -> list[FileState]:
        """Power loss: drop every byte written and not fsynced; returns the files that
        had such bytes (their size before and their durable size)."""
        return [FileState(**s) for s in self._ask("drop")["files"]]

    def unsynced(self) -> list[FileState]:
        """The files holding data not yet fsynced."""
        return [FileState(**s) for s in self._ask("status")["files"]]

    def fsyncs(self) -> int:
        """How many fsync/fdatasync calls the file system has served."""
        return int(self._ask("status")["fsyncs"])

    def stop(self) -> None:
        """Unmount (lazily if something still holds a file open) and end the child;
        bounded, and safe to call twice."""
        if self.proc is not None:
            if is_mounted(self.mountpoint) and not _unmount(self.mountpoint):
                # busy: detach it, and end the loop (libfuse's SIGTERM handler), which
                # fails what still holds a file there with ENOTCONN
                _unmount(self.mountpoint, lazy=True)
                if self.proc.poll() is None:
                    self.proc.terminate()
            if self._cmd is not None:
                os.close(self._cmd)
                self._cmd = None
            try:
                self.proc.wait(timeout=self.timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=self.timeout)
            self.proc = None
        if self._reply is not None:
            self._reply.close()
            self._reply = None
        if is_mounted(self.mountpoint):  # the child died without unmounting
            _unmount(self.mountpoint, lazy=True)

    def __enter__(self) -> LazyFS:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _die_with_parent() -> Any:
    """SIGTERM when the parent dies: libfuse's handler ends the loop and unmounts."""
    try:
        from leafpool.children import die_with_parent
    except ImportError:
        return None
    return die_with_parent(signal.SIGTERM)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main(sys.argv[1:])
