"""Decompose a reads gap between nearline and diskannpy on one dataset.

Runs one simulated W=4 beam search (PQ routing, exact re-rank of the expanded
nodes, reads = expanded nodes) over {nearline graph, diskann graph} x
{nearline PQ, diskann PQ}, so graph quality and codebook quality separate.
Float32 L2 indexes with 4 KiB pages only (an analysis tool, not part of the
package).

    python benches/analysis/decompose_reads_gap.py DATA_DIR NEARLINE_INDEX DISKANN_INDEX [NQ] [L,L,...]

DATA_DIR holds the bench's base.fbin, queries.fbin and gt.bin (a `nearline
bench` workdir's data/<dataset>/ folder); DISKANN_INDEX is diskannpy's index
folder (files prefixed `ann_`).
"""
import json
import struct
import sys
import time

import numpy as np

if len(sys.argv) < 4:
    sys.exit(__doc__)
D, NL, DK = sys.argv[1], sys.argv[2], sys.argv[3]
sys.argv = [sys.argv[0]] + sys.argv[3:]
def fbin(p):
    n, d = np.fromfile(p, dtype=np.int32, count=2)
    return np.memmap(p, dtype=np.float32, mode="r", offset=8, shape=(n, d))
base = fbin(D + "/base.fbin")
qs = np.array(fbin(D + "/queries.fbin"))
gt = np.fromfile(D + "/gt.bin", dtype=np.int32)
nq, kk = gt[0], gt[1]
gt = gt[2:2 + nq * kk].reshape(nq, kk)
n, dim = base.shape

def load_graph(path, hdr, rpb, rec, deg_off, R):
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    out = np.full((n, R), -1, dtype=np.int64); degs = np.zeros(n, dtype=np.int64)
    for s in range(rpb):
        ids = np.arange(s, n, rpb)
        blocks = ids // rpb
        offs = hdr(blocks) + s * rec
        # gather degree and neighbours
        idx = offs[:, None] + deg_off + np.arange(4 + 4 * R)[None, :]
        for c0 in range(0, len(ids), 100000):
            chunk = np.asarray(raw[idx[c0:c0+100000]]).view(np.uint32)
            d = chunk[:, 0].astype(np.int64)
            nb_ = chunk[:, 1:].astype(np.int64)
            mask = np.arange(R)[None, :] < d[:, None]
            nb_[~mask] = -1
            out[ids[c0:c0+100000]] = nb_
            degs[ids[c0:c0+100000]] = d
    return out, degs

man = json.load(open(NL + "/manifest.json")); medoid_nl = man["medoid"]
lay = man["layout"]
if lay["kind"] != "id" or lay["page_size"] != 4096:
    sys.exit("needs a nearline index with the ID layout and 4 KiB pages")
R_nl = lay["max_degree"]
g_nl, d_nl = load_graph(NL + "/pages.bin", lambda b: b * 4096 + 16, lay["records_per_block"], lay["record_size"],
                        4 * dim, R_nl)
meta = np.fromfile(DK + "/ann_disk.index", dtype=np.uint64, count=12, offset=8)
print("diskann meta", meta[:6])
medoid_dk = int(meta[2]); node_len = int(meta[3]); nps = int(meta[4])
if nps < 1:
    sys.exit("diskann nodes span several sectors: not supported")
R_dk = (node_len - 4 * dim - 4) // 4
g_dk, d_dk = load_graph(DK + "/ann_disk.index", lambda b: (b + 1) * 4096, nps, node_len, 4 * dim, R_dk)
print("mean degree nl %.1f dk %.1f" % (d_nl.mean(), d_dk.mean()), "medoids", medoid_nl, medoid_dk)

def pq_nl():
    b = open(NL + "/pq_codebook.bin", "rb").read()
    _, ver, d, m = struct.unpack_from("<4sIII", b, 0)
    o = 16
    offs = np.frombuffer(b, np.uint32, m + 1, o); o += 4 * (m + 1)
    center = np.frombuffer(b, np.float32, d, o); o += 4 * d
    cents = np.frombuffer(b, np.float32, 256 * d, o)
    chunks = []; p = 0
    for j in range(m):
        cd = offs[j + 1] - offs[j]
        chunks.append(cents[p:p + 256 * cd].reshape(256, cd)); p += 256 * cd
    raw = np.fromfile(NL + "/pq_codes.bin", dtype=np.uint8)
    codes = raw[-n * m:].reshape(n, m)  # tolerate a header
    return offs, center, chunks, codes

def pq_dk():
    f = DK + "/ann_pq_pivots.bin"
    nr, nc = np.fromfile(f, dtype=np.int32, count=2)
    offsets = np.fromfile(f, dtype=np.uint64, count=nr, offset=8)
    def binat(off, dt):
        r, c = np.fromfile(f, dtype=np.int32, count=2, offset=int(off))
        return np.fromfile(f, dtype=dt, count=r * c, offset=int(off) + 8).reshape(r, c)
    piv = binat(offsets[0], np.float32); cen = binat(offsets[1], np.float32).ravel(); co = binat(offsets[2], np.uint32).ravel()
    m = len(co) - 1
    chunks = [piv[:, co[j]:co[j + 1]] for j in range(m)]
    c = np.fromfile(DK + "/ann_pq_compressed.bin", dtype=np.int32, count=2)
    codes = np.fromfile(DK + "/ann_pq_compressed.bin", dtype=np.uint8, offset=8).reshape(c[0], c[1])
    return co, cen, chunks, codes

pqs = {"nl": pq_nl(), "dk": pq_dk()}
# quantisation MSE on a sample
rs = np.random.default_rng(0).choice(n, 20000, replace=False); rs.sort()
X = np.asarray(base[rs])
for name, (offs, center, chunks, codes) in pqs.items():
    rec = np.concatenate([chunks[j][codes[rs, j]] for j in range(len(chunks))], axis=1) + center
    print(name, "m", len(chunks), "PQ MSE %.4f" % ((X - rec) ** 2).sum(1).mean(), "rel %.4f" % (((X - rec) ** 2).sum(1).mean() / ((X - X.mean(0)) ** 2).sum(1).mean()))

def table(pq, q):
    offs, center, chunks, codes = pq
    qc = q - center
    return np.stack([((chunks[j] - qc[offs[j]:offs[j + 1]]) ** 2).sum(1) for j in range(len(chunks))])

def search(g, medoid, pq, q, L, W=4, k=10):
    offs, center, chunks, codes = pq
    T = table(pq, q)
    m = T.shape[0]; ar = np.arange(m)
    visited = {medoid}
    cand = [(float(T[ar, codes[medoid]].sum()), medoid, False)]
    exact = []
    reads = 0
    while True:
        fr = [i for i, c in enumerate(cand) if not c[2]][:W]
        if not fr:
            break
        newn = []
        for i in fr:
            d, v, _ = cand[i]; cand[i] = (d, v, True)
            reads += 1
            exact.append((float(((base[v] - q) ** 2).sum()), v))
            nb = g[v]; nb = nb[nb >= 0]
            for u in nb:
                if u not in visited:
                    visited.add(int(u)); newn.append(int(u))
        if newn:
            nn = np.array(newn)
            ds = T[ar[None, :], codes[nn]].sum(1)
            cand.extend((float(ds[j]), int(nn[j]), False) for j in range(len(nn)))
            cand.sort(key=lambda c: (c[0], c[1]))
            del cand[L:]
    exact.sort()
    return [v for _, v in exact[:k]], reads

NQ = int(sys.argv[2]) if len(sys.argv) > 2 else 200
Ls = [int(x) for x in (sys.argv[3] if len(sys.argv) > 3 else "60,100,150,200").split(",")]
for gname, g, med in [("nl", g_nl, medoid_nl), ("dk", g_dk, medoid_dk)]:
    for pname in ["nl", "dk"]:
        for L in Ls:
            t = time.time(); rec = 0; rd = 0
            for qi in range(NQ):
                res, r = search(g, med, pqs[pname], qs[qi], L)
                rec += len(set(res) & set(gt[qi, :10].tolist())) / 10; rd += r
            print(f"graph={gname} pq={pname} L={L} recall={rec/NQ:.4f} reads={rd/NQ:.1f} ({time.time()-t:.0f}s)", flush=True)
