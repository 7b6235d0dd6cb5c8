"""transformers' chain verifier, real code, across the supported range's signatures (docs/audit.md, "Chains in
the engines' layouts: real code").

Certifies ``_speculative_sampling`` at L = 1..4 with ``otm.certify.certify_chain(layout="transformers")``
(exact mode, every probe): the installed one, and the function's own source from other transformers
releases. For a release, give the folder that ``pip install --no-deps --target DIR transformers==X`` made:
the function is read from ``DIR/transformers/generation/utils.py`` and loaded alone (it uses only torch),
since the rest of that release may not import beside this environment's other packages.

    .venv/bin/python analysis/chain_transformers.py                      # the installed transformers
    .venv/bin/python analysis/chain_transformers.py /tmp/tf5.0.0 /tmp/tf5.16.0
"""

from __future__ import annotations

import argparse
import ast
import inspect
import sys
import tempfile
import time
from pathlib import Path

import torch

from otm.certify import certify_chain, load_rule
from otm.certify.chain import exact_capable


def _from_release(folder: Path):
    utils = folder / "transformers" / "generation" / "utils.py"
    version = "?"
    for dist in folder.glob("transformers-*.dist-info"):
        version = dist.name.removesuffix(".dist-info").split("-")[1]
    src = utils.read_text()
    fn = next(n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef) and n.name == "_speculative_sampling")
    out = Path(tempfile.mkdtemp()) / f"speculative_sampling_{version.replace('.', '_')}.py"
    out.write_text("import torch\n\n\n" + ast.get_source_segment(src, fn) + "\n")
    return version, load_rule(f"{out}:_speculative_sampling")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("releases", nargs="*", type=Path, help="folders made by pip install --no-deps --target")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    kernels = []
    import transformers
    from transformers.generation.utils import _speculative_sampling

    kernels.append((f"{transformers.__version__} (installed)", _speculative_sampling))
    kernels += [_from_release(folder) for folder in args.releases]
    print("| transformers | signature | L | exact mode | worst law error | failing probes | seconds |")
    print("|---|---|---|---|---|---|---|")
    for version, kernel in kernels:
        params = ", ".join(list(inspect.signature(kernel).parameters)[4:]) or "-"
        for L in (1, 2, 3, 4):
            start = time.perf_counter()
            report = certify_chain(kernel, layout="transformers", length=L)
            worst = max(c.law_error for c in report.cases if c.law_error is not None)
            failing = ", ".join(c.name for c in report.cases if not c.passed) or "none"
            print(f"| {version} | {params} | {L} | {exact_capable(kernel)} | {worst:.1e} | {failing} | "
                  f"{time.perf_counter() - start:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
