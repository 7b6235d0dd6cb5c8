"""Tests of ``otm profile`` (otm/decode/profile/, otm/decode/cli.py) on tiny random models.

Every number is recomputed from the library's closed forms on the very laws the profile used
(alpha* by ``otm.optimum``, each verifier by ``otm.verifiers``), the decode check is rerun through
``speculative_decode`` with its documented seed, and the command's JSON, figures and one-line errors
are checked. One test on the embedded pair is marked ``model`` (``make test-models``).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from otm.decode import profile as pf  # noqa: E402
from otm.laws import OtmError  # noqa: E402
from otm.optimum import optimal_acceptance  # noqa: E402
from otm.verifiers import greedy, kseq, kseq_without_replacement, optimal, rrs, rrs_without_replacement, speculative  # noqa: E402
from scripts import load_script

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

KS = (1, 2, 3, 4)


def _paper_table():
    return load_script("paper_table")


@pytest.fixture(scope="module")
def tiny():
    """paper_table's tiny pair (random 1-layer Llamas, V = 64) and a profile of it: 4 prompts (bootstrap)."""
    with torch.random.fork_rng():
        torch.set_num_threads(1)
        target, draft, tok = _paper_table().tiny_loader(vocab_size=64, seed=1)
        result = pf.profile(target, draft, tok, pf.PROMPTS[:4], ks=KS, length=3, temperature=0.7, positions=3,
                            paths=50, seed=0, check=True, check_prompts=2, check_tokens=6)
    return target, draft, tok, result


def test_laws_are_float64_softmax_of_the_models(tiny):
    target, draft, tok, result = tiny
    assert len(result.laws) == 4
    for tl, dl in result.laws:
        assert tl.dtype == dl.dtype == np.float64 and tl.shape == dl.shape == (3, 64)
        assert np.allclose(tl.sum(1), 1, atol=1e-12) and np.allclose(dl.sum(1), 1, atol=1e-12)
    ids = torch.tensor([pf.prompt_ids(tok, pf.PROMPTS[0])])
    with torch.no_grad():  # the first position's laws follow the prompt itself: recompute them directly
        t0 = torch.softmax(target(ids).logits[0, -1].double() / 0.7, -1).numpy()
        d0 = torch.softmax(draft(ids).logits[0, -1].double() / 0.7, -1).numpy()
    assert np.array_equal(result.laws[0][0][0], t0) and np.array_equal(result.laws[0][1][0], d0)


def test_every_number_equals_the_closed_forms_on_the_same_laws(tiny):
    *_, result = tiny
    for k in KS:
        row = result.row(k)
        recomputed = {name: [] for name in ("iid", "without_replacement", "greedy", "speculative", "kseq", "rrs", "optimal",
                                            "kseq_without_replacement")}
        for (tl, dl), per_position in zip(result.laws, result.positions[k]):
            for t, d, got in zip(tl, dl, per_position):
                a_iid = optimal_acceptance(t, d, k, "iid")
                assert got["alpha_iid"] == pytest.approx(a_iid, abs=1e-12)
                recomputed["iid"].append(a_iid)
                if k == 1:
                    assert got["speculative"] == pytest.approx(speculative.acceptance(t, d), abs=1e-12)
                    assert got["speculative"] == pytest.approx(a_iid, abs=1e-12)  # k = 1: the optimum is reached
                    recomputed["speculative"].append(got["speculative"])
                    continue
                for scheme in ("without_replacement", "greedy"):
                    a = optimal_acceptance(t, d, k, scheme)
                    assert got[f"alpha_{scheme}"] == pytest.approx(a, abs=1e-12)
                    recomputed[scheme].append(a)
                for name, mod in (("kseq", kseq), ("rrs", rrs), ("optimal", optimal)):
                    assert got[name] == pytest.approx(mod.acceptance(t, d, k), abs=1e-12)
                    recomputed[name].append(got[name])
                    assert got[name] <= a_iid + 1e-9  # a rule with an exact law never beats alpha*
                kw = kseq_without_replacement.acceptance(t, d, k)
                assert got["kseq_without_replacement"] == pytest.approx(kw, abs=1e-12)
                assert max(got["kseq"], got["alpha_without_replacement"] / 2) - 1e-9 <= kw  # its proved bounds
                assert kw <= got["alpha_without_replacement"] + 1e-9
                recomputed["kseq_without_replacement"].append(kw)
                assert got["greedy"] == pytest.approx(greedy.acceptance(t, d, k), abs=1e-12)
                assert got["greedy"] == pytest.approx(got["alpha_greedy"], abs=1e-9)
                if got["rrs_without_replacement_method"] == "exact":
                    exact = rrs_without_replacement.acceptance_exact(t, d, k)
                    assert got["rrs_without_replacement"] == pytest.approx(exact, abs=1e-12)
                    assert got["rrs_without_replacement"] <= got["alpha_without_replacement"] + 1e-9
                else:
                    assert got["rrs_without_replacement_se"] > 0
                    assert got["rrs_without_replacement"] <= got["alpha_without_replacement"] + 5 * got["rrs_without_replacement_se"]
        for scheme, stat in row.alpha.items():
            assert stat.mean == pytest.approx(np.mean(recomputed[scheme]), abs=1e-12)
            assert stat.lo <= stat.mean + 1e-12 and stat.mean <= stat.hi + 1e-12
        for name, v in row.verifiers.items():
            if name != "rrs_without_replacement":
                assert v.acceptance.mean == pytest.approx(np.mean(recomputed[name]), abs=1e-12)
                assert v.acceptance.mean <= row.alpha[v.scheme].mean + 1e-9
                assert v.ratio.mean <= 1 + 1e-9 and v.ratio.hi <= 1 + 1e-9  # every resample is a ratio of means <= 1
            expected = v.acceptance.mean / row.alpha[v.scheme].mean
            assert v.ratio.mean == pytest.approx(expected, abs=1e-12)
        if k > 1:
            assert row.verifiers["greedy"].ratio.mean == pytest.approx(1.0, abs=1e-9)
            assert row.best == max(pf.DECODABLE, key=lambda n: row.verifiers[n].acceptance.mean)
    assert "bootstrap over the 4 prompts" in result.conditions["interval"]


def test_predicted_block_efficiency_is_the_stated_model(tiny):
    *_, result = tiny
    for a in (0.0, 0.3, 0.9, 1.0):
        for L in (1, 3, 8):
            geometric = L + 1 if a == 1 else (1 - a ** (L + 1)) / (1 - a)
            assert pf.predicted_block_efficiency(a, L) == pytest.approx(geometric, abs=1e-12)
    assert pf.predicted_block_efficiency([0.5, 0.4, 0.2], 3) == pytest.approx(1 + 0.5 + 0.2 + 0.04, abs=1e-12)
    assert pf.predicted_block_efficiency([0.5, float("nan"), 0.9], 3) == pytest.approx(1.5, abs=1e-12)
    for row in result.rows:
        v = row.verifiers[row.best]
        assert v.predicted_block_efficiency.mean == pytest.approx(1 + sum(v.acceptance.mean ** d for d in (1, 2, 3)))
        assert row.ceiling_block_efficiency >= v.predicted_block_efficiency.mean - 1e-9


def test_the_decode_check_is_a_real_decode_with_its_documented_seed(tiny):
    from otm.decode import Sampling, speculative_decode
    from otm.decode.decoder import VERIFIERS

    target, draft, tok, result = tiny
    assert [c.k for c in result.checks] == list(KS)
    for j, c in enumerate(result.checks):
        assert c.verifier == ("speculative" if c.k == 1 else result.row(c.k).best)
        tokens = calls = 0
        accepted, verified = [0] * 3, [0] * 3
        for i in range(2):
            scheme = next(s for s, v in VERIFIERS.items() if c.verifier in v)
            g = speculative_decode(target, draft, pf.prompt_ids(tok, pf.PROMPTS[i]), k=c.k, length=3, verifier=c.verifier,
                                   scheme=scheme, sampling=Sampling(temperature=0.7), max_new_tokens=6,
                                   seed=0 * 1_000_003 + i * 1009 + j)
            tokens += g.stats.new_tokens
            calls += g.stats.target_calls
            accepted = [a + b for a, b in zip(accepted, g.stats.accepted_by_depth)]
            verified = [a + b for a, b in zip(verified, g.stats.verified_by_depth)]
        assert (c.new_tokens, c.target_calls, c.accepted_by_depth, c.verified_by_depth) == (tokens, calls, accepted, verified)
        assert c.block_efficiency == pytest.approx(tokens / calls)
        assert c.depth_formula == pytest.approx(pf.predicted_block_efficiency(c.acceptance_by_depth, 3))


def test_json_object_and_text_report(tiny):
    *_, result = tiny
    obj = json.loads(json.dumps(result.to_json()))
    assert set(obj) == {"conditions", "rows", "by_depth", "block_efficiency"}
    assert [r["k"] for r in obj["rows"]] == list(KS)
    assert set(obj["rows"][0]["verifiers"]) == {"speculative"}
    assert set(obj["rows"][1]["verifiers"]) == {"kseq", "rrs", "optimal", "rrs_without_replacement", "kseq_without_replacement",
                                                "greedy"}
    assert all(b["predicted"]["mean"] >= 1 and b["measured"] >= 1 for b in obj["block_efficiency"])
    text = pf.format_profile(result, "otm profile ...")
    for fragment in ("alpha*", "kseq", "rrs_without_replacement", "greedy", "speculative", "bootstrap",
                     "1 + sum_{d=1..L}", "measured", "depth formula", "differ where the draft's quality drops"):
        assert fragment in text, fragment


def test_normal_interval_below_four_prompts_and_refusals():
    values = [[0.2, 0.4, 0.6]]
    s = pf.interval(values)
    half = 1.96 * np.std([0.2, 0.4, 0.6], ddof=1) / math.sqrt(3)
    assert (s.mean, s.lo, s.hi) == pytest.approx((0.4, 0.4 - half, 0.4 + half))
    assert "normal" in pf.interval_method(3) and "bootstrap" in pf.interval_method(4)
    one = pf.interval([[0.5]])
    assert one.mean == 0.5 and math.isnan(one.lo)
    with pytest.raises(OtmError, match="temperature"):
        pf.check_settings(temperature=0, positions=1, length=1, paths=2, check_prompts=1, check_tokens=1)
    with pytest.raises(OtmError, match="k must be >= 1"):
        pf.check_ks([0, 2])
    with pytest.raises(OtmError, match="more drafts than the vocabulary"):
        pf.check_ks([9], V=8)


def correlated_prompts(seed=0):
    """Six prompts, each a run of positions near its own level (positions of one prompt are correlated)."""
    rng = np.random.default_rng(seed)
    return [list(level + 0.02 * rng.standard_normal(n))
            for level, n in zip([0.2, 0.35, 0.5, 0.55, 0.7, 0.9], [5, 9, 12, 7, 20, 3])]


def test_bootstrap_interval_resamples_prompts_as_units():
    """``interval`` with >= 4 prompts is scipy's percentile bootstrap over prompts, seeded: it holds the
    mean; it is the interval of the hand-written resampling it replaced, to 1e-12 (scipy draws the same
    indices, ``rng.integers(0, n, (B, n))``; its level (1 - 0.95) / 2 is 0.025 + 2e-17 in floating point,
    which moves an interpolated percentile by an ulp); a ratio of means scales with its
    denominator; and it is more than twice as wide as a bootstrap over positions, the mistake it avoids
    (treating the correlated positions of a prompt as independent evidence)."""
    values = correlated_prompts()
    s = pf.interval(values, seed=3)
    assert s.lo < s.mean < s.hi and s.hi - s.lo > 0.1
    sums = np.array([np.sum(v) for v in values])
    counts = np.array([len(v) for v in values], dtype=np.float64)
    pick = np.random.default_rng([3, 19]).integers(0, 6, size=(pf.BOOTSTRAP_RESAMPLES, 6))
    old = np.percentile(sums[pick].sum(1) / counts[pick].sum(1), [2.5, 97.5])
    assert (s.lo, s.hi) == pytest.approx(tuple(old), rel=0, abs=1e-12)
    halved = pf.interval(values, denominator=[[2.0] * len(v) for v in values], seed=3)
    assert (halved.mean, halved.lo, halved.hi) == (s.mean / 2, s.lo / 2, s.hi / 2)
    flat = np.concatenate(values)
    pos = np.random.default_rng(0).integers(0, flat.size, size=(pf.BOOTSTRAP_RESAMPLES, flat.size))
    naive = np.percentile(flat[pos].mean(1), [2.5, 97.5])
    assert naive[1] - naive[0] < 0.5 * (s.hi - s.lo)
    assert pf.interval(values, seed=4) != s  # the seed is used


# -- the command ------------------------------------------------------------------------------


def _save_pair(root: Path, *, V: int = 16, draft_vocab: int | None = None) -> tuple[str, str]:
    """A tiny target/draft pair with a word-level tokenizer, saved as Hugging Face directories."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "<eos>": 1, **{chr(ord("a") + i): 2 + i for i in range(V - 2)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", eos_token="<eos>")
    paths = []
    for name, seed, v in (("target", 30, V), ("draft", 31, draft_vocab or V)):
        torch.manual_seed(seed)
        cfg = LlamaConfig(vocab_size=v, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                          num_key_value_heads=2, max_position_embeddings=128, initializer_range=0.5,
                          bos_token_id=None, eos_token_id=None, pad_token_id=None)
        path = root / name
        LlamaForCausalLM(cfg).eval().save_pretrained(path)
        if name == "target":
            tokenizer.save_pretrained(path)
        paths.append(str(path))
    return paths[0], paths[1]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("pair")
    target, draft = _save_pair(root)
    prompts = root / "prompts.txt"
    prompts.write_text("a b c\n\nd e f g\nh i\nj k l m n\n")
    return target, draft, str(prompts), root


def test_cli_json_is_one_object_and_plots_are_png_and_svg(saved, tmp_path, capsys):
    from otm.cli import main

    target, draft, prompts, _ = saved
    argv = ["profile", "--target", target, "--draft", draft, "--prompts", prompts, "-k", "1,2,4", "--positions", "2",
            "--length", "2", "--check-prompts", "1", "--check-tokens", "4", "--no-progress", "--threads", "1"]
    assert main([*argv, "--json", "--plot", str(tmp_path / "fig")]) == 0
    out = capsys.readouterr().out
    obj = json.loads(out)  # the whole of stdout is one JSON document
    assert obj["conditions"]["prompts"] == 4 and obj["conditions"]["V"] == 16  # the blank line is skipped
    assert obj["conditions"]["prompt_source"] == f"all of {prompts}"
    assert [r["k"] for r in obj["rows"]] == [1, 2, 4]
    for r in obj["rows"]:
        for name, v in r["verifiers"].items():
            if name != "rrs_without_replacement" or "exact" in v["method"]:
                assert v["ratio"]["mean"] <= 1 + 1e-9
    assert [b["k"] for b in obj["by_depth"]] == [1, 2, 4]
    png, svg = tmp_path / "fig" / "profile.png", tmp_path / "fig" / "profile.svg"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    head = svg.read_text()[:400]
    assert head.startswith("<?xml") and "<svg" in head
    assert obj["conditions"]["plots"] == [str(png), str(svg)]

    assert main([*argv, "--num-prompts", "2", "--no-check"]) == 0
    text = capsys.readouterr().out
    assert "the first 2 of 4 in" in text and "skipped (--no-check)" in text and "kseq" in text


@pytest.mark.parametrize("extra, fragment", [
    (["--prompts", "/nonexistent/prompts.txt"], "does not exist"),
    (["--prompts", "EMPTY"], "holds no prompt"),
    (["-k", "0,2"], "whole numbers >= 1"),
    (["-k", "1,x"], "comma-separated"),
    (["-k", "17"], "more drafts than the vocabulary"),
    (["--temperature", "0"], "--temperature must be a finite number > 0"),
    (["--temperature", "nan"], "--temperature must be a finite number > 0"),
    (["--temperature", "-1"], "--temperature must be a finite number > 0"),
    (["--positions", "0"], "--positions must be >= 1"),
    (["--num-prompts", "9"], "--num-prompts must lie in"),
    (["--draft", "MISMATCH"], "vocabulary"),
])
def test_cli_bad_input_exits_2_with_one_line(saved, extra, fragment, capsys):
    from otm.cli import main

    target, draft, prompts, root = saved
    empty = root / "empty.txt"
    empty.write_text("\n  \n")
    if "MISMATCH" in extra and not (root / "other" / "draft").exists():
        _save_pair(root / "other", draft_vocab=17)
    extra = [str(empty) if x == "EMPTY" else str(root / "other" / "draft") if x == "MISMATCH" else x for x in extra]
    argv = ["profile", "--target", target, "--draft", draft, "--prompts", prompts, "--positions", "1",
            "--check-tokens", "2", "--no-progress", *extra]
    capsys.readouterr()
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert captured.out == "" and len(lines) == 1, captured.err
    assert lines[0].startswith("otm: error:") and fragment in lines[0], lines[0]


def test_console_json_bad_input_one_line_and_no_torch_at_parser_build(saved):
    target, draft, *_ = saved
    proc = subprocess.run([sys.executable, "-m", "otm.cli", "profile", "--prompts", "/nonexistent/p.txt"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and "does not exist" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "otm.cli", "profile", "--target", target, "--draft", draft, "-k", "2",
                           "--positions", "1", "--num-prompts", "1", "--no-check", "--threads", "1", "--json"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["rows"][0]["k"] == 2  # stdout, as a pipe reads it, is one JSON object
    code = ("import sys; from otm.cli import build_parser; build_parser().parse_args(['profile', '-k', '1,2']); "
            "import otm.decode.profile; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr


# -- the embedded pair (`make test-models`) -------------------------------------------------------


@pytest.mark.model
def test_profile_on_the_embedded_pair():
    from otm.decode.models import load_pair

    target, draft, tok = load_pair()
    result = pf.profile(target, draft, tok, pf.PROMPTS[:2], ks=(1, 2), length=2, temperature=1.0, positions=2,
                        paths=50, seed=0, check=True, check_prompts=1, check_tokens=6, eos_token_id=tok.eos_token_id)
    assert result.conditions["V"] == 49152 and "normal" in result.conditions["interval"]
    for (tl, dl), per_position in zip(result.laws, result.positions[2]):
        for t, d, got in zip(tl, dl, per_position):
            assert got["alpha_iid"] == pytest.approx(optimal_acceptance(t, d, 2, "iid"), abs=1e-12)
            assert got["kseq"] == pytest.approx(kseq.acceptance(t, d, 2), abs=1e-12)
            assert got["kseq"] <= got["alpha_iid"] + 1e-9 and got["rrs"] <= got["alpha_iid"] + 1e-9
    for row in result.rows:
        for name, v in row.verifiers.items():
            if name != "rrs_without_replacement":
                assert v.ratio.mean <= 1 + 1e-9
    assert all(c.new_tokens >= 1 and c.target_calls >= 1 for c in result.checks)
    assert "predicted" in pf.format_profile(result)


def test_plot_takes_an_interval_that_leaves_out_its_mean_by_rounding(tiny, tmp_path):
    """A bootstrap interval over means near 1 can leave out its own mean by a rounding (seen: V = 32, 5 prompts,
    k = 3, Stat(0.9999999999999997, 0.9999999999999994, 0.9999999999999996)); the plot draws a bar of length 0
    there instead of failing on a negative error bar (matplotlib's ValueError, the bug this guards)."""
    import dataclasses

    p = tiny[3]
    row = p.rows[0]
    scheme = next(iter(row.alpha))
    odd = pf.Stat(0.9999999999999997, 0.9999999999999994, 0.9999999999999996)
    bent = dataclasses.replace(p, rows=[dataclasses.replace(row, alpha={**row.alpha, scheme: odd}), *p.rows[1:]])
    paths = pf.plot_profile(bent, tmp_path)
    assert [x.suffix for x in paths] == [".png", ".svg"] and all(x.stat().st_size > 0 for x in paths)
