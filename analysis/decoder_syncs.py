"""Host reads (device syncs on a GPU) per decoder step, by phase, for every decoder verifier.

Each verifier of ``otm.decode.decoder.VERIFIERS`` (both schemes; the token-level rules run level by level,
the rest are whole-tree rules of ``otm.decode.tree_registry``) decodes with ``count_host_reads=True``
(:mod:`otm.decode.host_reads`) on a tiny random-weight Llama pair (V = 64, 2 layers), with each target
rollback, the eager and the static step, and ``validate`` on and off; prints a markdown table of reads per
step by phase. ``--embedded`` adds the embedded pair (SmolLM2-135M target, its feature draft; a few
verifiers). The torch verifiers run their device path (``otm.torch._rho.FORCE_DEVICE_PATH``: what a GPU
runs; ``--host-path``: the CPU's own path, whose reads cost nothing on the CPU). Counting slows every torch
call: nothing here is timed.

    .venv/bin/python analysis/decoder_syncs.py                 # the tiny pair (~40 s)
    .venv/bin/python analysis/decoder_syncs.py --embedded      # and the embedded pair
"""

from __future__ import annotations

import argparse
import sys

import torch

from otm.decode.decoder import VERIFIERS, speculative_decode
from otm.decode.host_reads import PHASES
from otm.decode.tree_registry import TREE_RULES
from otm.laws import OtmError


def tiny_llama(seed: int, V: int = 64):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.5,
                      attn_implementation="sdpa", bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return LlamaForCausalLM(cfg).eval()


def runs(names=None):
    """(scheme, verifier, k) of every decoder verifier (chain-only rules with k = 1)."""
    for scheme, verifiers in VERIFIERS.items():
        for v in verifiers:
            if names and v not in names:
                continue
            chain = v == "speculative" or (v in TREE_RULES and TREE_RULES[v].chain_only)
            yield scheme, v, 1 if chain else 3


def per_step(target, draft, prompt, scheme, verifier, k, *, length=3, tokens=24, **kw) -> dict:
    s = speculative_decode(target, draft, prompt, k=k, length=length, verifier=verifier, scheme=scheme,
                           max_new_tokens=tokens, seed=0, count_host_reads=True, **kw).stats
    return {ph: s.host_reads.get(ph, 0) / s.steps for ph in PHASES} | {"steps": s.steps}


def table(target, draft, prompt, settings, names=None, **kw) -> list[str]:
    lines = ["| scheme | verifier | k | setting | " + " | ".join(PHASES) + " | per step (all but other) |",
             "|---|---|---|---|" + "---|" * (len(PHASES) + 1)]
    for scheme, v, k in runs(names):
        for label, opts in settings:
            try:
                r = per_step(target, draft, prompt, scheme, v, k, **opts, **kw)
            except OtmError as e:  # a rule that does not run on this pair (tree_lp needs toy LMs)
                lines.append(f"| {scheme} | {v} | {k} | {label} | {type(e).__name__}: {str(e)[:60]} |")
                continue
            cells = " | ".join(f"{r[ph]:.1f}" for ph in PHASES)
            lines.append(f"| {scheme} | {v} | {k} | {label} | {cells} | {sum(r[ph] for ph in PHASES if ph != 'other'):.1f} |")
        print(lines[-1], file=sys.stderr, flush=True)
    return lines


SETTINGS = [
    ("gather, eager, validate", dict(target_rollback="gather")),
    ("gather, eager", dict(target_rollback="gather", validate=False)),
    ("refeed, eager", dict(target_rollback="refeed", validate=False)),
    ("gather, static", dict(target_rollback="gather", static=True, validate=False)),
    ("refeed, static", dict(target_rollback="refeed", static=True, validate=False)),
]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--embedded", action="store_true", help="also the embedded pair (a few verifiers)")
    ap.add_argument("--verifiers", nargs="*", help="only these verifiers")
    ap.add_argument("--host-path", action="store_true", help="the verifiers' CPU path (default: their device path)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    from otm.torch import _rho

    _rho.FORCE_DEVICE_PATH = not args.host_path
    target, draft = tiny_llama(1), tiny_llama(2)
    path = "CPU host path" if args.host_path else "device path"
    print(f"tiny Llama pair (V = 64, 2 layers), L = 3, 24 tokens, seed 0, verifiers' {path}; reads per step:")
    print("\n".join(table(target, draft, [1, 2, 3], SETTINGS, args.verifiers)))
    if args.embedded:
        from otm.decode.models import load_pair

        pair = load_pair()
        t, d = pair[0], pair[1]
        print("\nembedded pair (SmolLM2-135M target, feature draft), L = 3, 24 tokens, seed 0; reads per step:")
        print("\n".join(table(t, d, [1, 2, 3], SETTINGS[1:2], args.verifiers or
                              ["kseq", "speculative", "rrs_without_replacement", "traversal", "block"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
