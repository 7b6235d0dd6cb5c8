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
