"""The planted-bug table: every mutant of otm.certify.mutants (token level, in each form it is written
in) and of otm.certify.decoder_mutants (inside the real decoder), run through ``otm certify`` as the
tests run them, with its exact TV, the verdict, the method that reached it and the seconds it took.

    .venv/bin/python analysis/planted_bugs.py            # about 1 minute on this 2-core CPU, 1 torch thread

Forms: law (exact: every draft tuple of the 16-case bank, then a hypothesis search of 100 pairs),
sampler (statistical, TV 0.05), torch (statistical, TV 0.01), decoder (the decoder's exact mode on
toy settings, K-SEQ k = 2, L = 2). Power 0.99 per case at family-wise level 1e-3 for the statistical forms.
"""

from __future__ import annotations

import platform
import time

import torch

import otm.torch as ot
from otm.certify import certify
from otm.certify.decoder_mutants import DECODER_MUTANTS
from otm.certify.decoder_mutants import exact_tv as decoder_tv
from otm.certify.mutants import MUTANTS, exact_tv


def main() -> None:
    torch.set_num_threads(1)
    print(f"# planted bugs through otm certify ({platform.machine()}, torch {torch.__version__}, 1 thread)\n")
    print("| bug | breaks | form | exact TV | verdict | caught by | seconds |")
    print("|---|---|---|---|---|---|---|")
    for name, m in MUTANTS.items():
        tv = exact_tv(m)
        for form in m.forms:
            rule = {"law": m.law, "sampler": m.sample, "torch": m.torch}[form]
            t0 = time.perf_counter()
            report = certify(rule, kind=form, scheme=m.scheme, k=m.k, tv=0.05 if form == "sampler" else 0.01,
                             examples=100)
            seconds = time.perf_counter() - t0
            how = "exact" if form == "law" else ("boundary probe" if "exactly 0.0" in (report.worst.reason or "")
                                                  else "statistical")
            size = f"{tv:.3g}" if tv is not None else f"~{report.worst.tv:.2g} (empirical)"
            print(f"| `{name}` | {m.breaks} | {form} | {size} | {report.verdict} | {how} | {seconds:.1f} |")
    for name, mutant in DECODER_MUTANTS.items():
        tv = decoder_tv(mutant)
        t0 = time.perf_counter()
        with mutant.plant():
            report = certify(ot.kseq, kind="decoder", scheme="iid", k=2, length=2)
        seconds = time.perf_counter() - t0
        print(f"| `{name}` | otm.decode.decoder | decoder | {tv:.3g} | {report.verdict} | exact mode | {seconds:.1f} |")


if __name__ == "__main__":
    main()
