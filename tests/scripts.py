"""Loading a script of ``analysis/`` (not a package) as a module, for the tests that check it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_script(name: str):
    """``analysis/<name>.py`` executed as a module named after the file (``name`` may hold a folder:
    ``research/wor_two_pass``)."""
    spec = importlib.util.spec_from_file_location(Path(name).name, ROOT / "analysis" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
