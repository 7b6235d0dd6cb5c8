"""Summarise the layer sweep (jsonl lines of layer_sweep.py) into markdown tables."""
import json, sys
from collections import defaultdict
seen = {}
for f in sys.argv[1:]:
    for l in open(f):
        if l.strip():
            r = json.loads(l)
            seen[(r["V"], r["k"], r["L"], r["scheme"], r["T"], r["seed"])] = r
rows = list(seen.values())
RULES = ["layer:optimal", "level:optimal", "layer:kseq", "level:kseq", "layer:rrs", "level:rrs", "traversal", "layer:optimal_wor", "level:optimal_wor"]
groups = defaultdict(list)
for r in rows:
    groups[(r["V"], r["k"], r["L"], r["scheme"])].append(r)
present = [x for x in RULES if any(x in r for r in rows)]
print("| V | k | L | scheme | cases | LP (mean) | " + " | ".join(present) + " |")
print("|---|---|---|---|---|---|" + "---|" * len(present))
worst = {}
for key, rs in sorted(groups.items(), key=lambda kv: (kv[0][3], kv[0][2], kv[0][1], kv[0][0])):
    cells = []
    for x in present:
        rat = [r[x] / r["lp"] for r in rs if x in r]
        cells.append(f"{sum(rat)/len(rat):.4f} ({min(rat):.4f})" if rat else "-")
    lp = sum(r["lp"] for r in rs) / len(rs)
    print(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {len(rs)} | {lp:.4f} | " + " | ".join(cells) + " |")
print()
# facts
over = max(r[x] - r["lp"] for r in rows for x in present if x in r)
print(f"largest rule - LP over all cases and rules: {over:.2e}")
for step in ("optimal", "kseq", "rrs", "optimal_wor"):
    a, b = f"layer:{step}", f"level:{step}"
    d = [r[a] - r[b] for r in rows if a in r]
    if d:
        deep = [r[a] - r[b] for r in rows if a in r and r["L"] > 1]
        print(f"layer - level ({step}): min {min(d):.2e}, max {max(d):.4f}; L>1: min {min(deep) if deep else float('nan'):.2e}, strictly above in {sum(x > 1e-12 for x in deep)}/{len(deep)}")
d = [abs(r["layer:rrs"] - r["traversal"]) for r in rows]
print(f"|layer:rrs - traversal| max {max(d):.2e} over {len(d)} cases")
eq = [r for r in rows if r["L"] > 1 and abs(r["layer:optimal"] - r["lp"]) < 1e-9]
deep = [r for r in rows if r["L"] > 1 and r["scheme"] == "iid"]
print(f"layer:optimal = LP (1e-9) at L>1, iid: {sum(abs(r['layer:optimal']-r['lp'])<1e-9 for r in deep)}/{len(deep)}; ratio min {min(r['layer:optimal']/r['lp'] for r in deep):.4f}")
l1 = [r for r in rows if r["L"] == 1 and r["scheme"] == "iid"]
if l1:
    print(f"L=1 iid: |layer:optimal - LP| max {max(abs(r['layer:optimal']-r['lp']) for r in l1):.2e} over {len(l1)}")
tv = [(r["layer:optimal"] - r["traversal"]) for r in rows if r["L"] > 1]
print(f"layer:optimal - traversal at L>1: min {min(tv):.4f} max {max(tv):.4f}, above in {sum(x>1e-12 for x in tv)}/{len(tv)}")
ks = [(r["layer:optimal"] - r["layer:kseq"]) for r in rows if r["L"] > 1]
print(f"layer:optimal - layer:kseq at L>1: min {min(ks):.4f}, above in {sum(x>1e-12 for x in ks)}/{len(ks)}")
print(f"dual-value max |{max(abs(r['dual']-r['lp']) for r in rows):.1e}|, tree mass min {min(r['mass'] for r in rows):.15f}")
