"""Progress of long work: a live bar on a terminal, plain lines anywhere else.

tqdm redraws its bar with carriage returns, which a terminal shows as one moving line and a pipe or a log
file keeps as one line of hundreds of overwritten bars. :func:`bar` gives tqdm when its stream is a
terminal and otherwise :class:`Lines`: one line ``desc: n/total (what now), s`` at most every ``every``
seconds and one at the end, so a log still shows that the work moves and how far it got.
"""

from __future__ import annotations

import sys
import time


class Lines:
    """tqdm's ``update`` / ``set_postfix_str`` / ``close`` / iteration, written as plain throttled lines."""

    def __init__(self, iterable=None, *, total=None, desc: str = "", file=None, every: float = 10.0):
        self.iterable = iterable
        self.total = total if total is not None else (len(iterable) if hasattr(iterable, "__len__") else None)
        self.desc, self.file, self.every = desc, file, every
        self.n, self.postfix = 0, ""
        self.start = self.last = time.perf_counter()
        self.closed = False

    def _line(self, end: str = "") -> None:
        of = f"/{self.total}" if self.total is not None else ""
        what = f" ({self.postfix})" if self.postfix and not end else ""
        print(f"{self.desc}: {self.n}{of}{what}, {time.perf_counter() - self.start:.0f} s{end}", file=self.file,
              flush=True)
        self.last = time.perf_counter()

    def update(self, n: int = 1) -> None:
        self.n += n
        if time.perf_counter() - self.last >= self.every:
            self._line()

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        self.postfix = s

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._line(", done")

    def __iter__(self):
        for x in self.iterable:
            yield x
            self.update(1)
        self.close()  # as tqdm: a bar iterated to the end is closed

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _is_terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def bar(iterable=None, *, total=None, desc: str = "", disable: bool = False, file=None, every: float = 10.0, **tqdm_kw):
    """A progress bar on ``file`` (default ``sys.stderr`` at the call): tqdm on a terminal (``tqdm_kw`` passed
    on), :class:`Lines` elsewhere, tqdm's silent bar when ``disable``."""
    from tqdm import tqdm

    file = sys.stderr if file is None else file
    if disable:
        return tqdm(iterable, total=total, disable=True)
    if _is_terminal(file):
        return tqdm(iterable, total=total, desc=desc, file=file, **tqdm_kw)
    return Lines(iterable, total=total, desc=desc, file=file, every=every)


__all__ = ["Lines", "bar"]
