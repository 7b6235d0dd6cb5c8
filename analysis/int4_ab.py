"""The embedded target on its GGUF's 4-bit blocks (``--compile int4``) against oneDNN's bfloat16 GEMM: the cost
of a decoder call, and how far each model's laws lie from the float32 copy's.

1. Costs: T(1), T(3), T(5), T(9) (the decoder's target call after a 200-token context) on two copies of the target,
   one on oneDNN (``--compile onednn``), one on the 4-bit blocks, calls interleaved; medians of ``--rounds`` - 3.
2. Laws: the target samples ``--tokens`` tokens after each of 3 prompts at temperature 1 (float32, seed 0); at every
   sampled position the total variation between the float32 copy's law and that of the bfloat16 model, the 4-bit
   blocks in bfloat16 and the 4-bit blocks in float32 (inputs rounded to bfloat16 for the kernel).

    PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python analysis/int4_ab.py [--rounds 15] [--tokens 120]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

PROMPTS = ("Write a short story about a lighthouse keeper.", "Explain how vaccines work.",
           "What are good habits for studying?")


def interleaved_calls(runners: dict, context: list[int], sizes, rounds: int) -> dict[tuple[str, int], list[float]]:
    """ms of each runner's call on n positions (a chain after ``context``, whose last token is the root; every
    runner already fed ``context[:-1]``), the runners' calls interleaved round by round, the first 3 rounds not
    counted: ``{(name, n): [ms, ...]}``."""
    from otm.decode.tree import DraftTree, tree_inputs

    times: dict[tuple[str, int], list[float]] = {}
    past = next(iter(runners.values())).length()
    for round_ in range(rounds):
        for n in sizes:
            tree = DraftTree.from_rows([context[-1:] * (n - 1)], context[-1]) if n > 1 else DraftTree.root_only(context[-1])
            for name, r in runners.items():
                ids, positions, mask = tree_inputs(tree, context[-1:], past, dtype=r.dtype, device=r.device)
                start = time.perf_counter()
                r.forward(ids, positions, mask, keep=tree.size)
                if round_ >= 3:
                    times.setdefault((name, n), []).append(1e3 * (time.perf_counter() - start))
                r.truncate(past)
    return times


def swapped_target(what: str, context: int):
    """The embedded target in bfloat16 on its GGUF's 4-bit blocks (the models of ``--compile int4-compiled``) and a
    context of ``context`` token ids, after printing the machine line with ``what``; freed memory kept."""
    from otm.decode.allocator import keep_freed_memory
    from otm.decode.models import load_pair
    from otm.decode.onednn import for_choice
    from otm.machine import machine

    keep_freed_memory()
    print(machine().line(what))
    target, _, tok = load_pair(dtype="bfloat16")
    for_choice("int4-compiled", target)
    return target, tok("The quick brown fox jumps over the lazy dog. " * 400)["input_ids"][:context]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--tokens", type=int, default=120)
    args = ap.parse_args()
    torch.set_num_threads(1)
    from otm.decode.allocator import keep_freed_memory
    from otm.decode.int4 import use_int4
    from otm.decode.models import load_pair
    from otm.decode.onednn import use_onednn
    from otm.decode.runner import Runner
    from otm.machine import machine

    keep_freed_memory()
    print(machine().line("eager step; oneDNN's bfloat16 GEMM against the GGUF's 4-bit blocks"))
    t32, _, tok = load_pair(dtype="float32")
    dense = copy.deepcopy(t32).to(torch.bfloat16)
    four = copy.deepcopy(t32).to(torch.bfloat16)
    four32 = copy.deepcopy(t32)
    use_int4(four)
    use_int4(four32)
    use_onednn(dense)
    use_onednn(four)  # the head and norms as --compile int4 runs them
    context = tok("The quick brown fox jumps over the lazy dog. " * 20)["input_ids"][:200]
    with torch.inference_mode():
        runners = {"oneDNN bfloat16": Runner(dense, "target"), "4-bit blocks": Runner(four, "target")}
        for r in runners.values():
            r.feed(context[:-1])
        times = interleaved_calls(runners, context, (1, 3, 5, 9), args.rounds)
    for n in (1, 3, 5, 9):
        print(f"T({n}) median ms: " + ", ".join(f"{name} {statistics.median(times[(name, n)]):.2f}" for name in runners))
    torch.manual_seed(0)
    tv: dict[str, list[torch.Tensor]] = {"bfloat16 weights": [], "4-bit blocks, bfloat16": [], "4-bit blocks, float32": []}
    with torch.inference_mode():
        for prompt in PROMPTS:
            ids = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                          return_tensors="pt")
            ids = ids["input_ids"] if hasattr(ids, "keys") else ids
            out = t32.generate(ids, do_sample=True, max_new_tokens=args.tokens, temperature=1.0, top_k=0, top_p=1.0)
            n0 = ids.shape[1]
            ref = torch.softmax(t32(out).logits[0, n0 - 1 : -1].double(), -1)
            for name, model in zip(tv, (dense, four, four32)):
                law = torch.softmax(model(out).logits[0, n0 - 1 : -1].double(), -1)
                tv[name].append(0.5 * (law - ref).abs().sum(-1))
    for name, parts in tv.items():
        v = torch.cat(parts)
        print(f"{name}: total variation to the float32 copy's law, mean {v.mean():.4f}, median {v.median():.4f}, "
              f"90th percentile {v.quantile(0.9):.4f}, max {v.max():.4f} ({len(v)} positions)")


if __name__ == "__main__":
    main()
