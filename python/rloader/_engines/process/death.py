"""A worker process that ended before its time: noticing it, and the error that says so.

torch learns of a dead worker from its SIGCHLD handler and words the error there
(``torch.utils.data._utils.signal_handling``); rloader's pool asks each process whether it has
ended (``_Pool.exited`` in ``pool``, called by the Rust iterator while it waits) and
raises ``worker_death``'s error, in torch's words. This module also keeps SIGCHLD from hiding a
death: ignored, the kernel reaps the workers itself and their exit status is lost
(``no_autoreaping``, ``ended_unseen``).
"""

from __future__ import annotations

import multiprocessing.connection
import signal
import threading

__all__ = ["STATUS_LOST", "ended_unseen", "no_autoreaping", "worker_death"]


# The exit code given for a worker whose exit status was taken by someone else.
STATUS_LOST = -(2**31)


def ended_unseen(proc) -> bool:
    """The worker process has ended, but its exit status is gone: with SIGCHLD ignored the
    kernel reaps children itself (or another part of the program reaped it), so
    multiprocessing, whose ``waitpid`` fails, reports it running forever. Its sentinel, a pipe
    the child held open, says it has ended."""
    if proc.exitcode is not None:
        return False
    try:
        return bool(multiprocessing.connection.wait([proc.sentinel], 0))
    except (OSError, ValueError):
        return False


def no_autoreaping() -> None:
    """Gives SIGCHLD its default action back if it is ignored, as torch's iterators do (they
    install their SIGCHLD handler over it): ignored, the kernel reaps the workers and their
    exit status, which the error for a dead worker reports, is lost. Only the main thread can
    set a handler; elsewhere the status stays lost and ``ended_unseen`` notices the exit."""
    if threading.current_thread() is not threading.main_thread():
        return
    try:
        if signal.getsignal(signal.SIGCHLD) == signal.SIG_IGN:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    except (ValueError, OSError, AttributeError):  # no SIGCHLD here, or not settable
        pass


def _torch_exit_text(pid: int, code: int) -> str:
    """What torch's SIGCHLD handler says of a worker that ended with ``code`` (a negative code:
    killed by that signal), or "" for code 0, of which torch says nothing more."""
    if code == STATUS_LOST:
        return (
            f"DataLoader worker (pid {pid}) exited unexpectedly; how it ended is lost: its "
            "exit status was taken elsewhere in this process (SIGCHLD is ignored and the "
            "loader runs outside the main thread, or some code reaps child processes)."
        )
    if code < 0:
        text = f"DataLoader worker (pid {pid}) is killed by signal: {signal.strsignal(-code)}. "
        if -code == signal.SIGBUS:
            text += (
                "It is possible that dataloader's workers are out of shared memory. "
                "Please try to raise your shared memory limit."
            )
        return text
    if code > 0:
        return (
            f"DataLoader worker (pid {pid}) exited unexpectedly with exit code {code}. "
            "Details are lost due to multiprocessing. Rerunning with num_workers=0 may give "
            "better error trace."
        )
    return ""


def worker_death(worker_id: int, pid: int, code: int) -> RuntimeError:
    """The error for a worker that ended before its time, in torch's words: torch's
    ``DataLoader worker (pid(s) N) exited unexpectedly``, caused by the error torch's SIGCHLD
    handler raises for that exit (``... is killed by signal: Segmentation fault. ``), to which
    rloader adds which worker it was and what to try."""
    detail = _torch_exit_text(pid, code)
    hint = (
        f"(rloader: that was worker {worker_id}. If it was killed for memory, use fewer workers "
        "or a smaller batch_size/prefetch_factor; a crash points at the dataset's or "
        "collate_fn's code.)"
    )
    if not detail:
        detail = f"DataLoader worker (pid {pid}) exited with code 0 before it answered."
    error = RuntimeError(f"DataLoader worker (pid(s) {pid}) exited unexpectedly")
    error.__cause__ = RuntimeError(f"{detail} {hint}")
    return error
