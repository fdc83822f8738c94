"""Child processes that cannot outlive their parent.

On Linux a child can ask the kernel for a signal when its parent dies
(``prctl(PR_SET_PDEATHSIG)``), whatever killed the parent, SIGKILL included. The signal
fires when the *thread* that forked the child ends, not the process: fork from the main
thread (:func:`die_with_parent` refuses any other). The setting survives ``exec`` and is
cleared in the child's own children, which need their own (Celery's prefork pool sets
SIGKILL in each pool process).

Elsewhere (no ``prctl``) :func:`die_with_parent` returns None and only an orderly stop
reaches the children.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
import threading
from collections.abc import Callable

PR_SET_PDEATHSIG = 1


def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        return libc.prctl  # type: ignore[no-any-return]
    except (OSError, AttributeError):
        return None


_PRCTL = _prctl()  # loaded here, in the parent: a forked child only calls it


def die_with_parent(sig: int = signal.SIGKILL) -> Callable[[], None] | None:
    """A ``preexec_fn`` for :class:`subprocess.Popen`: the child receives ``sig`` when this
    process dies. None where the kernel offers no such signal, or when called off the
    main thread (the signal would fire when that thread ends)."""
    prctl = _PRCTL
    if prctl is None or threading.current_thread() is not threading.main_thread():
        return None
    parent = os.getpid()

    def preexec() -> None:
        if prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0:
            os._exit(126)  # the child must not start without its lifeline
        if os.getppid() != parent:  # the parent died before prctl: nothing will signal us
            os.kill(os.getpid(), sig)
            os._exit(126)

    return preexec
