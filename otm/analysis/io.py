"""Writing results: tables (CSV + Markdown with a caption), figures (PNG + SVG) and resume caches.

Shared by :mod:`otm.analysis.gap` and the scripts in ``analysis/``.
"""

from __future__ import annotations

import csv
import json
import math
import textwrap
from pathlib import Path

from ..laws import OtmError


def load_resume_cache(path: Path, key) -> dict:
    """Records of a JSON-lines resume cache, by ``key(record)``; ``{}`` when there is no file.

    A line that does not parse (a run cut short mid-write) or lacks a key field is skipped,
    so the record is recomputed. Used by the resumable analysis scripts.
    """
    done = {}
    if Path(path).exists():
        for line in Path(path).read_text().splitlines():
            try:
                r = json.loads(line)
                done[key(r)] = r
            except (json.JSONDecodeError, KeyError, TypeError):
                continue
    return done


def write_table(records: list[dict], path_stem: Path, caption: str, digits: int = 4) -> None:
    """``<stem>.csv`` and ``<stem>.md`` (a caption line, then a Markdown table)."""
    path_stem.parent.mkdir(parents=True, exist_ok=True)
    if not records:
        raise OtmError(f"no rows for table {path_stem.name}: the sweep produced nothing")
    cols = list(records[0].keys())
    with path_stem.with_suffix(".csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerows(records)

    def fmt(v):
        if isinstance(v, float):
            if math.isnan(v):
                return "–"
            return f"{v:.{digits}f}" if abs(v) >= 1e-3 or v == 0 else f"{v:.1e}"
        return str(v)

    lines = [caption, "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r[c]) for c in cols) + " |" for r in records]
    path_stem.with_suffix(".md").write_text("\n".join(lines) + "\n")


def wrap(text: str, width: int) -> str:
    return textwrap.fill(text, width)


def save_figure(fig, stem: Path) -> list[Path]:
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = [stem.with_suffix(".png"), stem.with_suffix(".svg")]
    fig.savefig(paths[0], dpi=100, bbox_inches="tight")
    fig.savefig(paths[1], bbox_inches="tight", metadata={"Date": None})
    return paths


def group_label(family: str, param: float) -> str:
    """The label of a sweep's family of laws in tables and figures."""
    return f"Dirichlet({param:g})" if family == "dirichlet" else f"temperature T={param:g}"
