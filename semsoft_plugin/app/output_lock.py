"""One writer per output file: `semsoft classify --output OUT` holds a lock beside it,
`OUT.semsoft.lock`, from before anything is read until the last row is written.

Two runs writing one file interleave their rows (rows of two widths when their labels
differ, rows twice when a `--resume` runs beside the first run), and both say they
succeeded. The lock is an `flock` on the lock file, which the kernel releases when its
holder dies in any way (`SIGKILL` included), so a lock file a killed run left behind
does not block the next run or its `--resume`. The file also names its holder (pid,
host, start time) for the refusal; a lock still held although the pid it names is dead
(a child process of a killed run that inherited it) is stale as well, and replaced.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

__all__ = ["OutputLock", "lock_path"]


def lock_path(output: str | Path) -> Path:
    """The lock of an output file: `OUTPUT.semsoft.lock` beside it."""
    output = Path(output)
    return output.with_name(output.name + ".semsoft.lock")


class OutputLock:
    """The lock of `output` as a context manager: `ValueError` naming the run that
    holds it, or the folder, when it cannot be taken.

    Creating the lock file is also the check that the output's folder takes new files:
    a folder that `os.access` calls writable but is not (`/proc`, a read-only mount
    seen by root) is refused here, before a model is loaded.
    """

    def __init__(self, output: str | Path) -> None:
        self.output = Path(output)
        self.path = lock_path(self.output)
        self._fd: int | None = None

    def __enter__(self) -> OutputLock:
        self.acquire()
        return self

    def __exit__(self, *_: object) -> None:
        self.release()

    def acquire(self) -> None:
        """Take the lock (refused at once, never waited for)."""
        import fcntl

        for _ in range(10):  # another run may replace the file between open and lock
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as error:
                raise ValueError(
                    f"--output {self.output}: cannot create a file in {self.path.parent} "
                    f"({error.strerror})"
                ) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _holder(fd)
                if not _stale(holder) or not self._same_file(fd):
                    os.close(fd)
                    raise ValueError(
                        f"--output {self.output} is being written by another semsoft run "
                        f"({holder or 'holder unknown'}; lock {self.path.name}): wait for it "
                        "to finish, or write to another --output"
                    ) from None
                os.unlink(self.path)  # its holder's pid is dead: a new file, a new lock
                os.close(fd)
                continue
            except OSError as error:  # a file system without flock (ENOLCK)
                os.close(fd)
                print(
                    f"semsoft classify: warning: cannot lock {self.path} ({error.strerror}): "
                    "a second run on the same --output would not be refused",
                    file=sys.stderr,
                )
                return
            if self._same_file(fd):
                break
            os.close(fd)  # removed by its last holder after we opened it: try again
        else:
            raise ValueError(f"--output {self.output}: the lock {self.path} keeps changing")
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()} since {stamp}\n".encode())
        self._fd = fd

    def _same_file(self, fd: int) -> bool:
        try:
            now, held = os.stat(self.path), os.fstat(fd)
        except FileNotFoundError:
            return False
        return (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino)

    def release(self) -> None:
        """Remove the lock file and let go of the lock (the file first, so that a run
        waiting on this very file finds it replaced and locks a new one)."""
        if self._fd is None:
            return
        if self._same_file(self._fd):
            self.path.unlink(missing_ok=True)
        os.close(self._fd)
        self._fd = None


def _holder(fd: int) -> str:
    """The holder line a lock file holds (`pid N on HOST since TIME`), or `""`."""
    try:
        return os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
    except OSError:
        return ""


def _stale(holder: str) -> bool:
    """Whether the holder line names a process of this host that no longer runs."""
    parts = holder.split()
    if len(parts) < 4 or parts[0] != "pid" or not parts[1].isdigit():
        return False
    if parts[3] != socket.gethostname():
        return False  # another machine's pid cannot be checked from here
    try:
        os.kill(int(parts[1]), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # alive, another user's
    return False
