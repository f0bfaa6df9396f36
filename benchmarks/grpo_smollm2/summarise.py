"""Summary of compare.json: mean rewards, top-k and sampled loss ratios, per-trace wins, per-trace table."""
import json, os
rows = json.load(open(os.path.join(os.environ.get("E", "runs/exp7"), "compare.json")))
by = {}
for r in rows:
    by.setdefault(r["scorer"], {})[r["trace"]] = r
names = list(by)
traces = sorted(by[names[0]])
def pooled(name, key_ev):
    return sum(by[name][t][key_ev] for t in traces)
for n in names:
    d = by[n]
    m = lambda k: sum(d[t][k] for t in traces) / len(traces)
    ce_full = sum(d[t]["ce_full"] for t in traces)
    print(f"{n:8s} r_sample(12345) {m('r_sample_12345'):.4f} r_sample(777) {m('r_sample_777'):.4f} r_topk {m('r_topk'):.4f} "
          f"loss ratio topk {sum(d[t]['ce_topk'] for t in traces)/ce_full:.4f}")
a, b = names
for k in ("r_sample_12345", "r_sample_777", "r_topk"):
    diffs = [by[b][t][k] - by[a][t][k] for t in traces]
    wins = sum(x > 0 for x in diffs); losses = sum(x < 0 for x in diffs)
    print(f"{k}: {b} - {a} mean {sum(diffs)/len(diffs):+.4f}; {b} better on {wins}/{len(traces)}, worse on {losses}")
for t in traces:
    print(t[:34].ljust(34), " ".join(f"{by[n][t]['r_sample_12345']:+.4f}/{by[n][t]['r_sample_777']:+.4f}/{by[n][t]['r_topk']:+.4f}" for n in names))
for n in names:  # the sampled policy's loss ratio, pooled over traces (each trace's ratio is already pooled over G)
    f = sum(by[n][t]["ce_full"] for t in traces)
    print(n, "sampled loss ratio", *(f"seed {s}: {sum(by[n][t][f'lr_sample_{s}'] * by[n][t]['ce_full'] for t in traces) / f:.4f}"
                                      for s in (12345, 777)))
