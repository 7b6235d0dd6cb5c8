"""Progress (otm.progress): tqdm's live bar on a terminal, plain throttled lines in a pipe or a log."""

from __future__ import annotations

import io

from otm.progress import Lines, bar


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_pipe_gets_plain_lines_without_carriage_returns(monkeypatch):
    out = io.StringIO()  # not a terminal
    b = bar(total=6, desc="bench-decode", file=out, every=0.0)
    assert isinstance(b, Lines)
    for name in ("autoregressive", "kseq k=4 L=1"):
        b.set_postfix_str(name)
        b.update(3)
    b.close()
    b.close()  # once
    text = out.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert lines[0].startswith("bench-decode: 3/6 (autoregressive), ") and lines[0].endswith(" s")
    assert lines[1].startswith("bench-decode: 6/6 (kseq k=4 L=1), ")
    assert lines[-1].startswith("bench-decode: 6/6, ") and lines[-1].endswith(" s, done") and len(lines) == 3


def test_lines_are_throttled_and_iteration_counts():
    out = io.StringIO()
    seen = list(bar(range(5), desc="laws", file=out, every=3600.0))
    assert seen == [0, 1, 2, 3, 4]
    assert out.getvalue().count("\n") == 0  # nothing before the end: under the interval
    b = bar(range(5), desc="laws", file=out, every=3600.0)
    for _ in b:
        pass
    b.close()
    (line,) = out.getvalue().splitlines()  # one line, at the end
    assert line.startswith("laws: 5/5, ") and line.endswith(" s, done")


def test_a_terminal_gets_tqdm_and_disable_is_silent():
    from tqdm import tqdm

    term = _Terminal()
    live = bar(total=2, desc="x", file=term)
    assert isinstance(live, tqdm)
    live.update(2)
    live.close()
    assert "\r" in term.getvalue()  # tqdm's redraws
    quiet = io.StringIO()
    off = bar(total=2, desc="x", file=quiet, disable=True)
    off.update(2)
    off.close()
    assert quiet.getvalue() == ""
