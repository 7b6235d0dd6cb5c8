import numpy as np
import pytest

from otm.laws import OtmError, categorical, check_k, check_law


def one_line(exc: pytest.ExceptionInfo) -> str:
    msg = str(exc.value)
    assert "\n" not in msg and msg
    return msg


@pytest.mark.parametrize(
    "law, fragment",
    [
        ([0.5, -0.1, 0.6], "negative"),
        ([0.5, float("nan"), 0.5], "non-finite"),
        ([0.5, float("inf"), 0.5], "non-finite"),
        ([0.5, 0.4], "sums to 0.9"),
        ([], "empty"),
        ([[0.5, 0.5]], "1-D"),
        (["a", "b"], "not a vector"),
    ],
)
def test_bad_laws_are_refused_in_one_line(law, fragment):
    with pytest.raises(OtmError) as exc:
        check_law(law, "draft")
    assert fragment in one_line(exc)
    assert "draft" in str(exc.value)


def test_mismatched_lengths():
    with pytest.raises(OtmError) as exc:
        check_law([0.5, 0.5], "draft", size=3)
    assert "same vocabulary" in one_line(exc)


def test_sum_tolerance_and_normalisation():
    out = check_law([0.5, 0.5 + 5e-7], "target")
    assert abs(out.sum() - 1.0) < 1e-15
    with pytest.raises(OtmError):
        check_law([0.5, 0.5 + 2e-6], "target")


@pytest.mark.parametrize("k", [0, -1, 1.5, True, "2"])
def test_bad_k(k):
    with pytest.raises(OtmError) as exc:
        check_k(k)
    one_line(exc)


class ConstantRng:
    """A stand-in Generator whose uniforms are all ``u`` (boundary tests)."""

    def __init__(self, u: float):
        self.u = u

    def random(self):
        return self.u


@pytest.mark.parametrize("u", [0.0, 1.0 - 2**-53])
def test_categorical_never_returns_zero_mass(u):
    law = np.array([0.0, 0.0, 0.3, 0.0, 0.7, 0.0])
    assert law[categorical(ConstantRng(u), law)] > 0


def test_public_doors_refuse_bad_input_in_one_line():
    """Each door names the right culprit: acceptance of unnormalised or NaN laws, a target whose size
    differs from the scheme's draft law (not "the target has 2"), a scheme given by name."""
    from otm.exact import evaluate
    from otm.lp import solve_lp
    from otm.optimum import optimal_acceptance_of
    from otm.schemes import IID
    from otm.verifiers import lp_optimal, speculative

    cases = [
        (lambda: speculative.acceptance([5, 5], [0.5, 0.5]), "sums to 10"),
        (lambda: speculative.acceptance([float("nan"), 1.0], [0.5, 0.5]), "non-finite"),
        (lambda: speculative.acceptance([0.5, 0.5], [0.2, 0.2, 0.6]), "draft has 3 masses but the target has 2"),
        (lambda: solve_lp(IID([0.5, 0.5], 2), [0.2, 0.3, 0.5]), "iid scheme's draft law has 2"),
        (lambda: evaluate("kseq", IID([0.5, 0.5], 2), [0.2, 0.3, 0.5]), "iid scheme's draft law has 2"),
        (lambda: lp_optimal.bind([0.2, 0.3, 0.5], IID([0.5, 0.5], 2)), "iid scheme's draft law has 2"),
        (lambda: solve_lp("iid", [0.5, 0.5]), "expected a draft scheme"),
        (lambda: evaluate("kseq", "iid", [0.5, 0.5]), "expected a draft scheme"),
        (lambda: optimal_acceptance_of(None, [1.0]), "expected a draft scheme"),
    ]
    for call, words in cases:
        with pytest.raises(OtmError) as err:
            call()
        assert words in str(err.value) and "\n" not in str(err.value), str(err.value)
