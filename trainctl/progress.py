"""What trainctl is waiting for, and output streamed from pods.

One rule in every command: progress lines go to stderr as `trainctl: MESSAGE` (stdout stays for results,
so `--json` does not change them), whether or not stderr is a terminal, and `--quiet` (trainctl/flags.py)
turns them off; errors are printed either way. `for_args` makes the reporter a command uses."""

from __future__ import annotations

import codecs
import contextlib
import sys
import time
from collections.abc import Iterator
from typing import Any, TextIO

SLOW_STEP_S = 1.0
"""Steps that take longer than this also say when they are done."""


def duration(seconds: float) -> str:
    """1.2s, 42s, 3m05s, 2h07m."""
    if seconds < 10:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


class Progress:
    def __init__(self, stream: TextIO | None = None, *, quiet: bool = False) -> None:
        self._stream = stream
        self.quiet = quiet

    @classmethod
    def for_args(cls, args: Any, stream: TextIO | None = None) -> Progress:
        """The reporter of a command whose parser has trainctl.flags.add_output (--quiet)."""
        return cls(stream, quiet=bool(getattr(args, "quiet", False)))

    @property
    def stream(self) -> TextIO:
        return self._stream if self._stream is not None else sys.stderr

    def say(self, message: str) -> None:
        if self.quiet:
            return
        self.stream.write(f"trainctl: {message}\n")
        self.stream.flush()

    @contextlib.contextmanager
    def step(self, message: str) -> Iterator[None]:
        """'trainctl: MESSAGE ...' now, and 'MESSAGE: done in 3.4s' after, when it was slow."""
        self.say(f"{message} ...")
        started = time.monotonic()
        yield
        elapsed = time.monotonic() - started
        if elapsed >= SLOW_STEP_S:
            self.say(f"{message}: done in {duration(elapsed)}")

    def idle(self, what: str) -> IdleReport:
        return IdleReport(self, what)


class IdleReport:
    """An exec_in_pod on_idle callback: 'still waiting for WHAT (12m03s; no output for 1m00s)'."""

    def __init__(self, progress: Progress, what: str) -> None:
        self.progress = progress
        self.what = what

    def __call__(self, elapsed: float, silent: float) -> None:
        self.progress.say(f"still waiting for {self.what} ({duration(elapsed)}; no output for {duration(silent)})")


class TextSink:
    """Bytes from a pod, decoded as UTF-8 across chunk boundaries and written as they arrive.

    Keeps the last `keep` characters, to quote when a command fails."""

    def __init__(self, stream: TextIO | None = None, *, keep: int = 4000, discard: bool = False) -> None:
        self._stream = stream
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._keep = keep
        self._discard = discard
        self.tail = ""

    def __call__(self, data: bytes) -> None:
        self._write(self._decoder.decode(data))

    def finish(self) -> None:
        self._write(self._decoder.decode(b"", final=True))

    def last_line(self) -> str:
        lines = self.tail.strip().splitlines()
        return lines[-1] if lines else ""

    def _write(self, text: str) -> None:
        if not text:
            return
        self.tail = (self.tail + text)[-self._keep :]
        if self._discard:
            return
        stream = self._stream if self._stream is not None else sys.stdout
        stream.write(text)
        stream.flush()
