"""An engine's CI test: its chain verifier certified lossless by otm, in the engine's own layout.

Copy this file into an engine's test suite, point ``KERNEL`` at the engine's function and ``LAYOUT``
at its layout (``transformers``, ``vllm`` or ``flashinfer``: docs/certify.md, "Chains in the engines'
layouts"). Here it runs against transformers' ``_speculative_sampling`` as installed; ``make test``
collects it (pyproject's testpaths).

``assert_lossless`` raises an AssertionError carrying otm's whole report (every setting, the worst
case, a one-line command that reproduces it) when the kernel is refuted.
"""

import pytest

pytest.importorskip("transformers")

from transformers.generation.utils import _speculative_sampling as KERNEL  # noqa: E402

from otm.certify import assert_lossless  # noqa: E402

LAYOUT = "transformers"


@pytest.mark.parametrize("length", [1, 3])
def test_chain_verifier_is_lossless(length):
    # the law of one call (which tokens, how many accepted, the bonus) and the output's form, exact for
    # transformers' code; boundary="note" keeps the u = 0 finding below out of this verdict
    assert_lossless(KERNEL, layout=LAYOUT, length=length, boundary="note")


def test_known_finding_a_uniform_of_zero_accepts_a_zero_mass_draft():
    # transformers accepts when r_i <= p_i / q_i: at r_i = 0.0 (probability 2^-24 per float32 test) a draft
    # of zero target mass is accepted. This test fails once transformers tests r_i < p_i / q_i instead.
    with pytest.raises(AssertionError, match="u <= ratio"):
        assert_lossless(KERNEL, layout=LAYOUT, length=1, vocabs=())
