"""A tree rule sees the decoder only through its step context, and draws only through its chance door.

* The context exposes what a rule needs and nothing else: a rule reaching for the decoder's target model
  (a realistic bug: reading a cache or a model behind the step's back) fails with AttributeError, and the
  same rule written against the context's own methods runs and keeps the decoder's counters.
* No tree rule module draws randomness of its own: every ``torch.rand*`` / ``multinomial`` / ``bernoulli`` /
  ``np.random`` / ``random`` call is refused by an AST scan of the rule modules (the exact mode enumerates
  the runs of the real code through the door, so a private draw would make its law wrong); the scan finds a
  planted ``torch.rand`` (negative control).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from otm.decode import speculative_decode
from otm.decode.step_context import StepContext
from otm.decode.toy import ToyLM
from otm.decode.tree_rules import TreeRule

ROOT = Path(__file__).resolve().parents[1]
# (otm/certify/tree_kernels.py is not among them: it runs engines' kernels in their own layouts, which take
# the run's generator as their one source of randomness; they are judged statistically, never in exact mode)
RULE_MODULES = sorted((ROOT / "otm" / "decode").glob("tree_rules*.py")) + [ROOT / "otm" / "decode" / "step_context.py"]

RANDOM_CALLS = {"rand", "randn", "randint", "rand_like", "randn_like", "randint_like", "randperm", "multinomial",
                "bernoulli", "normal", "poisson", "exponential_", "uniform_", "random_", "geometric_"}


def private_draws(path: Path) -> list[str]:
    """``line: call`` for every draw of randomness not through the chance door (``torch.rand(...)``,
    ``t.uniform_()``, ``np.random.*``, ``random.*``, ``torch.Generator(...)``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
        owner = ast.unparse(f.value) if isinstance(f, ast.Attribute) else ""
        if name in RANDOM_CALLS or name == "Generator" or owner.split(".")[-1] == "random" or owner == "random":
            found.append(f"{node.lineno}: {ast.unparse(f)}")
    return found


@pytest.mark.parametrize("path", RULE_MODULES, ids=lambda p: p.name)
def test_no_tree_rule_draws_randomness_of_its_own(path):
    assert private_draws(path) == []


def test_the_scan_sees_a_planted_draw(tmp_path):
    fake = tmp_path / "tree_rules_fake.py"
    fake.write_text("import numpy as np\nimport torch\n\ndef walk(dec):\n    u = torch.rand(3)\n"
                    "    v = np.random.default_rng(0).random()\n    w = dec.chance.uniforms(2, 'cpu')\n    return u, v, w\n")
    assert private_draws(fake) == ["5: torch.rand", "6: np.random.default_rng"]


class _PeekingRule(TreeRule):
    """The target's own draw at the root, but read through the decoder's target model (the planted bug)."""

    name = "peeking"

    def walk(self, dec, tree, drafts, target_laws):
        dec.target.length()  # not part of the step context
        return [dec.bonus(tree, 0, target_laws)], []


class _RootOnlyRule(TreeRule):
    """The target's own draw at the root, every draft rejected: counted as one verification at depth 0."""

    name = "root only"

    def walk(self, dec, tree, drafts, target_laws):
        dec.count(0, False)
        return [dec.bonus(tree, 0, target_laws)], []


def test_a_rule_sees_only_the_step_context():
    target, draft = ToyLM(3, seed=0), ToyLM(3, seed=1)
    with pytest.raises(AttributeError, match="target"):
        speculative_decode(target, draft, [0, 1], k=2, length=2, verifier=_PeekingRule(), max_new_tokens=3, seed=0)
    out = speculative_decode(target, draft, [0, 1], k=2, length=2, verifier=_RootOnlyRule(), max_new_tokens=3, seed=0)
    # the last step has one token to go, so it drafts nothing and the decoder draws at the root itself
    assert len(out.tokens) == 3 and out.stats.steps == 3 and out.stats.verified_by_depth[0] == 2
    assert out.stats.accepted_by_depth == [0, 0]
    with pytest.raises(AttributeError):
        StepContext(object()).anything = 1  # __slots__: no attribute can be hung on it either


def test_count_path_counts_as_a_walk_level_by_level():
    class Stats:
        verified_by_depth = [0, 0, 0]
        accepted_by_depth = [0, 0, 0]

    class Dec:
        stats = Stats()

    ctx = StepContext(Dec())
    ctx.count_path(1)  # depths 0 and 1 verified, depth 0 accepted
    ctx.count_path(3)  # a whole path of L = 3 accepted: every depth verified and accepted
    ctx.count_path(2, limit=2)  # a step cut to depth 2 near the limit
    assert Stats.verified_by_depth == [3, 3, 1] and Stats.accepted_by_depth == [3, 2, 1]
