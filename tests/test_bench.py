"""Tests of the benchmark runner: pure helpers, /proc/self/io, the worker, diskannpy end to end."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

import nearline  # noqa: E402
from nearline import _bench_worker, bench, datasets, peers  # noqa: E402


# --------------------------------------------------------------------------- schedule


def test_alternation_schedule_rotates():
    assert bench.alternation_schedule(["A", "B", "C"], 4) == [
        ["A", "B", "C"], ["B", "C", "A"], ["C", "A", "B"], ["A", "B", "C"]]
    assert bench.alternation_schedule(["A"], 2) == [["A"], ["A"]]
    sched = bench.alternation_schedule(["A", "B"], 6)
    assert [r[0] for r in sched].count("A") == 3
    assert all(sorted(r) == ["A", "B"] for r in sched)


# --------------------------------------------------------------------------- interpolation


def test_interpolate_linear_and_exact():
    rec = [0.80, 0.90, 0.96, 0.99]
    val = [1000.0, 800.0, 500.0, 200.0]
    assert bench.interpolate_at_recall(rec, val, 0.90) == 800.0
    assert bench.interpolate_at_recall(rec, val, 0.93) == pytest.approx(650.0)
    assert bench.interpolate_at_recall(rec, val, 0.995) is None  # never reached
    assert bench.interpolate_at_recall(rec, val, 0.70) is None  # starts above: no bracket


def test_interpolate_log_scale():
    v = bench.interpolate_at_recall([0.9, 1.0], [100.0, 10000.0], 0.95, log_scale=True)
    assert v == pytest.approx(1000.0)


def test_interpolate_skips_missing_and_non_monotonic():
    assert bench.interpolate_at_recall([0.9, None, 1.0], [10.0, 5.0, 20.0], 0.95) == pytest.approx(15.0)
    # A dip in recall: the first point reaching the target and its predecessor bracket it.
    assert bench.interpolate_at_recall([0.8, 0.92, 0.91, 0.97], [8, 6, 5, 2], 0.95) == pytest.approx(3.0)
    # Equal recall on both bracketing points: take the reaching point.
    assert bench.interpolate_at_recall([0.95, 0.95], [4.0, 3.0], 0.95) == 4.0


def test_matched_ratios():
    a = {"points": [{"recall": 0.85, "qps": 4000, "mean_reads": 20}, {"recall": 0.97, "qps": 2000, "mean_reads": 40}]}
    b = {"points": [{"recall": 0.88, "qps": 1000, "mean_reads": 50}, {"recall": 0.96, "qps": 500, "mean_reads": 90}]}
    r = bench.matched_ratios(a, b)
    assert set(r) == {"0.90", "0.95"}  # 0.99 reached by neither
    # a at 0.95 (log-interp between 4000 and 2000, t = 10/12); b at 0.95 (t = 7/8).
    qa = np.exp(np.log(4000) + 10 / 12 * (np.log(2000) - np.log(4000)))
    qb = np.exp(np.log(1000) + 7 / 8 * (np.log(500) - np.log(1000)))
    assert r["0.95"]["qps_ratio"] == pytest.approx(qa / qb)
    ra = 20 + 10 / 12 * 20
    rb = 50 + 7 / 8 * 40
    assert r["0.95"]["reads_ratio"] == pytest.approx(ra / rb)
    c = {"points": [{"recall": 0.85, "qps": 4000, "mean_reads": 0.0}, {"recall": 0.97, "qps": 2000, "mean_reads": 0.0}]}
    assert bench.matched_ratios(a, c)["0.95"]["reads_ratio"] is None  # in-memory peer: no reads


def test_median_points():
    runs = [[{"L": 10, "recall": 0.9, "qps": 100.0}, {"L": 20, "recall": 0.95, "qps": 50.0}],
            [{"L": 10, "recall": 0.9, "qps": 300.0}, {"L": 20, "recall": 0.95, "qps": 70.0}],
            [{"L": 10, "recall": 0.9, "qps": 200.0}, {"L": 20, "recall": 0.95, "qps": None}]]
    m = bench.median_points(runs)
    assert [p["L"] for p in m] == [10, 20]
    assert m[0]["qps"] == 200.0 and m[1]["qps"] == 60.0 and m[0]["mean_hops"] is None


def test_params_key_stable_and_param_sensitive():
    p = peers.Params(R=32)
    assert bench.params_key("diskannpy", "d", p, 8) == bench.params_key("diskannpy", "d", peers.Params(R=32), 8)
    assert bench.params_key("diskannpy", "d", p, 8) != bench.params_key("diskannpy", "d", p, 16)
    assert bench.params_key("diskannpy", "d", p, 8) != bench.params_key("diskannpy", "d", peers.Params(R=16), 8)
    # Entry structures change nearline's index; default values keep older cache names.
    plain = bench.params_key("nearline", "d", peers.Params(), 8)
    assert plain == bench.params_key("nearline", "d", peers.Params(nav_sample=0.0, entry_clusters=0), 8)
    assert plain != bench.params_key("nearline", "d", peers.Params(nav_sample=0.01), 8)
    assert plain != bench.params_key("nearline", "d", peers.Params(entry_clusters=300), 8)
    # Open-time choices do not.
    assert plain == bench.params_key("nearline", "d", peers.Params(entry="nav", nav_seeds=8), 8)


# --------------------------------------------------------------------------- /proc, budgets


def test_read_proc_io_parses(tmp_path):
    f = tmp_path / "io"
    f.write_text("rchar: 123\nwchar: 5\nsyscr: 7\nsyscw: 1\nread_bytes: 8192\nwrite_bytes: 0\n"
                 "cancelled_write_bytes: 0\n")
    io = peers.read_proc_io(str(f))
    assert io["read_bytes"] == 8192 and io["rchar"] == 123 and len(io) == 7
    assert peers.read_proc_io(str(tmp_path / "missing")) == {}


def test_read_proc_io_self_counts_reads(tmp_path):
    io0 = peers.read_proc_io()
    if not io0:
        pytest.skip("/proc/self/io unavailable")
    (tmp_path / "blob").write_bytes(b"x" * 100_000)
    (tmp_path / "blob").read_bytes()
    io1 = peers.read_proc_io()
    assert io1["rchar"] - io0["rchar"] >= 100_000


@pytest.mark.parametrize("n,dim,pq", [(2000, 16, 8), (2000, 16, 4), (1_000_000, 128, 32), (100_000_000, 128, 32),
                                      (114_895, 384, 48), (5000, 64, 64)])
def test_diskann_budget_round_trip(n, dim, pq):
    gb = peers.diskann_search_memory_gb(pq, n, dim)
    assert peers.diskann_pq_chunks(gb, n, dim) == pq


def test_diskann_budget_threshold_and_errors():
    # Above 1.25 GB DiskANN keeps 0.25 GB for cached nodes.
    assert peers.diskann_pq_chunks(2.0, 1024**3 // 100, 512) == int(1.75 * 100)
    assert peers.diskann_pq_chunks(1.0, 1024**3 // 100, 512) == 100
    assert peers.diskann_pq_chunks(1e-6, 10**9, 16) == 1
    with pytest.raises(ValueError, match="PQ chunks"):
        peers.diskann_search_memory_gb(17, 1000, 16)


def test_budget_parsing():
    assert peers._budget_bytes("512MB") == 512 * 10**6
    assert peers._budget_bytes("2GiB") == 2 * 1024**3
    assert peers._budget_bytes(0.5, 1000) == 500
    assert peers._budget_bytes(4096) == 4096
    with pytest.raises(ValueError):
        peers._budget_bytes("lots")


# --------------------------------------------------------------------------- worker, in process with a fake engine


class _FakeIndex:
    def __init__(self, base):
        self.base = base

    def search(self, queries, k=10, *, L=None, W=4, threads=None, return_stats=False):
        ids, d = datasets.brute_force_ground_truth(self.base, queries, k)
        ids[:, -1] = -1  # one miss per query
        nq = len(queries)
        stats = {"hops": np.full(nq, 5), "reads": np.full(nq, 12), "io_utilisation": np.full(nq, 0.5),
                 "total_us": np.arange(nq, dtype=np.float64) * 10.0}
        return (ids, d, stats) if return_stats else (ids, d)

    def close(self):
        pass


def test_worker_search_nearline_with_fake_engine(tmp_path, monkeypatch):
    ds = datasets.load_dataset("synthetic:500:8", tmp_path, queries=20)
    ds = datasets.materialize(ds, tmp_path, 10)
    monkeypatch.setattr(nearline, "open", lambda path, **kw: _FakeIndex(ds.base), raising=False)
    res = _bench_worker.run({"action": "search", "system": "nearline", "index_dir": str(tmp_path / "idx"),
                             "queries": str(ds.queries_path), "gt": str(ds.gt_path), "k": 10, "Ls": [10, 20],
                             "params": {"threads": 1}, "queries_repeat": 2, "warmup": 5})
    assert res["nq"] == 40 and [p["L"] for p in res["points"]] == [10, 20]
    pt = res["points"][0]
    assert pt["recall"] == pytest.approx(0.9)
    assert pt["mean_reads"] == 12 and pt["mean_hops"] == 5 and pt["io_util"] == 0.5
    assert pt["lat_mean_ms"] == pytest.approx(np.mean(np.arange(40) * 10.0) / 1000)
    assert pt["lat_p999_ms"] <= 0.39 + 1e-9 and pt["qps"] > 0


def test_worker_main_reports_errors_as_json(capfd):
    status = _bench_worker.main([json.dumps({"action": "explode"})])
    out, _ = capfd.readouterr()
    assert status == 1 and "unknown action" in json.loads(out.strip().splitlines()[-1])["error"]


def test_run_worker_raises_bench_error(tmp_path):
    with pytest.raises(bench.BenchError, match="hnswlib search"):
        bench.run_worker({"action": "search", "system": "hnswlib", "index_dir": str(tmp_path / "none"),
                          "queries": str(tmp_path / "q.fbin"), "gt": str(tmp_path / "gt.bin"), "k": 1, "Ls": [1]},
                         tmp_path / "log.txt")
    assert (tmp_path / "log.txt").exists()


# --------------------------------------------------------------------------- diskannpy end to end


def test_diskannpy_end_to_end_through_worker(tmp_path):
    pytest.importorskip("diskannpy")
    cfg = bench.BenchConfig(data="synthetic:2000:16", systems=["diskannpy"], Ls=[10, 40], k=10, R=16, build_L=32,
                            pq_bytes=8, threads=2, reps=2, workdir=tmp_path, warmup=10, latency_queries=20,
                            out=tmp_path / "r.json")
    res = bench.run_bench(cfg, progress=False)
    b = res["builds"]["diskannpy"]
    assert b["pq_bytes"] == 8 and b["build_s"] > 0 and b["peak_rss_bytes"] > 0
    idir = next(p for p in (tmp_path / "indexes").iterdir() if p.is_dir())
    assert (idir / "ann_pq_compressed.bin").stat().st_size == 8 + 2000 * 8
    assert len(res["runs"]["diskannpy"]) == 2
    pts = res["summary"]["diskannpy"]["points"]
    assert [p["L"] for p in pts] == [10, 40]
    assert pts[1]["recall"] >= 0.9 and pts[1]["recall"] >= pts[0]["recall"]
    assert pts[0]["qps"] > 0 and pts[0]["lat_p99_ms"] > 0
    assert json.loads((tmp_path / "r.json").read_text())["params"]["pq_bytes_matched"] == 8
    # A second run reuses the cached index.
    cfg.reps = 1
    res2 = bench.run_bench(cfg, progress=False)
    assert res2["builds"]["diskannpy"]["cached"] is True
    assert "diskannpy" in bench.format_report(res2)


def test_report_and_plot(tmp_path):
    pytest.importorskip("matplotlib")
    from nearline import plots

    summary = {
        "nearline": {"points": [{"L": 10, "recall": 0.9, "qps": 5000.0}, {"L": 20, "recall": 0.97, "qps": 3000.0}]},
        "diskannpy": {"points": [{"L": 10, "recall": 0.88, "qps": 2000.0}, {"L": 20, "recall": 0.96, "qps": 1000.0}]},
    }
    out = plots.plot_qps_recall(summary, tmp_path / "c.png", k=10, title="t")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    full = {"nearline": {"points": bench.median_points([summary["nearline"]["points"]])},
            "diskannpy": {"points": bench.median_points([summary["diskannpy"]["points"]])}}
    at = bench.matched_ratios(full["nearline"], full["diskannpy"])
    result = {"params": {"k": 10}, "summary": full,
              "comparisons": {"nearline/diskannpy": {"at_recall": at, "build_time_ratio": 0.5,
                                                     "peak_build_rss_ratio": 0.8}},
              "builds": {"nearline": {"build_s": 1.0, "peak_rss_bytes": 2**20}, "diskannpy": {"build_s": 2.0}}}
    text = bench.format_report(result)
    assert "QPS ratio nearline/diskannpy @ recall 0.95 = " in text
    assert "build time ratio nearline/diskannpy = 0.50" in text


def test_diskann_input_uses_or_converts_files(tmp_path):
    x = np.random.default_rng(0).standard_normal((70, 5)).astype(np.float32)
    f32 = datasets.write_bin(tmp_path / "b.fbin", x)
    assert peers._diskann_input(f32, tmp_path, "l2") == (str(f32), np.dtype(np.float32), 70, 5)
    f16 = datasets.write_bin(tmp_path / "b.f16bin", x.astype(np.float16))
    path, dt, n, dim = peers._diskann_input(f16, tmp_path, "l2")
    assert path.endswith("input.fbin") and dt == np.float32 and (n, dim) == (70, 5)
    assert np.array_equal(datasets.read_vectors(path), x.astype(np.float16).astype(np.float32))
    path, _, _, _ = peers._diskann_input(f32, tmp_path, "cosine")
    assert np.allclose(np.linalg.norm(datasets.read_vectors(path), axis=1), 1.0, atol=1e-5)


def test_worker_peak_rss_is_its_own(tmp_path):
    pytest.importorskip("hnswlib")
    ds = datasets.load_dataset("synthetic:500:8", tmp_path, queries=10)
    ballast = np.ones(400 * 2**20 // 8)  # 400 MiB in the parent, touched
    res = bench.run_worker({"action": "build", "system": "hnswlib", "base": str(ds.base_path),
                            "index_dir": str(tmp_path / "idx"), "params": {"R": 16, "build_L": 20, "threads": 1}})
    assert ballast.sum() > 0
    assert 0 < res["peak_rss_bytes"] < 300 * 2**20  # VmHWM: the worker's own peak
    assert res["ru_maxrss_bytes"] >= 400 * 2**20  # ru_maxrss carries the parent's over fork/exec
    assert res["build_s"] > 0 and res["index_bytes"] > 0


class _FakeBuilt(_FakeIndex):
    def info(self):
        return {"n": len(self.base), "pq_bytes": 4, "memory": {"total": 1}}


def test_run_bench_orchestration_with_fake_engine(tmp_path, monkeypatch):
    """nearline (faked, in process) then diskannpy with nearline's PQ size; ratios and report."""
    pytest.importorskip("diskannpy")
    built = {}

    def fake_build(data, path, **kw):
        built.update(kw, data=data)
        if not Path(path).parent.is_dir():  # as the engine does
            raise ValueError(f"parent directory {Path(path).parent} does not exist")
        Path(path).mkdir()
        return _FakeBuilt(datasets.read_vectors(data))

    ds = datasets.load_dataset("synthetic:1000:8", tmp_path)  # the spec run_bench resolves
    monkeypatch.setattr(nearline, "build", fake_build, raising=False)
    monkeypatch.setattr(nearline, "open", lambda path, **kw: _FakeIndex(ds.base), raising=False)
    calls = []
    real_worker = bench.run_worker

    def in_process(spec, log_path=None, timeout_s=None):
        calls.append((spec["action"], spec["system"]))
        if spec["system"] != "nearline":  # DiskANN cannot open an index twice in one process
            return real_worker(spec, log_path, timeout_s)
        return json.loads(json.dumps(peers.jsonable(_bench_worker.run(json.loads(json.dumps(spec))))))

    monkeypatch.setattr(bench, "run_worker", in_process)
    cfg = bench.BenchConfig(data="synthetic:1000:8", systems=["nearline", "diskannpy"], Ls=[5, 10, 20, 40], k=10,
                            R=16, build_L=24, threads=1, reps=2, workdir=tmp_path, warmup=0, latency_queries=5)
    res = bench.run_bench(cfg, progress=False)
    assert built["R"] == 16 and built["build_L"] == 24 and built["metric"] == "l2"
    assert calls == [("build", "nearline"), ("build", "diskannpy"), ("search", "nearline"), ("search", "diskannpy"),
                     ("search", "diskannpy"), ("search", "nearline")]
    assert res["builds"]["diskannpy"]["pq_bytes"] == 4 and res["params"]["pq_bytes_matched"] == 4
    assert res["params"]["Ls"] == [10, 20, 40]  # L < k dropped
    nl_pts = res["summary"]["nearline"]["points"]
    assert all(0.85 <= p["recall"] <= 0.9 and p["mean_reads"] == 12 for p in nl_pts)
    assert "nearline/diskannpy" in res["comparisons"]
    assert "build nearline" in bench.format_report(res)


def test_cache_nodes_for_matches_both_systems():
    assert peers.cache_nodes_for(0, 64, 4, 32) == 0
    assert peers.cache_nodes_for(None, 64, 4, 32) == 0
    node = 64 * 4 + 4 + 4 * 32
    assert peers.cache_nodes_for(10 * node + 5, 64, 4, 32) == 10
    assert peers.cache_nodes_for("1MiB", 64, 4, 32) == 2**20 // node


def test_environment_record():
    env = bench._environment()
    assert env["cpu_count"] >= 1 and "date" in env and "diskannpy_version" in env
