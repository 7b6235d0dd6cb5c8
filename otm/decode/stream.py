"""How ``otm decode`` shows a run: streamed text that stays readable, live figures that never cover it.

* In a terminal (stdout is a tty): finished lines of text are written once and never touched
  again; the bottom line holds the line being written followed by the live figures (tokens,
  tokens per target call, tokens/s), redrawn in place with ``\\r`` and erase-to-end-of-line. A
  line that would run past the terminal's width is broken at a space (or at the width) and
  committed, so the redraw never spans two screen lines.
* Piped, or with ``--quiet``: stdout receives the generated text only, as it comes; the figures
  go to stderr once, at the end.
* ``--json``: nothing while decoding; one JSON object at the end (see :func:`json_result`).

>>> import io
>>> out = io.StringIO()
>>> view = TerminalView(out, width=20)
>>> view.feed("The sky is blue because light scatters.")
>>> view.status("5 tokens")
>>> view.close()
>>> lines = out.getvalue().split("\\n")
>>> [l.rsplit("\\r\\x1b[K", 1)[-1] for l in lines]
['The sky is blue ', 'because light ', 'scatters.', '']
"""

from __future__ import annotations

import shutil

ERASE = "\r\x1b[K"  # carriage return, erase to the end of the line
DIM, RESET = "\x1b[2m", "\x1b[0m"


class TerminalView:
    """Text and a live status on a terminal, without ever redrawing finished text."""

    def __init__(self, out, width: int | None = None):
        self.out = out
        self.width = max(20, width or shutil.get_terminal_size((80, 24)).columns)
        self.pending = ""  # the line being written (not yet committed)
        self._status = ""

    def _commit(self, line: str) -> None:
        self.out.write(f"{ERASE}{line}\n")

    def feed(self, text: str) -> None:
        """Append generated text: commit every finished line, keep the unfinished one at the bottom."""
        self.pending += text
        *done, self.pending = self.pending.split("\n")
        for line in done:
            self._wrap_commit(line, final=True)
        self._wrap_commit(self.pending, final=False)
        self._draw()

    def _wrap_commit(self, line: str, final: bool) -> None:
        room = self.width - 1
        while len(line) > room:
            cut = line.rfind(" ", 0, room) + 1 or room  # break after a space, else at the width
            self._commit(line[:cut])
            line = line[cut:]
        if final:
            self._commit(line)
        else:
            self.pending = line

    def status(self, text: str) -> None:
        """Set the live figures shown after the unfinished line."""
        self._status = text
        self._draw()

    def _draw(self) -> None:
        room = self.width - 1 - len(self.pending)
        status = f"  [{self._status}]" if self._status else ""
        status = status[:room] if room > 3 else ""
        self.out.write(f"{ERASE}{self.pending}{DIM}{status}{RESET}" if status else f"{ERASE}{self.pending}")
        self.out.flush()

    def close(self) -> None:
        """Leave the text alone on the screen: the last line without the figures, then a newline."""
        self._status = ""
        self.out.write(f"{ERASE}{self.pending}\n")
        self.out.flush()


class PlainView:
    """Text as it comes, nothing else (stdout piped, or ``--quiet``)."""

    def __init__(self, out):
        self.out = out

    def feed(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()

    def status(self, text: str) -> None:
        pass

    def close(self) -> None:
        self.out.write("\n")
        self.out.flush()


class SilentView:
    """Nothing while decoding (``--json``)."""

    def feed(self, text: str) -> None:
        pass

    def status(self, text: str) -> None:
        pass

    def close(self) -> None:
        pass


def json_result(text: str, tokens: list[int], stats) -> dict:
    """The object ``otm decode --json`` prints: the text, the token ids and the run's measurements."""
    return {
        "text": text,
        "tokens": tokens,
        "stats": {
            "method": stats.method, "prompt_tokens": stats.prompt_tokens, "new_tokens": stats.new_tokens,
            "target_calls": stats.target_calls, "draft_calls": stats.draft_calls,
            "block_efficiency": stats.block_efficiency if stats.target_calls else None,
            "acceptance_by_depth": [a if a == a else None for a in stats.acceptance_by_depth],
            "wall_seconds": stats.wall_seconds, "tokens_per_second": stats.tokens_per_second,
            "target_seconds": stats.target_seconds, "draft_seconds": stats.draft_seconds, "stopped": stats.stopped,
        },
    }
