"""The docs match the code: every ``python`` block of README.md and docs/api.md runs (in order, one
namespace per file, as a reader would paste them), and every repository path the docs cite exists
(README.md, every page of docs/ and the READMEs under analysis/).

Blocks that would load the embedded models are written as ``text`` blocks, so nothing here reaches
the model cache.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUNNABLE = ["README.md", "docs/api.md"]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
# a backticked path into the repository: starts at one of the top-level folders (or a top file)
PATH = re.compile(r"`((?:otm|docs|analysis|tests|notebooks|\.ci)/[A-Za-z0-9_./<>*-]*|Makefile|pyproject\.toml)`")


def python_blocks(text: str) -> list[str]:
    return [body for lang, body in FENCE.findall(text) if lang == "python"]


def test_the_block_finder_sees_python_blocks_only():
    text = "a\n```python\nx = 1\n```\n```text\nnot run\n```\n```console\n$ otm\n```\n```python\ny = x\n```\n"
    assert python_blocks(text) == ["x = 1\n", "y = x\n"]


@pytest.mark.parametrize("page", RUNNABLE)
def test_every_python_block_runs(page, tmp_path, monkeypatch, one_thread):
    monkeypatch.chdir(tmp_path)  # whatever a block writes lands here
    blocks = python_blocks((ROOT / page).read_text())
    assert blocks, f"{page} has no python block"
    namespace: dict = {"__name__": "__docs__"}
    for i, body in enumerate(blocks):
        try:
            exec(compile(body, f"{page} block {i + 1}", "exec"), namespace)
        except Exception as exc:  # pragma: no cover - the message is the point
            pytest.fail(f"{page}, python block {i + 1} fails: {type(exc).__name__}: {exc}\n{body}")


def cited_paths(text: str) -> set[str]:
    out = set()
    for raw in PATH.findall(text):
        path = raw.rstrip(".")
        if any(c in path for c in "<>*"):
            stem = path.split("<")[0].split("*")[0]
            path = stem[: stem.rfind("/") + 1]  # a pattern: its folder must exist
        out.add(path)
    return out


PAGES = ["README.md", *sorted(str(p.relative_to(ROOT))
                               for p in [*(ROOT / "docs").glob("*.md"), *(ROOT / "analysis").rglob("README.md")])]


@pytest.mark.parametrize("page", PAGES)
def test_every_cited_path_exists(page):
    missing = sorted(p for p in cited_paths((ROOT / page).read_text()) if not (ROOT / p).exists())
    assert not missing, f"{page} cites paths that do not exist: {missing}"


def test_the_path_check_sees_a_missing_path():
    """Negative control: a cited path that does not exist is found; patterns check their folder."""
    found = cited_paths("`otm/models.py`, `otm/verifiers/<name>.py`, `tests/test_tree_rules_<rule>.py`, `docs/api.md`")
    assert found == {"otm/models.py", "otm/verifiers/", "tests/", "docs/api.md"}
    assert [p for p in sorted(found) if not (ROOT / p).exists()] == ["otm/models.py"]
