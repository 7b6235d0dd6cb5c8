r"""Certify a token-level rule: by its exact law, or by sampling it (numpy or batched torch).

A *rule* (verifier) maps ``(target, draft, drafts)`` to one output token; it is valid for a draft
scheme when, averaged over the scheme's draft tuples :math:`P(\bar x)` and the rule's own
randomness, the output law is exactly the target's:

.. math::

    \mathrm{out}(y) = \sum_{\bar x} P(\bar x)\, \pi(y \mid \bar x) = p(y) \quad \forall y .

Three forms of rule are certified on the bank of laws of :mod:`otm.certify.bank`:

``law``
    ``law(target, draft, drafts) -> [V]``, the exact conditional law :math:`\pi(\cdot\mid\bar x)`.
    Every draft tuple of the scheme is enumerated; the case passes when the output law is a law
    (finite, non-negative, sums to 1 within 1e-9 for every tuple) and
    :math:`\max_y |\mathrm{out}(y) - p(y)| \le 10^{-9}`. After the fixed bank a hypothesis search
    over random pairs (zeros, 1e-12 masses, point masses, identical and disjoint laws) looks for
    a counterexample and shrinks it to its smallest form.
``sampler``
    ``sample(target, draft, drafts, rng) -> token`` (an int or an object with ``.token``),
    numpy, one draw per call.
``torch``
    a batched rule with the signature of :data:`otm.torch.VERIFIERS`:
    ``rule(target [n, V], draft [n, V], drafts [n, k], *, generator=None) -> Verified`` (or the
    token tensor ``[n]``).

Statistical certification (``sampler``, ``torch``). For each case, n drafts are drawn from the
scheme and the rule's output tokens are compared with the target by Pearson's chi-square test
(:func:`otm.testing.chi2_gof`; tokens with expected count below 5 pooled; a draw of a token of
zero target mass rejects outright) at level :math:`\alpha / (2B)` over the B cases (Bonferroni:
the chance of refuting a valid rule anywhere is at most :math:`\alpha`). n is chosen from the
noncentral chi-square so that *every* output law at total variation :math:`\varepsilon` or more
from the target is detected with power at least 0.99: for a shift :math:`d` of the cell laws,
Cauchy-Schwarz gives :math:`\sum_c d_c^2/p_c \ge (\sum_c |d_c|)^2 = 4\varepsilon^2`, so the
noncentrality is at least :math:`4 n \varepsilon^2` whatever the alternative (TV measured on the
merged cells). The acceptance P(output in drafts) is estimated with a Wilson interval; an
acceptance above the scheme's optimum :math:`\alpha^*` beyond its interval at the same level
:math:`\alpha / (2B)` proves the rule invalid (no rule with the target's output law accepts more
often). A *boundary probe* then runs the rule with uniforms of exactly 0.0 (``rng.random()``
returning 0.0; for torch rules ``uniforms`` of zeros when the rule takes them): a token of zero
target mass emitted then is the ``u <= ratio`` bug of SGLang #35771, and refutes.

>>> from otm.verifiers import kseq
>>> report = certify(kseq.law, kind="law", scheme="iid", k=2, examples=20)
>>> report.certified, report.worst.law_error < 1e-9
(True, True)
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import math
import random
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

from ..laws import OtmError, check_k, check_law
from ..optimum import BRUTE_FORCE_MAX_V, brute_force_optimum, optimal_acceptance_of
from ..testing import MIN_EXPECTED, chi2_gof, wilson_interval
from .power import LAW_TOLERANCE, POWER, draws_for
from .bank import CERTIFY_SCHEMES, Instance, build_scheme, fixed_bank, pairs
from .report import Case, Report, law_text

KINDS = ("law", "sampler", "torch", "decoder")
"""Forms of rule :func:`certify` takes."""

DEFAULT_TV = 0.01
"""Default total variation the statistical run must detect with power :data:`POWER`."""

DEFAULT_ALPHA = 1e-3
"""Default family-wise level: the chance of refuting a valid rule."""

MAX_TUPLES = 20_000
"""Largest number of draft tuples enumerated per case (larger cases are skipped and listed)."""

HYPOTHESIS_EXAMPLES = 300
"""Default number of random pairs the hypothesis search tries after the fixed bank (law kind)."""

CHUNK = 1 << 16
"""Rows per call of a torch rule."""


class _RuleFault(Exception):
    """The rule misbehaved on valid input (raised, or returned something that is not a token / law)."""


# -- loading a user's rule ---------------------------------------------------------------------------


def load_rule(spec: str) -> Callable:
    """The callable named by ``MODULE:FUNCTION`` (MODULE importable, or a path to a .py file).

    ``FUNCTION`` may be dotted (``module:Class.method``). One-line OtmError when it cannot be found.
    """
    if not isinstance(spec, str) or spec.count(":") != 1 or not all(spec.split(":")):
        raise OtmError(f"name the rule as MODULE:FUNCTION (e.g. otm.verifiers.kseq:law or my_rule.py:sample), got {spec!r}")
    mod_name, attr = spec.split(":")
    path = Path(mod_name)
    try:
        if mod_name.endswith(".py"):
            if not path.is_file():
                raise OtmError(f"no such file {mod_name!r}: give an existing .py file or an importable module")
            unique = f"_otm_certify_{abs(hash(str(path.resolve())))}"
            module_spec = importlib.util.spec_from_file_location(unique, path)
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[unique] = module
            module_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(mod_name)
    except OtmError:
        raise
    except ModuleNotFoundError as exc:
        top = (exc.name or "").split(".")[0]
        if top in ("torch", "transformers") and top != mod_name.split(".")[0]:
            extra = "torch" if top == "torch" else "decode"
            raise OtmError(f"{mod_name!r} needs {top}, which is not installed: pip install 'otm[{extra}]'") from None
        raise OtmError(f"cannot import {mod_name!r} ({exc}): give an importable module or a path to a .py file") from None
    except Exception as exc:  # the user's module failed while importing
        raise OtmError(f"importing {mod_name!r} failed: {type(exc).__name__}: {exc}") from None
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise OtmError(f"{mod_name!r} has no attribute {attr!r}: name a function defined there")
        obj = getattr(obj, part)
    if not callable(obj):
        raise OtmError(f"{spec} is not callable: name a function")
    return obj


_CALLS = {
    "law": ("law(target, draft, drafts)", 3, ()),
    "sampler": ("sample(target, draft, drafts, rng)", 4, ()),
    "torch": ("rule(target, draft, drafts, generator=...)", 3, ("generator",)),
    "decoder": ("verifier(target, draft, drafts, generator=..., validate=...)", 3, ("generator", "validate")),
}


def check_signature(rule: Callable, kind: str) -> None:
    """One-line OtmError when ``rule`` cannot be called the way ``kind`` calls it (the wrong ``--kind``)."""
    call, positional, keywords = _CALLS[kind]
    try:
        signature = inspect.signature(rule)
    except (TypeError, ValueError):  # a builtin without a signature: let the call decide
        return
    try:
        signature.bind(*range(positional), **{key: None for key in keywords})
    except TypeError as exc:
        raise OtmError(f"--kind {kind} calls {call}, but the rule takes {signature} ({exc}): "
                       "choose the --kind that matches the rule") from None


def _is_tree_rule(rule) -> bool:
    """A decoder verifier given by name (``"traversal"``), or a TreeRule class or instance."""
    if isinstance(rule, str):
        return True
    try:
        from ..decode.tree_rules import TreeRule
    except ImportError:  # torch not installed: no tree rule can exist
        return False
    return isinstance(rule, TreeRule) or (isinstance(rule, type) and issubclass(rule, TreeRule))


def rule_name(rule: Callable) -> str:
    """``module:qualname`` of a callable (what :func:`load_rule` reads back when importable)."""
    module = getattr(rule, "__module__", None) or "?"
    return f"{module}:{getattr(rule, '__qualname__', getattr(rule, '__name__', type(rule).__name__))}"


# -- helpers -----------------------------------------------------------------------------------------


def _fault_text(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"raised {type(exc).__name__}: {text}"[:200]


def _call_law(rule, target, draft, tup, V: int) -> np.ndarray:
    try:
        out = rule(target.copy(), draft.copy(), tup.copy())
    except Exception as exc:
        raise _RuleFault(f"{_fault_text(exc)} on drafts {tup.tolist()}") from None
    try:
        out = np.asarray(out, dtype=np.float64)
    except (TypeError, ValueError):
        raise _RuleFault(f"returned {type(out).__name__}, not a law over {V} tokens") from None
    if out.shape != (V,):
        raise _RuleFault(f"returned shape {out.shape} on drafts {tup.tolist()}, not ({V},)")
    if not np.isfinite(out).all():
        raise _RuleFault(f"returned a non-finite mass on drafts {tup.tolist()}")
    if out.min() < -LAW_TOLERANCE:
        raise _RuleFault(f"returned a negative mass {out.min():.3g} on drafts {tup.tolist()}")
    if abs(out.sum() - 1.0) > LAW_TOLERANCE:
        raise _RuleFault(f"returned masses summing to {out.sum():.12g} on drafts {tup.tolist()}")
    return out


def _optimum(scheme, target) -> float:
    """alpha* of the scheme: brute force over all subsets (exact to rounding) on small V, else closed form."""
    if scheme.V <= min(BRUTE_FORCE_MAX_V, 12):
        return float(brute_force_optimum(scheme, target))
    return float(optimal_acceptance_of(scheme, target).value)


def _tv(a: np.ndarray, b: np.ndarray) -> float:
    return 0.5 * float(np.abs(a - b).sum())


class _ZeroUniforms:
    """A numpy Generator whose ``random()`` returns exactly 0.0 (the boundary probe); every other
    method is a real generator's."""

    def __init__(self, seed: int):
        self._rng = np.random.default_rng(seed)

    def random(self, size=None, dtype=np.float64, out=None):
        if size is None:
            return 0.0
        return np.zeros(size, dtype=dtype)

    def __getattr__(self, name):
        return getattr(self._rng, name)


def _token_of(out, V: int) -> int:
    token = getattr(out, "token", out)
    try:
        token = int(token)
    except (TypeError, ValueError):
        raise _RuleFault(f"returned {type(out).__name__}, not a token id") from None
    if not 0 <= token < V:
        raise _RuleFault(f"returned token {token}, outside 0..{V - 1}")
    return token


# -- one case ----------------------------------------------------------------------------------------


def _exact_case(rule, inst: Instance, scheme_name: str, k: int, scheme=None) -> Case:
    scheme = scheme or build_scheme(scheme_name, inst.draft, k)
    case = Case(inst.name, scheme_name, k, target=inst.target, draft=inst.draft)
    tuples, probs = scheme.enumerate(MAX_TUPLES)
    V = inst.V
    out = np.zeros(V)
    acc = 0.0
    try:
        for tup, pr in zip(tuples, probs):
            cond = _call_law(rule, inst.target, inst.draft, tup, V)
            out += pr * cond
            acc += pr * float(cond[np.unique(tup)].sum())
    except _RuleFault as fault:
        case.passed, case.reason, case.law_error = False, str(fault), math.inf
        return case
    case.law_error = float(np.abs(out - inst.target).max())
    case.tv = _tv(out, inst.target)
    case.acceptance = acc
    case.acceptance_ci = (acc, acc)
    case.optimum = _optimum(scheme, inst.target)
    if case.law_error > LAW_TOLERANCE:
        y = int(np.argmax(np.abs(out - inst.target)))
        case.passed = False
        case.reason = (f"output law differs from the target by {case.law_error:.3g} at token {y} "
                       f"({out[y]:.6g} vs {inst.target[y]:.6g}; TV {case.tv:.3g})")
    if acc > case.optimum + LAW_TOLERANCE:
        case.passed = False
        case.reason = (f"acceptance {acc:.9g} is above alpha* = {case.optimum:.9g}: no rule with the target's "
                       f"output law accepts more often, so the rule is invalid" + (f"; {case.reason}" if case.reason else ""))
    return case


def _statistical_case(draw, inst: Instance, scheme_name: str, k: int, *, tv: float, level: float,
                      scheme=None, progress=None) -> Case:
    """``draw(n) -> (tokens [n], members [n] bool)`` draws n outputs of the rule on this case."""
    scheme = scheme or build_scheme(scheme_name, inst.draft, k)
    target = inst.target
    case = Case(inst.name, scheme_name, k, target=target, draft=inst.draft)
    n = draws_for(target, tv, level)
    try:
        tokens, members = draw(n, scheme, progress)
    except _RuleFault as fault:
        case.passed, case.reason = False, str(fault)
        return case
    counts = np.bincount(tokens, minlength=target.size).astype(float)
    gof = chi2_gof(counts, target, alpha=level)
    case.draws = n
    case.pvalue = 0.0 if gof.impossible else gof.pvalue
    case.tv = _tv(counts / n, target)
    hits = int(members.sum())
    case.acceptance = hits / n
    case.acceptance_ci = wilson_interval(hits, n, 0.95)
    case.optimum = _optimum(scheme, target)
    reasons = []
    if gof.impossible:
        bad = int(np.flatnonzero((counts > 0) & (target == 0))[0])
        reasons.append(f"emitted token {bad} of zero target mass ({gof.impossible} of {n} draws)")
    elif gof.reject:
        reasons.append(f"output law differs from the target: chi-square p = {gof.pvalue:.3g} < {level:.3g} "
                       f"(empirical TV {case.tv:.3g})")
    lo = wilson_interval(hits, n, 1.0 - 2.0 * level)[0]
    if lo > case.optimum + 1e-12:
        reasons.append(f"acceptance {case.acceptance:.4f} is above alpha* = {case.optimum:.4f} beyond its interval "
                       f"(lower bound {lo:.4f} at level {level:.2g}): no valid rule accepts more often")
    if reasons:
        case.passed, case.reason = False, "; ".join(reasons)
    return case


# -- drawing from a rule -----------------------------------------------------------------------------


def _numpy_drawer(rule, inst: Instance, seed: int):
    def draw(n, scheme, progress):
        rng = np.random.default_rng(seed)
        tokens = np.empty(n, dtype=np.int64)
        members = np.empty(n, dtype=bool)
        t, q = inst.target, inst.draft
        for i in range(n):
            d = scheme.sample(rng)
            try:
                out = rule(t.copy(), q.copy(), d.copy(), rng)
            except Exception as exc:
                raise _RuleFault(f"{_fault_text(exc)} on drafts {d.tolist()}") from None
            y = _token_of(out, inst.V)
            tokens[i], members[i] = y, y in d
            if progress is not None and (i + 1) % 4096 == 0:
                progress.update(4096)
        if progress is not None:
            progress.update(n % 4096)
        return tokens, members

    return draw


def _torch_drawer(rule, inst: Instance, seed: int):
    import torch

    import otm.torch as ot

    def draw(n, scheme, progress):
        gen = torch.Generator().manual_seed(seed)
        tokens, members = [], []
        done = 0
        while done < n:
            m = min(CHUNK, n - done)
            p = torch.tensor(inst.target, dtype=torch.float64)[None].expand(m, -1).contiguous()  # [m, V]
            q = torch.tensor(inst.draft, dtype=torch.float64)[None].expand(m, -1).contiguous()  # [m, V]
            d = ot.SAMPLERS[scheme.name](q, k=scheme.k, generator=gen)  # [m, k]
            try:
                out = rule(p, q, d, generator=gen)
            except Exception as exc:
                raise _RuleFault(_fault_text(exc)) from None
            y = getattr(out, "token", out)
            if not isinstance(y, torch.Tensor) or tuple(y.shape) != (m,):
                raise _RuleFault(f"returned {type(y).__name__} of shape {getattr(y, 'shape', '?')}, "
                                 f"not a token tensor [{m}]")
            y = y.to(torch.int64)
            if bool(((y < 0) | (y >= inst.V)).any()):
                raise _RuleFault(f"returned a token outside 0..{inst.V - 1}")
            tokens.append(y.cpu().numpy())
            members.append((d == y[:, None]).any(1).cpu().numpy())
            done += m
            if progress is not None:
                progress.update(m)
        return np.concatenate(tokens), np.concatenate(members)

    return draw


class _ProbeSkipped(Exception):
    """The boundary probe could not run the rule (said in the report's notes, never silently)."""


def _boundary_probe(rule, kind: str, inst: Instance, scheme, seed: int) -> str | None:
    """Run the rule with uniforms of exactly 0.0 on up to 8 draft tuples: a reason if it emits a token of zero
    target mass, else None. Raises :class:`_ProbeSkipped` when the probe cannot run the rule (a torch rule
    without ``uniforms``, or one that fails on the stub generator)."""
    target = inst.target
    if not (target == 0).any():
        return None
    tuples, probs = scheme.enumerate(MAX_TUPLES)
    order = np.argsort(-probs, kind="stable")[:8]
    if kind == "sampler":
        for tup in tuples[order]:
            try:
                y = _token_of(rule(target.copy(), inst.draft.copy(), tup.copy(), _ZeroUniforms(seed)), inst.V)
            except (_RuleFault, Exception) as exc:
                raise _ProbeSkipped(f"the rule failed on a generator whose random() is 0.0 ({_fault_text(exc)})") from None
            if target[y] == 0:
                return (f"emits token {y} of zero target mass when a uniform is exactly 0.0 (drafts {tup.tolist()}): "
                        "compare u < ratio with u in [0, 1), never u <= ratio (SGLang #35771)")
        return None
    import torch

    if "uniforms" not in inspect.signature(rule).parameters:
        raise _ProbeSkipped("the torch rule takes no uniforms= argument")
    d = torch.as_tensor(tuples[order], dtype=torch.int64)  # [m, k]
    m = d.shape[0]
    p = torch.tensor(target, dtype=torch.float64)[None].expand(m, -1).contiguous()
    q = torch.tensor(inst.draft, dtype=torch.float64)[None].expand(m, -1).contiguous()
    try:
        out = rule(p, q, d, uniforms=torch.zeros((m, d.shape[1] + 1), dtype=torch.float64))
    except Exception as exc:
        raise _ProbeSkipped(f"the rule refused uniforms of shape [n, k + 1] ({_fault_text(exc)})") from None
    y = getattr(out, "token", out)
    bad = [int(t) for t in y.tolist() if 0 <= int(t) < inst.V and target[int(t)] == 0]
    if bad:
        return (f"emits token {bad[0]} of zero target mass with uniforms of exactly 0.0: compare u < ratio with "
                "u in [0, 1), never u <= ratio (SGLang #35771)")
    return None


# -- the bank ----------------------------------------------------------------------------------------


def _instances(scheme_name: str, k: int, target, draft) -> tuple[list[tuple[Instance, object]], list[str]]:
    """``[(instance, scheme)]`` of the bank (or the one given pair) and notes on the skipped ones."""
    if target is not None or draft is not None:
        if target is None or draft is None:
            raise OtmError("give both --target and --draft to check one case, or neither for the whole bank")
        t = check_law(target, "target")
        q = check_law(draft, "draft", size=t.size)
        scheme = build_scheme(scheme_name, q, k)  # bad input here is the user's: let the OtmError through
        scheme.enumerate(MAX_TUPLES)
        return [(Instance("given", t, q), scheme)], []
    chosen, skipped = [], []
    for inst in fixed_bank():
        try:
            scheme = build_scheme(scheme_name, inst.draft, k)
            if scheme.n_tuples() > MAX_TUPLES:
                raise OtmError(f"{scheme.n_tuples():,} draft tuples > {MAX_TUPLES:,}")
        except OtmError as exc:
            skipped.append(f"{inst.name}: {str(exc).split(':')[0]}")
            continue
        chosen.append((inst, scheme))
    return chosen, skipped


def _max_hypothesis_V(scheme_name: str, k: int) -> int:
    V = 2
    while V < 6 and (V + 1) ** k <= MAX_TUPLES:
        V += 1
    return max(V, k if scheme_name in ("without_replacement", "top", "greedy") else 2)


def _hypothesis_search(rule, scheme_name: str, k: int, examples: int, seed: int) -> Case | None:
    """The smallest counterexample hypothesis finds, or None.

    Vocabulary sizes are searched in increasing order (``examples`` split evenly, at least 20 each),
    so the first counterexample has the fewest tokens; hypothesis then shrinks its masses.
    """
    from hypothesis import HealthCheck, Phase, find, settings
    from hypothesis.errors import NoSuchExample, Unsatisfiable

    max_V = _max_hypothesis_V(scheme_name, k)
    sizes = range(2, max_V + 1)

    def fails(pair) -> bool:
        target, draft = pair
        try:
            scheme = build_scheme(scheme_name, draft, k)
        except OtmError:
            return False
        if scheme.n_tuples() > MAX_TUPLES:
            return False
        return not _exact_case(rule, Instance("hypothesis", target, draft), scheme_name, k, scheme).passed

    per_size = max(20, examples // len(sizes))
    config = settings(max_examples=per_size, database=None, deadline=None, suppress_health_check=list(HealthCheck),
                      phases=[Phase.generate, Phase.shrink])
    for V in sizes:
        try:
            target, draft = find(pairs(V, V), fails, settings=config, random=random.Random(seed * 101 + V))
        except (NoSuchExample, Unsatisfiable):
            continue
        return _exact_case(rule, Instance(f"hypothesis (shrunk) V={V}", target, draft), scheme_name, k)
    return None


# -- certify -----------------------------------------------------------------------------------------


def _command(name: str, kind: str, scheme: str, k: int, case: Case | None, tv: float, seed: int) -> str:
    cmd = f"otm certify {name} --kind {kind} --scheme {scheme} -k {k}"
    if case is not None and case.target is not None:
        cmd += f" --target {law_text(case.target)} --draft {law_text(case.draft)}"
    if kind in ("sampler", "torch"):
        cmd += f" --tv {tv:g} --seed {seed}"
    return cmd


def certify(
    rule: Callable,
    *,
    kind: str,
    scheme: str = "iid",
    k: int = 2,
    tv: float | None = None,
    alpha: float = DEFAULT_ALPHA,
    seed: int = 0,
    target=None,
    draft=None,
    examples: int = HYPOTHESIS_EXAMPLES,
    progress: bool = False,
    name: str | None = None,
    **decoder_options,
) -> Report:
    """Prove ``rule`` exact for ``scheme`` with ``k`` drafts, or refute it with a counterexample.

    Parameters
    ----------
    rule : callable in the form ``kind`` (module docstring; ``decoder``: a torch verifier run inside
        :func:`otm.decode.speculative_decode`, see :func:`otm.certify.decoder.certify_decoder`).
    kind : ``"law"``, ``"sampler"``, ``"torch"`` or ``"decoder"``.
    scheme : how the drafts are drawn: one of :data:`otm.certify.bank.CERTIFY_SCHEMES`.
    k : drafts per position, >= 1.
    tv : statistical kinds: the total variation detected with power >= 0.99 on every case (default
        :data:`DEFAULT_TV`; 0.05 for ``decoder``, whose runs cost milliseconds each).
    alpha : statistical kinds: family-wise level (chance of refuting a valid rule).
    seed : randomness of the draws and of the hypothesis search.
    target, draft : check this one pair instead of the bank (what ``Report.command`` re-runs).
    examples : law kind: random pairs the hypothesis search tries (0: fixed bank only).
    progress : show a progress bar (tqdm, on stderr).
    name : how the rule is named in the report and its command (default ``module:qualname``).

    Returns
    -------
    Report : ``certified``, every case, the worst case and a command that re-checks it.
    """
    if kind not in KINDS:
        raise OtmError(f"unknown kind {kind!r}: choose one of {', '.join(KINDS)}")
    if kind == "decoder" and _is_tree_rule(rule):  # a decoder rule by name, or a whole-tree rule (TreeRule)
        from .decoder import DEFAULT_DECODER_TV, certify_decoder

        k = check_k(k)
        if isinstance(rule, type):
            rule = rule()
        return certify_decoder(rule, scheme=scheme, k=k, tv=DEFAULT_DECODER_TV if tv is None else tv, alpha=alpha,
                               seed=seed, progress=progress, name=name, **decoder_options)
    if not callable(rule):
        raise OtmError(f"the rule must be callable, got {type(rule).__name__}")
    k = check_k(k)
    check_signature(rule, kind)
    name = name or rule_name(rule)
    if kind == "decoder":
        from .decoder import DEFAULT_DECODER_TV, certify_decoder

        return certify_decoder(rule, scheme=scheme, k=k, tv=DEFAULT_DECODER_TV if tv is None else tv, alpha=alpha,
                               seed=seed, progress=progress, name=name, **decoder_options)
    tv = DEFAULT_TV if tv is None else tv
    if decoder_options:
        raise OtmError(f"options {', '.join(sorted(decoder_options))} apply to --kind decoder only")
    if scheme not in CERTIFY_SCHEMES:
        raise OtmError(f"unknown scheme {scheme!r}: choose one of {', '.join(CERTIFY_SCHEMES)}")
    if not 0 < alpha < 1:
        raise OtmError(f"alpha must lie in (0, 1), got {alpha!r}")
    if isinstance(examples, bool) or not isinstance(examples, int) or examples < 0:
        raise OtmError(f"examples must be a whole number >= 0, got {examples!r}")
    start = time.perf_counter()
    chosen, skipped = _instances(scheme, k, target, draft)
    if not chosen:
        raise OtmError(f"no case of the bank can be built for the {scheme} scheme with k = {k} "
                       f"({'; '.join(skipped)}): lower k")
    notes = [f"skipped {s}" for s in skipped]
    cases: list[Case] = []
    from ..progress import bar as tqdm  # a live bar on a terminal, plain lines elsewhere

    if kind == "law":
        bar = tqdm(total=len(chosen) + (1 if examples and target is None else 0), desc="certify (exact)",
                   unit="case", disable=not progress, leave=False, file=sys.stderr)
        for inst, sch in chosen:
            cases.append(_exact_case(rule, inst, scheme, k, sch))
            bar.update(1)
        if examples and target is None:
            found = _hypothesis_search(rule, scheme, k, examples, seed)
            bar.update(1)
            if found is not None:
                cases.append(found)
            notes.append(f"hypothesis search: {examples} random pairs (V <= {_max_hypothesis_V(scheme, k)}), "
                         + ("counterexample shrunk to its smallest form" if found else "no counterexample"))
        bar.close()
        tuples = sum(sch.n_tuples() for _, sch in chosen)
        method = (f"exact: every draft tuple enumerated ({tuples:,} tuples over {len(chosen)} fixed cases"
                  + (f" and a hypothesis search of {examples} pairs" if examples and target is None else "")
                  + f"); certified when max |out - target| <= {LAW_TOLERANCE:g} on every case")
        failing = [c for c in cases if not c.passed]
        worst = (max(failing, key=lambda c: c.law_error) if failing
                 else max(cases, key=lambda c: c.law_error))
        report = Report(name, kind, scheme, k, not failing, cases, worst, method, notes=notes)
    else:
        level = alpha / (2 * len(chosen))
        sizes = [draws_for(inst.target, tv, level) for inst, _ in chosen]
        bar = tqdm(total=sum(sizes), desc=f"certify ({kind})", unit="draw", unit_scale=True,
                   disable=not progress, leave=False, file=sys.stderr)
        for i, (inst, sch) in enumerate(chosen):
            case_seed = seed * 1_000_003 + i
            drawer = _numpy_drawer if kind == "sampler" else _torch_drawer
            case = _statistical_case(drawer(rule, inst, case_seed), inst, scheme, k, tv=tv, level=level,
                                     scheme=sch, progress=bar)
            try:
                boundary = _boundary_probe(rule, kind, inst, sch, case_seed)
            except _ProbeSkipped as skipped:
                boundary = None
                if not any(n.startswith("boundary probe not run") for n in notes):
                    notes.append(f"boundary probe not run: {skipped}")
            if boundary:
                case.passed = False
                case.reason = f"{case.reason}; {boundary}" if case.reason else boundary
            cases.append(case)
        bar.close()
        method = (f"statistical: {sum(sizes):,} draws over {len(chosen)} cases ({min(sizes):,}-{max(sizes):,} per "
                  f"case); Pearson chi-square of the output token against the target at level {level:.2g} per "
                  f"case (alpha {alpha:g} / 2 x {len(chosen)} cases, Bonferroni); draws from the noncentral "
                  f"chi-square so that every output law at TV >= {tv:g} from the target (on the merged cells: "
                  f"tokens expected < {MIN_EXPECTED:g} times pooled) is detected with power >= {POWER}; an "
                  "acceptance above alpha* beyond its interval at the same level, or a zero-mass token under "
                  "uniforms of exactly 0.0, also refutes")
        failing = [c for c in cases if not c.passed]
        pool = failing or cases
        worst = min(pool, key=lambda c: (c.pvalue if c.pvalue is not None else -1.0))
        report = Report(name, kind, scheme, k, not failing, cases, worst, method, alpha=alpha, detectable_tv=tv,
                        notes=notes)
    report.seconds = time.perf_counter() - start
    report.command = _command(name, kind, scheme, k, report.worst, tv, seed)
    return report
