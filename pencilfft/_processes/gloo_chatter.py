"""gloo's connection messages, kept off a process's standard output.

gloo (jax's CPU collectives across processes) writes "[Gloo] Rank 1 is connected to 3 peer
ranks. Expected number of connected peer ranks is : 3" to standard output with std::cout,
unconditionally (no log level), once per process and communicator: tens of lines per run.
They can only be dropped below Python: standard output (fd 1) becomes a pipe that a thread
copies to the real one, line by line, leaving these out (`hide_gloo_chatter`, from
`initialize` unless verbose).  Whatever ends the job at once (`ending`) first stops the copy
(`stop_stdout_filter`), so that nothing written before is lost.
"""
from __future__ import annotations

import atexit
import os
import re
import sys
import threading

import jax

__all__ = ["LineFilter", "hide_gloo_chatter", "stop_stdout_filter"]


# Each process writes one such line per communicator, from several threads (one per local
# device) at once, and std::cout does not write a line in one piece: lines of two threads
# interleave at the pieces of the message ("...is : 3[Gloo] Rank " then "1 is connected..."),
# across newlines too (one thread's newline lands inside another's message).  So lines made of
# nothing but those pieces and numbers are gathered into a run, and the run is decided once it
# holds whole messages (as many of each piece): dropped when every message reports its
# expected peers (a message with a missing peer is a real problem: the run is kept), and also
# when the pieces are so interleaved that no number can be told from the next (a peer that
# cannot connect also fails jax's collectives, loudly).  A line of anything else ends the run,
# which is then kept as it was.
_GLOO_TEXTS = (b"[Gloo] Rank ", b" is connected to ", b" peer ranks. ",
               b"Expected number of connected peer ranks is : ")
_GLOO_PIECES = re.compile(b"(?:" + b"|".join(map(re.escape, _GLOO_TEXTS)) + rb"|\d+)+")
_GLOO_MESSAGE = re.compile(rb"\[Gloo\] Rank \d+ is connected to (\d+) peer ranks\. "
                           rb"Expected number of connected peer ranks is : (\d+)")


def _is_gloo_piece_line(line: bytes) -> bool:
    """Whether a line holds nothing but pieces of gloo's connection messages (and numbers)."""
    line = line.removesuffix(b"\r")
    return (_GLOO_PIECES.fullmatch(line) is not None
            and any(t in line for t in _GLOO_TEXTS))


def _gloo_run_verdict(run: bytes) -> bool | None:
    """For the lines of a run joined: None while it does not hold whole messages yet, True to
    drop it (chatter), False to keep it (a peer missing)."""
    counts = {run.count(t) for t in _GLOO_TEXTS}
    if len(counts) != 1 or counts == {0}:
        return None
    messages = _GLOO_MESSAGE.findall(run)
    if len(messages) < counts.pop():  # interleaved past telling the numbers apart
        return True
    return all(connected == expected for connected, expected in messages)


def _may_become_chatter(partial: bytes) -> bool:
    """Whether a line still without its newline may turn out to be gloo's chatter."""
    run = _GLOO_PIECES.match(partial)
    rest = partial[run.end():] if run else partial
    return any(t.startswith(rest) for t in _GLOO_TEXTS)


class LineFilter:
    """Copy what is written to `fd` to where `fd` pointed before, without gloo's chatter."""

    def __init__(self, fd: int = 1) -> None:
        self.fd = fd
        self.real = os.dup(fd)
        read_fd, write_fd = os.pipe()
        os.dup2(write_fd, fd)
        os.close(write_fd)
        self.inode = os.fstat(fd).st_ino
        self.read_fd = read_fd
        self.thread = threading.Thread(target=self._pump, name="pencilfft-stdout", daemon=True)
        self.thread.start()

    def _pump(self) -> None:
        pending, run = b"", []  # a partial line; the lines of an undecided run of gloo's
        while True:
            try:
                chunk = os.read(self.read_fd, 1 << 16)
            except OSError:
                break
            if not chunk:
                break
            *lines, pending = (pending + chunk).split(b"\n")
            out = []
            for line in lines:
                if not _is_gloo_piece_line(line):
                    out += [r + b"\n" for r in run] + [line + b"\n"]  # an unfinished run: kept
                    run = []
                    continue
                run.append(line)
                verdict = _gloo_run_verdict(b"".join(run))
                if verdict is not None:
                    out += [] if verdict else [r + b"\n" for r in run]
                    run = []
            # A partial line goes out at once (a progress bar), unless it may become gloo's;
            # one that cannot also ends a run of gloo's lines, kept.
            if pending and not _may_become_chatter(pending):
                out += [r + b"\n" for r in run] + [pending]
                run, pending = [], b""
            self._write(b"".join(out))
        if run or pending:
            rest = b"".join(run) + pending
            if not (_is_gloo_piece_line(rest) and _gloo_run_verdict(rest)):
                self._write(b"".join(r + b"\n" for r in run) + pending)
        os.close(self.read_fd)

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self.real, view):]
            except OSError:
                return  # the reader is gone: nothing to do about it here

    def stop(self, timeout: float = 2.0) -> None:
        """Point `fd` back at the real output and forward what is still in the pipe."""
        try:
            sys.stdout.flush()
        except (OSError, ValueError):
            pass
        try:
            still_ours = os.fstat(self.fd).st_ino == self.inode
        except OSError:
            still_ours = False
        if still_ours:  # someone else (pytest's capture) may have replaced it meanwhile
            os.dup2(self.real, self.fd)  # closes the pipe's last write end: the pump ends
        self.thread.join(timeout)


# The filter of this process's standard output, once started (at most one).
_FILTER: list[LineFilter] = []


def hide_gloo_chatter() -> None:
    """Drop gloo's connection lines from fd 1 (once), if CPU collectives go through gloo."""
    try:
        gloo = jax.config.jax_cpu_collectives_implementation == "gloo"
    except AttributeError:
        gloo = False
    if _FILTER or not gloo:
        return
    try:
        _FILTER.append(LineFilter(1))
    except OSError:
        return  # no standard output to filter
    atexit.register(stop_stdout_filter)


def stop_stdout_filter() -> None:
    """Give standard output back and forward what the filter still holds (at exit, and before
    the job is ended at once)."""
    while _FILTER:
        _FILTER.pop().stop()
