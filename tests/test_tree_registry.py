"""The whole-tree registry (otm.decode.tree_registry): every record makes its rule, every name reaches the
decoder, the CLI and the bench, a refuted rule is named as such in one line, and a rule that needs the
run's models gets them."""

from __future__ import annotations

import pytest

from otm.decode import decoder
from otm.decode.cli import ALL_VERIFIERS, _warn_refuted
from otm.decode.toy import ToyLM
from otm.decode.tree_registry import TREE_RULES, refuted, tree_rule_names
from otm.decode.tree_rules import TreeRule
from otm.laws import OtmError


@pytest.mark.parametrize("name", sorted(TREE_RULES))
def test_every_record_makes_its_rule_and_every_front_door_knows_it(name):
    spec = TREE_RULES[name]
    rule = spec.make(target_lm=ToyLM(2, seed=0), draft_lm=ToyLM(2, seed=1)) if spec.needs_models else spec.make()
    assert isinstance(rule, TreeRule)
    assert name in ALL_VERIFIERS
    for scheme in spec.schemes:
        assert name in tree_rule_names(scheme) and name in decoder.VERIFIERS[scheme]
    k = 1 if spec.chain_only else 2
    assert decoder.resolve_verifiers(name, spec.schemes[0], k) == (None, None, name)
    if spec.chain_only:
        with pytest.raises(OtmError, match="one draft chain"):
            decoder.resolve_verifiers(name, spec.schemes[0], 2)


def test_refuted_rules_are_named_in_one_line(capsys):
    assert refuted("hsd") and refuted("hsd_code") and not refuted("traversal") and not refuted("nope")
    _warn_refuted(["kseq", "hsd"])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("otm: warning: hsd is refuted") and "reproduce" in err[0]


def test_a_rule_that_needs_the_models_is_made_with_the_runs_models():
    target, draft = ToyLM(3, seed=0), ToyLM(3, seed=1)
    g = decoder.speculative_decode(target, draft, [0, 2], k=2, length=1, verifier="tree_lp", max_new_tokens=4, seed=0)
    assert len(g.tokens) == 4


def test_a_rule_option_by_name_layer_kseq():
    """``layer:STEP`` makes Layer(step=STEP) by name, in the decoder (exact) and on the command line."""
    from otm.cli import build_parser
    from otm.decode.exact_mode import exact_decode_law, law_error, target_law
    from otm.decode.toy import model_law

    t, d = ToyLM(2, seed=0), ToyLM(2, seed=1)
    law = exact_decode_law(t, d, [0, 1], max_new_tokens=3, k=2, length=2, verifier="layer:kseq")
    assert law_error(law, target_law(model_law(t, [0, 1], None), 3)) < 1e-12
    g = decoder.speculative_decode(t, d, [0, 1], k=2, length=2, verifier="layer:rrs", max_new_tokens=3, seed=0)
    assert g.stats.method.startswith("layer:rrs")
    args = build_parser().parse_args(["decode", "--prompt", "x", "--verifier", "layer:kseq"])
    assert args.verifier == "layer:kseq"
    with pytest.raises(OtmError, match="invalid choice: 'kseq:rrs'"):
        build_parser().parse_args(["decode", "--prompt", "x", "--verifier", "kseq:rrs"])
    with pytest.raises(OtmError, match="does not fit"):
        decoder.resolve_verifiers("kseq:rrs", "iid", 2)
