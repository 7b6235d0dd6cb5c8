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
    b = bar(range(5), desc="laws", file=out, every=3600.0)
    seen = []
    for x in b:
        seen.append(x)
        assert out.getvalue() == ""  # nothing while running: under the interval
    assert seen == [0, 1, 2, 3, 4]
    b.close()  # iterated to the end closed it already (as tqdm): one line, not two
    (line,) = out.getvalue().splitlines()
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


def test_the_gguf_conversion_bar_goes_through_ours(capsys):
    """transformers' GGUF loader draws its own tqdm bar; during the embedded target's conversion it is ours: lines
    in a pipe (pytest's captured stderr is not a terminal), and the loader's own bar back afterwards."""
    from transformers import modeling_gguf_pytorch_utils as loader

    from otm.decode.embedded import _gguf_progress

    own = loader.tqdm
    with _gguf_progress():
        assert list(loader.tqdm(range(3), desc="Converting and de-quantizing GGUF tensors...")) == [0, 1, 2]
    assert loader.tqdm is own
    err = capsys.readouterr().err
    assert "\r" not in err and err.startswith("Converting and de-quantizing GGUF tensors: 3/3, ")
