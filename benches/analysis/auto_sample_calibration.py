"""Can a data sample rank the graph compositions the way the full index does? (issue 31, item 3)

For each preset, the composition its plan gives at full scale (layout, PQ bytes or code
shape, navigation sample, entry clusters, the cache's share of the vectors and its policy)
is built on a random sample of the data, searched with 200 held-out data vectors against
exact ground truth in the sample, and scored by QPS (2 threads, median of 3 timed passes
over the queries repeated 5 times) at the first L of a grid whose recall@10 reaches 0.95.

    python benches/analysis/auto_sample_calibration.py BASE.fbin BUDGET_FRACTION SAMPLE [OUT.json]
"""
import json
import sys
import time

import numpy as np
import nearline
from nearline import datasets

data, budget, s = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
base = nearline.read_vectors(data)
n, dim = base.shape
rng = np.random.default_rng(0)
perm = rng.permutation(n)
sample = np.ascontiguousarray(base[perm[:s]])
qs = np.ascontiguousarray(base[perm[s:s + 200]])
gt, _ = datasets.compute_ground_truth(sample, qs, 10, "l2", 2)
target = 0.95
out = {}
for preset in ("gorgeous", "alayalaser", "starling", "diskann"):
    try:
        full = nearline.plan(base, preset=preset, memory_budget=budget)
    except ValueError as e:
        out[preset] = f"refused: {e}"; continue
    p, mem = full["plan"], full["memory"]
    bo = dict(preset=preset, layout=p["layout"], nav_sample=p["nav_sample"], entry_clusters=p["entry_clusters"],
              threads=2, overwrite=True)
    if p["layout"] != "coded":
        bo["pq_bytes"] = p["pq_bytes"]
    else:
        bo["principal_dims"], bo["code_bits"] = p["code_dims"], p["code_bits"]
    if p.get("adjacency"):
        bo["adjacency"] = True
    frac = mem["cache_nodes"] / n
    path = f"/tmp/nearline-calib-{preset}"
    t0 = time.time()
    nearline.build(sample, path, **bo).close()
    bt = time.time() - t0
    ob = s * (dim * 4 + 4 * p["R"] + 64) + (8 << 20)
    with nearline.open(path, memory_budget=ob, cache_nodes=int(round(frac * s)), cache=mem["cache_policy"]) as ix:
        res = None
        for L in (10, 15, 20, 30, 40, 60, 80, 120, 160, 240):
            ids, _ = ix.search(qs, k=10, L=L)
            r = nearline.recall(ids, gt, 10)
            if r >= target:
                qq = np.tile(qs, (5, 1))
                ts = []
                for _ in range(3):
                    t = time.perf_counter(); _, _, st = ix.search(qq, k=10, L=L, return_stats=True); ts.append(time.perf_counter() - t)
                res = dict(L=L, recall=r, qps=len(qq) / float(np.median(ts)), reads=float(st["reads"].mean()), build_s=bt,
                           cache_nodes=int(round(frac * s)), cache=mem["cache_policy"], pq=bo.get("pq_bytes"))
                break
        out[preset] = res
    print(preset, out[preset], flush=True)
print(json.dumps(out))
if len(sys.argv) > 4:
    with open(sys.argv[4], "w") as f:
        json.dump({"data": data, "budget": budget, "sample": s, "n": n, "dim": dim, "target": target, "scores": out}, f, indent=1)
