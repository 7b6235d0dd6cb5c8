"""Brute force: which realisable selection rule reaches alpha* for drafts WITHOUT replacement?

Canonical form (otm.verifiers.optimal): select one drafted token with an exactly known law x, then
single-draft SD from x to the target p; acceptance sum_y min(x(y), p(y)); the best x over the base
polytope of the coverage polymatroid f(A) = P(draft set meets A) gives alpha*. For drafts without
replacement (successive sampling) this script computes, by exact enumeration at small V:

* f on all 2^V subsets, the lexicographically optimal base x* of f w.r.t. p (decomposition
  algorithm, brute force over subsets, finest chain of tight sets), its layers, whether the layers
  are consecutive in the ratio p/q order, whether x* equals the isotonic regression of the
  ratio-priority vertex's slopes (as for iid drafts), and sum min(x*, p) against alpha*;
* the gap alpha* - sum min(x, p) of candidate rules with exactly computable law x:
  - ``ratio``: select the drafted token of highest p/q (a vertex of the base polytope);
  - ``layer_first``: layers of x* in order; in the first occupied layer the earliest draw;
  - ``layer_mix2``: layers of x*; in a layer a random mixture of the ratio order and its reverse,
    the mixing weight per layer chosen (exactly, over the breakpoints) to maximise the acceptance;
  - ``layer_luce``: layers of x*; in a layer a Luce (softmax) choice among the layer's drafts with
    weights fitted by Newton's method on the convex dual (law(theta) = grad Phi(theta)).
  - ``sequential``: tokens in descending ratio; the best remaining drafted token is accepted with
    a_j = min(1, p_j / avail_j), else the next; the residual after all (not canonical form; loop
    acceptance reported).

Usage: ``python analysis/research/wor_selection_search.py [--cases 600] [--seed 0] [--luce]``

Findings (``--cases 3000 --luce``, seeds 0 and 1: 2480 + 2497 valid cases, V = 3..8, k = 2..4, five
families: Dirichlet(0.1/0.3/1/3) pairs, peaked logits, 30% zero target, one 1e-9 target and one
1e-10 draft mass, close laws; 20 s each on a loaded 2-core machine, load average 3.1):

* x* = the isotonic (increasing, weights p) regression of the ratio-priority vertex's slopes, as for
  iid drafts: max |difference| to the brute-force lexicographically optimal base 7.9e-14; its
  acceptance sum min(x*, p) equals alpha* (worst gap 2.0e-13). The layers were consecutive in the
  ratio order in every case but 12 + 6 flagged, all with a token of mass ~1e-23 whose f-increment
  is lost in the 1 - Q rounding (artefacts of the check, not of x*);
* ``layer_luce`` reached alpha* in every case (worst gap 2.0e-13): EXACTLY optimal;
* ``ratio``: exact in 217-218 cases (9%), worst acceptance/alpha* 1e-6 (unbounded loss: a tiny
  high-ratio token that is almost always drafted takes the selection);
* ``layer_first``: exact in 539-590, worst ratio 2e-5; ``layer_mix2``: exact in 704-742, worst 3e-6;
* ``sequential`` (not canonical form; exact output law, error 2e-13): exact in 1223-1299 (~50%),
  worst acceptance/alpha* 0.924 (gap 0.074).

Attack (``--attack 150 --seed 3``: 339 Nelder-Mead runs on the logits, 300 evaluations each, V = 3..6,
k = 2..3): largest gap of the verifier ``optimal_without_replacement`` (layered Luce, Newton fit) to
the brute-force alpha* 1.3e-13; smallest sequential acceptance/alpha* 0.913. Exact ratio ties (ratios
drawn from {0.5, 1, 2}, p = q, swapped pairs; 400 cases): largest Luce gap 4.6e-14.
"""

from __future__ import annotations

import argparse
import itertools
import time

import numpy as np
from scipy.special import softmax

from otm.optimum import brute_force_optimum, ratio_order
from otm.schemes import WithoutReplacement


def subset_Q(tuples, probs, V):
    """Q[mask] = P(all drafts in mask), by the zeta transform over bitmasks."""
    masks = np.bitwise_or.reduce(np.left_shift(np.int64(1), tuples), axis=1)
    Q = np.bincount(masks, weights=probs, minlength=1 << V).astype(np.float64)
    for bit in range(V):
        view = Q.reshape(-1, 2, 1 << bit)
        view[:, 1, :] += view[:, 0, :]
    return Q


def lex_opt_base(f, p, V, tol=1e-13):
    """Lexicographically optimal base of f w.r.t. weights p; returns x, layers (list of token lists), lambdas.

    Each step: over nonempty B of the remaining positive-p tokens, minimise (f(D|B) - f(D)) / p(B);
    take an inclusion-minimal minimiser (a finest chain of tight sets). Zero-p tokens go last, in a
    ratio-priority vertex of the contraction.
    """
    full = (1 << V) - 1
    pmask = np.array([1 << i for i in range(V)])
    psum = np.zeros(1 << V)
    for m in range(1 << V):
        psum[m] = sum(p[i] for i in range(V) if m >> i & 1)
    x = np.zeros(V)
    D = 0
    layers, lams = [], []
    remaining = sum(1 << i for i in range(V) if p[i] > 0)
    while remaining:
        best, cand = np.inf, []
        sub = remaining
        B = sub
        while B:
            r = (f[D | B] - f[D]) / psum[B]
            if r < best - tol:
                best, cand = r, [B]
            elif r <= best + tol:
                cand.append(B)
            B = (B - 1) & sub
        # inclusion-minimal among candidates
        cand.sort(key=lambda m: bin(m).count("1"))
        B = cand[0]
        toks = [i for i in range(V) if B >> i & 1]
        lam = (f[D | B] - f[D]) / psum[B]
        x[toks] = lam * p[toks]
        layers.append(toks)
        lams.append(lam)
        D |= B
        remaining &= ~B
    zero = [i for i in range(V) if not (D >> i & 1)]
    if zero:
        layers.append(zero)
        lams.append(np.inf)
        for i in zero:  # vertex of the contraction in index order (acceptance ignores them)
            x[i] = f[D | (1 << i)] - f[D]
            D |= 1 << i
    return x, layers, lams


def isotonic_from_vertex(f, p, q, V):
    """optimal.py's construction: slopes of the ratio-priority vertex, isotonic (increasing) in p-weights."""
    from scipy.optimize import isotonic_regression

    order = ratio_order(p, q)[::-1]  # descending ratio
    D = 0
    v = np.zeros(V)
    for t in order:
        v[t] = f[D | (1 << t)] - f[D]
        D |= 1 << t
    pos = [t for t in order if p[t] > 0]
    iso = isotonic_regression(v[pos] / p[pos], weights=p[pos], increasing=True).x
    x = v.copy()
    x[pos] = iso * p[pos]
    return x, v


def acc(x, p):
    return float(np.minimum(x, p).sum())


def rule_layer_first(tuples, probs, layer_of, V):
    x = np.zeros(V)
    for t, pr in zip(tuples, probs):
        lay = layer_of[t]
        j = int(np.argmin(lay))  # first position in the lowest layer (argmin takes the first)
        x[t[j]] += pr
    return x


def vertex_law(order, f, D0=0):
    """Selection law of a priority order (restricted to the tokens listed) after the set D0."""
    out = {}
    D = D0
    for t in order:
        out[t] = f[D | (1 << t)] - f[D]
        D |= 1 << t
    return out


def best_mix(u, v, pp):
    """max over w in [0,1] of sum min((1-w) u + w v, pp); concave piecewise linear: check breakpoints."""
    ws = [0.0, 1.0]
    d = v - u
    for i in range(u.size):
        if abs(d[i]) > 0:
            w = (pp[i] - u[i]) / d[i]
            if 0 < w < 1:
                ws.append(w)
    vals = [np.minimum((1 - w) * u + w * v, pp).sum() for w in ws]
    i = int(np.argmax(vals))
    return ws[i], vals[i]


def rule_layer_mix2(layers, f, p, q, V):
    x = np.zeros(V)
    D = 0
    for toks in layers:
        r = np.array([p[t] / q[t] if q[t] > 0 else np.inf for t in toks])
        o = [toks[i] for i in np.argsort(-r, kind="stable")]
        a = vertex_law(o, f, D)
        b = vertex_law(o[::-1], f, D)
        u = np.array([a[t] for t in toks])
        v = np.array([b[t] for t in toks])
        w, _ = best_mix(u, v, p[toks])
        x[toks] = (1 - w) * u + w * v
        for t in toks:
            D |= 1 << t
    return x


def rule_layer_luce(tuples, probs, layers, x_star, V, iters=60):
    """Priority across layers; Luce inside the first occupied layer, weights by Newton on the dual."""
    layer_of = np.empty(V, dtype=int)
    for i, toks in enumerate(layers):
        layer_of[toks] = i
    theta = np.zeros(V)
    lay_t = layer_of[tuples]  # [n, k]
    first = lay_t.min(axis=1)
    inlayer = lay_t == first[:, None]  # [n, k] drafts in the first occupied layer

    def law_and_hess(th, which):
        rows = first == which
        T = tuples[rows]
        P = probs[rows]
        m = inlayer[rows]
        s = softmax(np.where(m, th[T], -np.inf), axis=1)  # [n, k] choice probs
        x = np.zeros(V)
        np.add.at(x, T.ravel(), (P[:, None] * s).ravel())
        H = np.zeros((V, V))
        for j in range(T.shape[1]):
            np.add.at(H, (T[:, j], T[:, j]), P * s[:, j])
            for l in range(T.shape[1]):
                np.add.at(H, (T[:, j], T[:, l]), -P * s[:, j] * s[:, l])
        return x, H

    x = np.zeros(V)
    for i, toks in enumerate(layers):
        toks = list(toks)
        if len(toks) == 1:
            xi, _ = law_and_hess(theta, i)
            x[toks] = xi[toks]
            continue
        tgt = x_star[toks]
        for _ in range(iters):
            xi, H = law_and_hess(theta, i)
            g = xi[toks] - tgt
            if np.abs(g).max() < 1e-15:
                break
            Hs = H[np.ix_(toks, toks)]
            # fix the first token's weight (the law is invariant to a common shift)
            step = np.zeros(len(toks))
            step[1:] = np.linalg.lstsq(Hs[1:, 1:], -g[1:], rcond=None)[0]
            # damped: halve until the dual objective's gradient norm falls
            tt = 1.0
            for _ in range(30):
                th2 = theta.copy()
                th2[toks] += tt * step
                x2, _ = law_and_hess(th2, i)
                if np.abs(x2[toks] - tgt).sum() < np.abs(g).sum():
                    break
                tt /= 2
            theta = th2
        xi, _ = law_and_hess(theta, i)
        x[toks] = xi[toks]
    return x, theta


def rule_sequential(tuples, probs, p, q, V):
    """Sequential acceptance in descending ratio: returns loop acceptance and output-law error."""
    order = ratio_order(p, q)[::-1]
    rank = np.empty(V, dtype=int)
    rank[order] = np.arange(V)
    a = np.zeros(V)
    # avail_j = E[1{j in S} prod_{z in S, rank z < rank j} (1 - a_z)]
    srt = np.argsort(rank[tuples], axis=1)
    T = np.take_along_axis(tuples, srt, 1)  # drafts of each tuple in priority order
    for j in order:
        hit = (T == j)
        rows = hit.any(axis=1)
        pos = np.argmax(hit[rows], axis=1)
        Tr = T[rows]
        surv = np.ones(rows.sum())
        for c in range(T.shape[1]):
            before = c < pos
            surv *= np.where(before, 1.0 - a[Tr[:, c]], 1.0)
        avail = float((probs[rows] * surv).sum())
        a[j] = min(1.0, p[j] / avail) if avail > 0 else 0.0
    # exact output law
    out = np.zeros(V)
    member = 0.0
    y = np.zeros(V)
    for t, pr in zip(T, probs):
        s = 1.0
        for z in t:
            y[z] += pr * s * a[z]
            s *= 1.0 - a[z]
    loop = y.sum()
    res = np.maximum(p - y, 0.0)
    res = res / res.sum() if res.sum() > 0 else p
    for t, pr in zip(T, probs):
        s = 1.0
        for z in t:
            out[z] += pr * s * a[z]
            s *= 1.0 - a[z]
        out += pr * s * res
        member += pr * (1 - s) + pr * s * res[t].sum()
    return loop, member, float(np.abs(out - p).max())


def laws(rng, V):
    fam = rng.integers(0, 5)
    a = rng.choice([0.1, 0.3, 1.0, 3.0])
    if fam == 0:
        p, q = rng.dirichlet(np.full(V, a)), rng.dirichlet(np.full(V, a))
    elif fam == 1:  # peaked: sharp logits
        z = rng.normal(size=V) * rng.uniform(1, 5)
        p, q = softmax(z), softmax(z + rng.normal(size=V) * rng.uniform(0.1, 2))
    elif fam == 2:  # zeros
        p, q = rng.dirichlet(np.full(V, a)), rng.dirichlet(np.full(V, a))
        p[rng.random(V) < 0.3] = 0
        if p.sum() == 0:
            p[0] = 1
    elif fam == 3:  # tiny masses
        p, q = rng.dirichlet(np.full(V, a)), rng.dirichlet(np.full(V, a))
        p[rng.integers(V)] = 1e-9
        q[rng.integers(V)] = 1e-10
    else:  # close laws
        p = rng.dirichlet(np.full(V, a))
        q = p * np.exp(rng.normal(size=V) * 0.3)
    return p / p.sum(), q / q.sum(), fam


def attack(seconds, seed):
    """Nelder-Mead on the logits of (p, q): maximise the layered Luce gap of the verifier
    ``optimal_without_replacement`` and minimise the sequential rule's acceptance / alpha*."""
    from scipy.optimize import minimize

    from otm.verifiers import optimal_without_replacement as ow

    rng = np.random.default_rng(seed)
    t_end = time.time() + seconds
    worst_gap, worst_seq = 0.0, 1.0
    runs = 0
    while time.time() < t_end:
        V, k = int(rng.integers(3, 7)), int(rng.integers(2, 4))
        if k >= V:
            continue

        def unpack(z):
            return softmax(z[:V]), softmax(z[V:])

        def luce_gap(z):
            p, q = unpack(z)
            sch = WithoutReplacement(q, k)
            return -(brute_force_optimum(sch, p) - ow.build(p, q, k).acceptance)

        def seq_ratio(z):
            p, q = unpack(z)
            sch = WithoutReplacement(q, k)
            tuples, probs = sch.enumerate()
            loop, member, _ = rule_sequential(tuples, probs, p, q, V)
            return member / brute_force_optimum(sch, p)

        z0 = rng.normal(size=2 * V) * rng.uniform(0.5, 4)
        r1 = minimize(luce_gap, z0, method="Nelder-Mead", options={"maxfev": 300})
        r2 = minimize(seq_ratio, z0, method="Nelder-Mead", options={"maxfev": 300})
        worst_gap = max(worst_gap, -r1.fun)
        worst_seq = min(worst_seq, r2.fun)
        runs += 1
    print(f"attack: {runs} Nelder-Mead runs (300 evaluations each, V 3..6, k 2..3): "
          f"largest layered-Luce gap {worst_gap:.3g}; smallest sequential acceptance/alpha* {worst_seq:.4f}")


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", type=int, default=600)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--luce", action="store_true", help="also fit layered Luce (slower)")
    ap.add_argument("--attack", type=float, default=0.0, help="seconds of Nelder-Mead attacks instead of the bank")
    args = ap.parse_args(argv)
    if args.attack:
        return attack(args.attack, args.seed)
    rng = np.random.default_rng(args.seed)
    names = ["x_star", "iso_vertex", "ratio", "layer_first", "layer_mix2", "sequential_loop", "sequential_member"]
    if args.luce:
        names.append("layer_luce")
    worst = {n: (0.0, None) for n in names}
    ratio_worst = {n: (1.0, None) for n in names}
    nonconsec = 0
    iso_diff_max = 0.0
    n_exact = {n: 0 for n in names}
    seq_law_err = 0.0
    t0 = time.time()
    total = 0
    for case in range(args.cases):
        V = int(rng.integers(3, 9))
        k = int(rng.integers(2, 5))
        p, q, fam = laws(rng, V)
        if np.count_nonzero(q > 0) < k + 1:
            continue
        total += 1
        sch = WithoutReplacement(q, k)
        tuples, probs = sch.enumerate()
        Q = subset_Q(tuples, probs, V)
        full = (1 << V) - 1
        f = 1.0 - Q[full ^ np.arange(1 << V)]
        alpha = brute_force_optimum(sch, p)
        xs, layers, lams = lex_opt_base(f, p, V)
        # layers consecutive in descending ratio?
        r = np.where(q > 0, p / np.where(q > 0, q, 1), np.inf)
        pos_layers = [l for l, lam in zip(layers, lams) if np.isfinite(lam)]
        for i in range(len(pos_layers)):
            for j in range(i + 1, len(pos_layers)):
                if min(r[pos_layers[i]]) < max(r[pos_layers[j]]) * (1 - 1e-12) and lams[j] > lams[i] * (1 + 1e-9):
                    nonconsec += 1
                    break
            else:
                continue
            break
        xi, vert = isotonic_from_vertex(f, p, q, V)
        iso_diff_max = max(iso_diff_max, float(np.abs(xi - xs)[p > 0].max()))
        layer_of = np.empty(V, dtype=int)
        for i, toks in enumerate(layers):
            layer_of[toks] = i
        vals = {
            "x_star": acc(xs, p),
            "iso_vertex": acc(xi, p),
            "ratio": acc(vert, p),
            "layer_first": acc(rule_layer_first(tuples, probs, layer_of, V), p),
            "layer_mix2": acc(rule_layer_mix2(layers, f, p, q, V), p),
        }
        loop, member, err = rule_sequential(tuples, probs, p, q, V)
        seq_law_err = max(seq_law_err, err)
        vals["sequential_loop"], vals["sequential_member"] = loop, member
        if args.luce:
            xl, _ = rule_layer_luce(tuples, probs, layers, xs, V)
            vals["layer_luce"] = acc(xl, p)
        for n, v in vals.items():
            gap = alpha - v
            if gap > worst[n][0]:
                worst[n] = (gap, (case, V, k, fam))
            if v / alpha < ratio_worst[n][0]:
                ratio_worst[n] = (v / alpha, (case, V, k, fam))
            n_exact[n] += gap < 1e-12
    print(f"{total} cases (V 3..8, k 2..4), {time.time() - t0:.1f}s")
    print(f"lex-opt layers NOT consecutive in the ratio order: {nonconsec}")
    print(f"max |isotonic(vertex slopes) - x*| on p>0 tokens: {iso_diff_max:.3g}")
    print(f"sequential rule max output-law error: {seq_law_err:.3g}")
    for n in names:
        print(f"{n:18s} exact(gap<1e-12) {n_exact[n]:4d}  worst gap {worst[n][0]:.3g} at {worst[n][1]}  "
              f"worst acc/alpha* {ratio_worst[n][0]:.6f} at {ratio_worst[n][1]}")


if __name__ == "__main__":
    main()
