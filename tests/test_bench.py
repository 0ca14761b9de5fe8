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
    """nearline's Index as the bench sees it. Per-query times of query i: total 10 i µs,
    distance 3 i (an engine with ``dist_us``), I/O wait 5 i with one query per worker and
    4 i when queries interleave (so a test can tell which run the roofline came from)."""

    with_dist = True

    def __init__(self, base):
        self.base = base
        self.calls = []

    def search(self, queries, k=10, *, L=None, W=4, threads=None, return_stats=False, queries_in_flight="auto"):
        self.calls.append((len(queries), queries_in_flight))
        ids, d = datasets.brute_force_ground_truth(self.base, queries, k)
        ids[:, -1] = -1  # one miss per query
        nq = len(queries)
        i = np.arange(nq, dtype=np.float64)
        stats = {"hops": np.full(nq, 5), "reads": np.full(nq, 12), "io_utilisation": np.full(nq, 0.5),
                 "total_us": i * 10.0, "io_wait_us": i * (5.0 if queries_in_flight == 1 else 4.0)}
        if self.with_dist:
            stats["dist_us"] = i * 3.0
        return (ids, d, stats) if return_stats else (ids, d)

    def close(self):
        pass


class _FakeIndexNoDist(_FakeIndex):
    """An engine built before ``dist_us``: its stats lack it."""

    with_dist = False


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


class _FakeIndexSmallBudget(_FakeIndex):
    """An index whose memory budget cannot give a search at L >= 40 its scratch."""

    def search(self, queries, k=10, *, L=None, **kw):
        if L is not None and L >= 40:
            raise ValueError(f"this search needs about 9 bytes of worker scratch (L={L}), more than the memory "
                             "budget can give the workers even with the cache emptied (8 bytes)")
        return super().search(queries, k, L=L, **kw)


def test_worker_reports_the_Ls_the_budget_refuses_and_keeps_the_others(tmp_path, monkeypatch):
    ds = datasets.load_dataset("synthetic:500:8", tmp_path, queries=20)
    ds = datasets.materialize(ds, tmp_path, 10)
    monkeypatch.setattr(nearline, "open", lambda path, **kw: _FakeIndexSmallBudget(ds.base), raising=False)
    spec = {"action": "search", "system": "nearline", "index_dir": str(tmp_path / "idx"),
            "queries": str(ds.queries_path), "gt": str(ds.gt_path), "k": 10, "Ls": [10, 20, 40, 80],
            "params": {"threads": 1}, "warmup": 5}
    res = _bench_worker.run(spec)
    assert [p["L"] for p in res["points"]] == [10, 20]
    assert [r["L"] for r in res["refused"]] == [40, 80] and "cache emptied" in res["refused"][0]["reason"]
    # Not even the first L: the error ends the run (there is nothing to report).
    with pytest.raises(ValueError, match="cache emptied"):
        _bench_worker.run({**spec, "Ls": [40, 80]})


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


def test_variant_keys_are_engine_option_names():
    """The bench routes a variant's keys to calls; the names are the engine's own."""
    import nearline

    names = nearline.VOCABULARY["options"]
    engine = {"build": set(names["build"]), "open": set(names["open"]), "search": set(names["search"]),
              "range": set(names["range_search"])}
    for stage in ("build", "open", "search", "range"):
        assert set(bench.VARIANT_KEYS[stage]) <= engine[stage], stage


def test_runner_python_runs_the_worker_with_that_interpreter(tmp_path, monkeypatch):
    """``--variant NAME:python=PATH`` runs that variant with another interpreter (another
    nearline version) whose own package is imported: this one's is not put on its path."""
    v = bench.parse_variant(f"before:python={sys.executable},W=8")
    assert v.runner == {"python": sys.executable} and v.search == {"W": 8}
    assert "python" not in v.spec()
    seen = {}

    class Done:
        returncode = 0
        stdout = json.dumps({"ok": True})

    def fake_run(cmd, **kw):
        seen["cmd"], seen["env"], seen["input"] = cmd, kw["env"], json.loads(kw["input"])
        return Done()

    monkeypatch.setattr(bench.subprocess, "run", fake_run)
    monkeypatch.setenv("PYTHONPATH", "/somewhere")
    assert bench.run_worker({"action": "search", "system": "nearline", "python": "/other/python"}) == {"ok": True}
    assert seen["cmd"][0] == "/other/python" and "PYTHONPATH" not in seen["env"]
    assert "python" not in seen["input"]
    bench.run_worker({"action": "search", "system": "nearline"})
    assert seen["cmd"][0] == sys.executable and "/somewhere" in seen["env"]["PYTHONPATH"]


# --------------------------------------------------------------------------- diskannpy end to end


def test_diskannpy_end_to_end_through_worker(tmp_path):
    pytest.importorskip("diskannpy")
    cfg = bench.BenchConfig(data="synthetic:2000:16", systems=["diskannpy"], Ls=[10, 40], k=10, R=16, build_L=32,
                            pq_bytes=8, threads=2, reps=2, workdir=tmp_path, warmup=10, latency_queries=20,
                            out=tmp_path / "r.json", peer_threads=[])
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
    # diskannpy's search holds the GIL: its latency run uses one process per client.
    assert pts[0]["latency_source"].startswith("timed single-query calls in 2 processes")
    assert pts[0]["lat_queries"] == 20
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
    # A budget sweep's plot names end in the budget ("-b0.1"): never taken for a format.
    out = plots.plot_qps_recall(summary, tmp_path / "c-b0.1", k=10)
    assert out == tmp_path / "c-b0.1.png" and out.read_bytes()[:4] == b"\x89PNG"
    assert plots.image_path(tmp_path / "d.svg") == tmp_path / "d.svg"
    # A budget curve no system reached the recall on still plots, saying so, without a warning.
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = plots.plot_qps_budget({"a": {"budget": [0.1, 0.2], "0.95": [None, None]}}, tmp_path / "e.png")
    assert out.read_bytes()[:4] == b"\x89PNG"
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
                            R=16, build_L=24, threads=1, reps=2, workdir=tmp_path, warmup=0, latency_queries=5,
                            peer_threads=[])
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
    # The roofline: nearline's split from its stats; diskannpy has none (n/a, not zeros).
    assert res["roofline"]["nearline"]["available"] and res["roofline"]["nearline"]["dist_us"] is not None
    peer = res["roofline"]["diskannpy"]
    assert not peer["available"] and peer["dist_us"] is None and peer["io_wait_us"] is None
    assert any(line.split() == ["diskannpy"] + ["n/a"] * 5 for line in bench.format_report(res).splitlines())


def test_cache_nodes_for_matches_both_systems():
    assert peers.cache_nodes_for(0, 64, 4, 32) == 0
    assert peers.cache_nodes_for(None, 64, 4, 32) == 0
    node = 64 * 4 + 4 + 4 * 32
    assert peers.cache_nodes_for(10 * node + 5, 64, 4, 32) == 10
    assert peers.cache_nodes_for("1MiB", 64, 4, 32) == 2**20 // node


def test_environment_record():
    env = bench._environment()
    assert env["cpu_count"] >= 1 and "date" in env and "diskannpy_version" in env


# --------------------------------------------------------------------------- variants


def test_parse_variant_value_types():
    assert bench.parse_variant_value("8") == 8 and isinstance(bench.parse_variant_value("8"), int)
    assert bench.parse_variant_value("-3") == -3
    assert bench.parse_variant_value("1.25") == 1.25 and bench.parse_variant_value("1e-3") == 0.001
    assert bench.parse_variant_value("True") is True and bench.parse_variant_value("off") is False
    assert bench.parse_variant_value("none") is None
    assert bench.parse_variant_value("512MB") == "512MB"
    assert bench.parse_variant_value("pipeline") == "pipeline"
    assert bench.parse_variant_value("inf") == "inf"  # not a number a knob could take


def test_parse_variant_routes_keys_by_name():
    v = bench.parse_variant("fast:R=32,alpha=1.3,saturate=true,preset=diskann,nav_sample=0.01,W=8,"
                            "executor=pipeline,adaptive_beam=on,queries_in_flight=4,entry_points=64,cache_nodes=100,"
                            "memory_budget=512MB,entry=centroids,io=pread")
    assert v.name == "fast"
    assert v.build == {"R": 32, "alpha": 1.3, "saturate": True, "preset": "diskann", "nav_sample": 0.01}
    assert v.open == {"entry_points": 64, "cache_nodes": 100, "memory_budget": "512MB", "entry": "centroids",
                      "io": "pread"}
    assert v.search == {"W": 8, "executor": "pipeline", "adaptive_beam": True, "queries_in_flight": 4}
    assert v.spec() == {"name": "fast", "build": v.build, "open": v.open, "search": v.search}
    assert bench.parse_variant("plain") == bench.Variant("plain")
    assert bench.parse_variant("plain:") == bench.Variant("plain")
    assert bench.parse_variant(" w2 : W=2 , ") == bench.Variant("w2", search={"W": 2})
    # Every key of the routing table lands in its stage.
    for stage, keys in bench.VARIANT_KEYS.items():
        for key in keys:
            assert getattr(bench.parse_variant(f"x:{key}=1"), stage) == {key: 1}


@pytest.mark.parametrize("spec, match", [
    ("x:Wx=3", "unknown key 'Wx'.*did you mean W"),
    ("x:beam=3", "unknown key 'beam'.*accepted keys are build: .*R.*open: .*entry_points.*search: .*W"),
    ("x:W", "'W' is not key=value"),
    ("x:W=", "key 'W' has an empty value"),
    ("x:W=2,W=4", "key 'W' given twice"),
    (":W=2", "expected NAME:key=value"),
    ("bad name:W=2", "expected NAME:key=value"),
    ("-x:W=2", "expected NAME:key=value"),
])
def test_parse_variant_rejects_bad_specs(spec, match):
    with pytest.raises(ValueError, match=match):
        bench.parse_variant(spec)


def test_parse_variant_reserved_names():
    with pytest.raises(ValueError, match="'diskannpy' is taken"):
        bench.parse_variant("diskannpy:W=2", reserved=("diskannpy", "disk-ceiling"))


def test_check_variant_supported_against_signatures():
    class Api:
        @staticmethod
        def build(data, path, *, R=64, saturate=False):
            pass

        @staticmethod
        def open(path, *, entry_points=0, cache_nodes=None):
            pass

        class Index:
            def search(self, queries, k=10, *, L=None, W=4):
                pass

    bench.check_variant_supported(bench.parse_variant("ok:R=8,saturate=1,entry_points=4,W=2"), Api)
    with pytest.raises(ValueError, match="variant 'ex': Index.search of this nearline build does not take 'executor'"):
        bench.check_variant_supported(bench.parse_variant("ex:W=2,executor=pipeline"), Api)
    with pytest.raises(ValueError, match="nearline.build .* 'nav_sample'"):
        bench.check_variant_supported(bench.parse_variant("nav:nav_sample=0.1"), Api)
    with pytest.raises(ValueError, match="nearline.open .* 'entry'"):
        bench.check_variant_supported(bench.parse_variant("en:entry=centroids"), Api)
    # The installed engine takes the options that exist today.
    bench.check_variant_supported(bench.parse_variant("now:R=16,saturate=true,cache_nodes=10,entry_points=8,W=2"))


def test_config_systems_baseline_and_validation(tmp_path):
    w2 = bench.parse_variant("w2:W=2")
    cfg = bench.BenchConfig(data="x", systems=["nearline", "diskannpy", "hnswlib"], variants=[w2], workdir=tmp_path,
                            threads=2)
    # diskannpy also runs at 2x and 4x the threads (it searches one query per thread).
    assert cfg.all_systems() == ["nearline", "w2", "diskannpy", "hnswlib", "diskannpy@4", "diskannpy@8"]
    assert cfg.baseline_system() == "diskannpy"  # the first peer
    cfg.validate()
    cfg.peer_threads = []
    assert cfg.all_systems() == ["nearline", "w2", "diskannpy", "hnswlib"]
    cfg = bench.BenchConfig(data="x", systems=[], variants=[w2, bench.parse_variant("r8:R=8")], workdir=tmp_path)
    assert cfg.all_systems() == ["w2", "r8"] and cfg.baseline_system() == "w2"
    cfg.baseline = "r8"
    assert cfg.baseline_system() == "r8"
    # Variants given as text are parsed.
    assert bench.BenchConfig(data="x", systems=["nearline"], variants=["a:W=1"]).all_systems() == ["nearline", "a"]

    def bad(match, **kw):
        c = bench.BenchConfig(**{"data": "x", "systems": ["nearline"], "workdir": tmp_path, **kw})
        with pytest.raises(ValueError, match=match):
            c.validate()

    bad("--baseline 'diskannpy' is not one of the systems: nearline", baseline="diskannpy")
    bad("given twice", variants=[w2, bench.Variant("w2")])
    bad("'hnswlib' is taken", variants=[bench.Variant("hnswlib")])
    bad("'disk-ceiling' is taken", variants=[bench.Variant("disk-ceiling")])
    bad("--target-recall 1.5", target_recalls=[0.9, 1.5])
    bad("--ceiling-depth must be in 1..256", ceiling_depth=0)
    bad("--ceiling-depth must be in 1..256", ceiling_depth=300)
    bad("--ceiling-seconds", ceiling_seconds=0.0)
    bad("--latency-queries", latency_queries=-1)
    bad("--perturb", perturb=float("nan"))
    bad("nothing to benchmark", systems=[])
    bad("unknown system", systems=["annoy"])


class _RecordingIndex(_FakeIndex):
    seen: dict = {}

    def search(self, queries, k=10, **kw):
        _RecordingIndex.seen.setdefault("search", []).append(kw)
        known = {key: kw[key] for key in ("L", "W", "threads", "return_stats") if key in kw}
        return super().search(queries, k, **known)

    def info(self):
        return {"n": len(self.base), "pq_bytes": 4}


def test_variant_keys_reach_build_open_and_search(tmp_path, monkeypatch):
    ds = datasets.materialize(datasets.load_dataset("synthetic:400:8", tmp_path, queries=10), tmp_path, 10)
    seen = _RecordingIndex.seen
    seen.clear()

    def fake_build(data, path, **kw):
        seen["build"] = kw
        return _RecordingIndex(ds.base)

    def fake_open(path, **kw):
        seen["open"] = kw
        return _RecordingIndex(ds.base)

    monkeypatch.setattr(nearline, "build", fake_build, raising=False)
    monkeypatch.setattr(nearline, "open", fake_open, raising=False)
    v = bench.parse_variant("v:R=12,saturate=true,memory_budget=0.5,entry_points=16,W=3,early_dispatch=on").spec()
    params = {"R": 32, "W": 4, "threads": 1, "cache_budget": "1MiB", "entry_points": 0}
    res = _bench_worker.run({"action": "build", "system": "nearline", "base": str(ds.base_path),
                             "index_dir": str(tmp_path / "i"), "params": params, "variant": v})
    assert res["pq_bytes"] == 4
    assert seen["build"]["R"] == 12 and seen["build"]["saturate"] is True and seen["build"]["overwrite"] is True
    # No navigation graph asked for: the preset keeps its own (pipeann and starling build one).
    assert "nav_sample" not in seen["build"] and "entry_clusters" not in seen["build"]
    _bench_worker.run({"action": "build", "system": "nearline", "base": str(ds.base_path),
                       "index_dir": str(tmp_path / "j"), "params": {**params, "nav_sample": 0.02}, "variant": v})
    assert seen["build"]["nav_sample"] == 0.02
    res = _bench_worker.run({"action": "search", "system": "nearline", "name": "v", "index_dir": str(tmp_path / "i"),
                             "queries": str(ds.queries_path), "gt": str(ds.gt_path), "k": 10, "Ls": [10],
                             "params": params, "warmup": 0, "latency_queries": 25, "variant": v})
    assert res["system"] == "v" and res["kind"] == "nearline"
    # memory_budget without cache_nodes: the variant's budget sizes the cache, not the shared cache budget.
    assert seen["open"]["memory_budget"] == 0.5 and seen["open"].get("cache_nodes") is None
    assert seen["open"]["entry_points"] == 16
    assert all(kw["W"] == 3 and kw["early_dispatch"] is True for kw in seen["search"])
    # Without a variant the shared options apply.
    seen.clear()
    _bench_worker.run({"action": "search", "system": "nearline", "index_dir": str(tmp_path / "i"),
                       "queries": str(ds.queries_path), "gt": str(ds.gt_path), "k": 10, "Ls": [10],
                       "params": params, "warmup": 0})
    assert seen["open"]["cache_nodes"] == peers.cache_nodes_for("1MiB", 8, 4, 32) and seen["open"]["entry_points"] == 0
    assert all(kw == {"L": 10, "W": 4, "threads": 1, "return_stats": True} for kw in seen["search"])


def test_params_key_shares_builds_between_variants():
    p = peers.Params(R=32)
    plain = bench.params_key("nearline", "d", p, None)
    assert bench.params_key("nearline", "d", p, None, {}) == plain
    assert bench.params_key("nearline", "d", p, None, {"R": 32}) == plain  # equal to the shared value
    assert bench.params_key("nearline", "d", p, None, {"R": 16}) != plain
    assert bench.params_key("nearline", "d", p, None, {"saturate": True}) != plain


def test_an_auto_build_is_keyed_by_the_composition_the_rules_pick(tmp_path):
    # 20k × 64: every list fits in all of the raw bytes (dgai), not in half of them (starling).
    import nearline
    from conftest import clustered

    base, _ = clustered(20000, 64, seed=5)
    f = tmp_path / "base.fbin"
    nearline.write_vectors(f, base)
    roomy, tight = peers.Params(R=32, memory_budget=1.0), peers.Params(R=32, memory_budget=0.5)
    assert peers.planned_auto_preset(f, roomy) == "dgai"
    assert peers.planned_auto_preset(f, tight) == "starling"
    assert peers.planned_auto_preset(f, roomy, {"preset": "auto"}) == "dgai"
    # A named preset is its own key; options the engine refuses leave the key to the build.
    assert peers.planned_auto_preset(f, roomy, {"preset": "gorgeous"}) is None
    assert peers.planned_auto_preset(f, peers.Params(R=32, memory_budget=1e-6)) is None
    # So a cached `auto` build from before a rule change is not reused.
    keys = [bench.params_key("nearline", "d", roomy, None, {"auto_plans": x}) for x in ("gorgeous", "dgai")]
    assert keys[0] != keys[1]


# --------------------------------------------------------------------------- latency helpers


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.uint8, np.int8])
def test_perturbed_queries_keep_shape_dtype_and_first_copy(dtype):
    rng = np.random.default_rng(3)
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        q = rng.integers(info.min, info.max, size=(7, 5), endpoint=True).astype(dtype)
    else:
        q = rng.standard_normal((7, 5)).astype(dtype)
    out = bench.perturbed_queries(q, 30, scale=0.05, seed=1)
    assert out.shape == (30, 5) and out.dtype == q.dtype and out.flags.c_contiguous
    assert np.array_equal(out[:7], q)  # the first copy is the query set itself
    assert np.array_equal(bench.perturbed_queries(q, 30, scale=0.05, seed=1), out)  # deterministic
    diff = out[7:].astype(np.float64) - q[np.arange(7, 30) % 7].astype(np.float64)
    sigma = q.astype(np.float64).std(axis=0)
    assert np.all(np.abs(diff) <= 0.05 * sigma * 6 + 1.0)  # small next to the spread of the queries
    if np.issubdtype(dtype, np.floating):
        assert np.any(diff != 0)
    assert np.array_equal(bench.perturbed_queries(q, 3), q[:3])
    assert np.array_equal(bench.perturbed_queries(q, 14, scale=0.0), np.tile(q, (2, 1)))
    assert bench.perturbed_queries(q, 0).shape == (0, 5)


def test_perturbed_queries_clip_integers_and_reject_bad_args():
    q = np.array([[0, 255], [255, 0]], dtype=np.uint8)
    out = bench.perturbed_queries(q, 400, scale=1.0, seed=0)
    assert out.dtype == np.uint8 and out.min() >= 0 and out.max() <= 255
    with pytest.raises(ValueError, match="non-empty 2-D"):
        bench.perturbed_queries(np.zeros((0, 3), np.float32), 5)
    with pytest.raises(ValueError, match="n must be >= 0"):
        bench.perturbed_queries(q, -1)
    with pytest.raises(ValueError, match="scale"):
        bench.perturbed_queries(q, 5, scale=-0.1)


def test_latency_summary_percentiles():
    lat = np.arange(1, 10001, dtype=np.float64)
    s = bench.latency_summary(lat)
    assert s["lat_mean_ms"] == pytest.approx(5000.5)
    assert s["lat_p50_ms"] == pytest.approx(5000.5)
    assert s["lat_p99_ms"] == pytest.approx(9900.01)
    assert s["lat_p999_ms"] == pytest.approx(9990.001)
    assert bench.latency_summary(np.array([2.0]))["lat_p999_ms"] == 2.0
    assert bench.latency_summary(None) == {"lat_mean_ms": None, "lat_p50_ms": None, "lat_p99_ms": None,
                                           "lat_p999_ms": None}
    assert bench.latency_summary(np.array([]))["lat_p50_ms"] is None


def test_closed_loop_latency_runs_each_query_once_on_threads():
    import threading

    q = np.arange(40, dtype=np.float32).reshape(20, 2)
    seen, tids = [], set()
    lock = threading.Lock()

    def one(row):
        with lock:
            seen.append(int(row[0]) // 2)
            tids.add(threading.get_ident())

    lat, wall = bench.closed_loop_latency(one, q, threads=3)
    assert sorted(seen) == list(range(20))
    assert lat.shape == (20,) and np.all(lat >= 0) and wall > 0
    assert 1 <= len(tids) <= 3

    def fail(row):
        raise RuntimeError("peer broke")

    with pytest.raises(RuntimeError, match="peer broke"):
        bench.closed_loop_latency(fail, q, threads=2)


def test_process_closed_loop_latency_with_real_index(small_index, small_data):
    _, queries = small_data
    q = np.ascontiguousarray(queries[:60])
    lat, wall = bench.process_closed_loop_latency("nearline", str(small_index), {"threads": 1, "W": 4}, None, q,
                                                  10, 20, processes=2)
    assert lat.shape == (60,) and np.all(lat > 0) and wall > 0
    with pytest.raises(RuntimeError, match="nearline latency processes failed"):
        bench.process_closed_loop_latency("nearline", str(small_index) + "-missing", {"threads": 1}, None, q,
                                          10, 20, processes=2, timeout_s=120)


def test_worker_latency_run_sizes_and_sources(tmp_path, monkeypatch):
    ds = datasets.materialize(datasets.load_dataset("synthetic:500:8", tmp_path, queries=20), tmp_path, 10)
    fake = _FakeIndex(ds.base)
    monkeypatch.setattr(nearline, "open", lambda path, **kw: fake, raising=False)
    res = _bench_worker.run({"action": "search", "system": "nearline", "index_dir": str(tmp_path / "idx"),
                             "queries": str(ds.queries_path), "gt": str(ds.gt_path), "k": 10, "Ls": [10],
                             "params": {"threads": 2}, "warmup": 0, "latency_queries": 130})
    pt = res["points"][0]
    assert res["nq"] == 20 and pt["recall"] == pytest.approx(0.9)  # recall on the original queries only
    assert pt["lat_queries"] == 130 and "engine total_us" in pt["latency_source"]
    # The recall batch runs with the engine's default (several queries per worker); the
    # closed-loop latency run gives each worker one query at a time.
    assert fake.calls == [(20, "auto"), (130, 1)]
    assert "1 queries in flight per thread" in pt["latency_source"]
    assert pt["lat_mean_ms"] == pytest.approx(np.mean(np.arange(130) * 10.0) / 1000)  # the latency batch's times
    assert pt["lat_p999_ms"] == pytest.approx(np.percentile(np.arange(130) * 10.0, 99.9) / 1000)


# --------------------------------------------------------------------------- roofline: distance, I/O wait, other


def test_worker_roofline_inputs_come_from_the_one_query_per_worker_run(tmp_path, monkeypatch):
    """The worker's roofline means are the latency run's (one query per worker) when there is
    one, else the recall batch's, named as such; an engine without dist_us leaves it out."""
    ds = datasets.materialize(datasets.load_dataset("synthetic:500:8", tmp_path, queries=20), tmp_path, 10)
    spec = {"action": "search", "system": "nearline", "index_dir": str(tmp_path / "idx"),
            "queries": str(ds.queries_path), "gt": str(ds.gt_path), "k": 10, "Ls": [10],
            "params": {"threads": 2}, "warmup": 0, "latency_queries": 130}
    monkeypatch.setattr(nearline, "open", lambda path, **kw: _FakeIndex(ds.base), raising=False)
    pt = _bench_worker.run(spec)["points"][0]
    lat, rec = np.arange(130.0), np.arange(20.0)
    assert pt["roofline_dist_us"] == pytest.approx(3 * lat.mean())
    assert pt["roofline_io_wait_us"] == pytest.approx(5 * lat.mean())  # 5 i: the queries_in_flight=1 run
    assert pt["roofline_total_us"] == pytest.approx(10 * lat.mean())
    assert pt["roofline_source"] == "closed-loop latency run, 1 query in flight per worker"
    # The recall batch's own means are kept beside them.
    assert pt["mean_dist_us"] == pytest.approx(3 * rec.mean())
    assert pt["mean_io_wait_us"] == pytest.approx(4 * rec.mean())
    assert pt["mean_total_us"] == pytest.approx(10 * rec.mean())
    # Without a latency run: the recall batch, whose queries interleave.
    pt = _bench_worker.run({**spec, "latency_queries": 0})["points"][0]
    assert pt["roofline_io_wait_us"] == pytest.approx(4 * rec.mean())
    assert pt["roofline_source"].startswith("recall batch, queries_in_flight=auto (queries may interleave")
    # A latency run the variant interleaves: the recall batch's numbers, as above.
    pt = _bench_worker.run({**spec, "variant": {"name": "q4", "build": {}, "open": {},
                                                "search": {"queries_in_flight": 4}}})["points"][0]
    assert pt["roofline_io_wait_us"] == pytest.approx(4 * rec.mean())
    assert pt["roofline_source"] == ("recall batch, queries_in_flight=4 (queries interleave on a worker: "
                                     "total_us includes the others' time)")
    # An engine without dist_us: no distance time, neither in the roofline nor in the means.
    monkeypatch.setattr(nearline, "open", lambda path, **kw: _FakeIndexNoDist(ds.base), raising=False)
    pt = _bench_worker.run(spec)["points"][0]
    assert "roofline_dist_us" not in pt and "mean_dist_us" not in pt
    assert pt["roofline_io_wait_us"] == pytest.approx(5 * lat.mean())


def _roof_curve(*pts):
    """A summary curve of (L, recall, dist_us or None, io_wait_us, total_us) points."""
    return {"points": [{"L": L, "recall": r, "qps": 1000.0, "roofline_dist_us": d, "roofline_io_wait_us": io,
                        "roofline_total_us": t, "roofline_source": "closed-loop latency run, 1 query in flight "
                        "per worker"} for L, r, d, io, t in pts]}


def test_roofline_summary_interpolates_clamps_and_marks_what_is_missing(tmp_path):
    pytest.importorskip("matplotlib")
    from nearline import plots

    summary = {
        # Brackets 0.95 between L 20 (0.90) and L 40 (1.00): halfway.
        "nearline": _roof_curve((20, 0.90, 100.0, 300.0, 500.0), (40, 1.00, 200.0, 500.0, 900.0)),
        # Starts above the target: the point nearest it.
        "easy": _roof_curve((10, 0.97, 50.0, 100.0, 200.0), (20, 0.99, 80.0, 150.0, 300.0)),
        # Distance + I/O wait above total (timer noise): other is clamped at 0.
        "noisy": _roof_curve((10, 0.95, 60.0, 50.0, 100.0)),
        "nodist": _roof_curve((10, 0.80, None, 100.0, 400.0), (20, 0.90, None, 200.0, 600.0)),
        "diskannpy": {"points": [{"L": 10, "recall": 0.96, "qps": 900.0, "mean_reads": 20.0}]},
    }
    roof = bench.roofline_summary(summary, 0.95)
    r = roof["nearline"]
    assert r["available"] and r["target_recall"] == 0.95
    assert r["at"] == {"how": "interpolated", "L": [20, 40], "recall": 0.95}
    assert (r["dist_us"], r["io_wait_us"], r["total_us"]) == pytest.approx((150.0, 400.0, 700.0))
    assert r["other_us"] == pytest.approx(700.0 - 150.0 - 400.0) and r["non_io_us"] == pytest.approx(300.0)
    assert r["dist_share"] == pytest.approx(150 / 700) and r["io_share"] == pytest.approx(400 / 700)
    assert r["source"] == "closed-loop latency run, 1 query in flight per worker"
    assert roof["easy"]["at"] == {"how": "nearest L", "L": [10], "recall": 0.97}
    assert roof["easy"]["dist_us"] == 50.0 and roof["easy"]["other_us"] == 50.0
    assert roof["noisy"]["other_us"] == 0.0 and roof["noisy"]["at"]["L"] == [10]
    nd = roof["nodist"]  # never reaches 0.95: its best point, distance time unknown, not zero
    assert nd["available"] and nd["at"]["L"] == [20] and nd["io_wait_us"] == 200.0 and nd["total_us"] == 600.0
    assert nd["dist_us"] is None and nd["other_us"] is None and nd["dist_share"] is None
    assert nd["non_io_us"] == 400.0 and "dist_us" in nd["note"]
    pk = roof["diskannpy"]  # a peer: no split at all
    assert not pk["available"] and pk["at"] is None
    assert all(pk[key] is None for key in ("dist_us", "io_wait_us", "other_us", "total_us", "dist_share"))
    result = {"params": {"k": 10}, "summary": summary, "comparisons": {}, "builds": {}, "roofline": roof}
    text = bench.format_report(result)
    assert "Roofline (per query, µs) at recall@10 = 0.95" in text
    rows = {line.split()[0]: line.split()[1:] for line in text.splitlines()
            if line.split() and line.split()[0] in summary and len(line.split()) == 6}
    assert rows["nearline"] == ["150", "400", "150", "700", "21%"]
    assert rows["nodist"] == ["n/a", "200", "n/a", "600", "n/a"]
    assert rows["diskannpy"] == ["n/a"] * 5
    assert "roofline nearline: interpolated between L 20 and 40; from the closed-loop latency run" in text
    assert "roofline nodist: L 20, recall 0.9000 (the nearest to the target; no bracket)" in text
    assert "distance time unavailable (distance + other = 400 µs)" in text
    out = plots.plot_roofline(roof, tmp_path / "p-roofline.png", title="t")
    assert out is not None and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Peers only: nothing to draw, no file.
    assert plots.plot_roofline({"diskannpy": pk}, tmp_path / "none.png") is None
    assert not (tmp_path / "none.png").exists()


def test_run_bench_roofline_with_fake_engine(tmp_path, monkeypatch):
    """End to end with the fake engine: the JSON's roofline is the mean of the stats the
    engine returned, other = total - distance - I/O wait; a variant on an engine without
    dist_us shows distance as unavailable; the plot gets its -roofline.png."""
    pytest.importorskip("matplotlib")
    ds = datasets.load_dataset("synthetic:1000:8", tmp_path)

    def fake_build(data, path, **kw):
        Path(path).mkdir()
        return _FakeBuilt(datasets.read_vectors(data))

    def fake_open(path, **kw):  # the variant "nodist" opens with entry_points=3
        return (_FakeIndexNoDist if kw.get("entry_points") == 3 else _FakeIndex)(ds.base)

    monkeypatch.setattr(nearline, "build", fake_build, raising=False)
    monkeypatch.setattr(nearline, "open", fake_open, raising=False)
    monkeypatch.setattr(bench, "run_worker", lambda spec, log_path=None, timeout_s=None: json.loads(
        json.dumps(peers.jsonable(_bench_worker.run(json.loads(json.dumps(spec)))))))
    cfg = bench.BenchConfig(data="synthetic:1000:8", systems=["nearline"], variants=["nodist:entry_points=3"],
                            Ls=[10, 20], k=10, R=16, build_L=24, threads=1, reps=2, workdir=tmp_path, warmup=0,
                            latency_queries=50, ceiling=False, peer_threads=[], target_recalls=[0.9],
                            out=tmp_path / "r.json", plot=tmp_path / "p.png")
    res = bench.run_bench(cfg, progress=False)
    saved = json.loads((tmp_path / "r.json").read_text())
    i = np.arange(50.0)  # the latency run's 50 queries, one per worker
    r = saved["roofline"]["nearline"]
    assert r["available"] and r["target_recall"] == 0.9
    assert r["dist_us"] == pytest.approx(3 * i.mean()) and r["io_wait_us"] == pytest.approx(5 * i.mean())
    assert r["total_us"] == pytest.approx(10 * i.mean())
    assert r["other_us"] == pytest.approx(r["total_us"] - r["dist_us"] - r["io_wait_us"])
    assert r["dist_share"] == pytest.approx(0.3)
    assert r["source"] == "closed-loop latency run, 1 query in flight per worker"
    nd = saved["roofline"]["nodist"]
    assert nd["available"] and nd["dist_us"] is None and nd["other_us"] is None and nd["dist_share"] is None
    assert nd["io_wait_us"] == pytest.approx(5 * i.mean()) and nd["non_io_us"] == pytest.approx(5 * i.mean())
    text = bench.format_report(res)
    assert "Roofline (per query, µs) at recall@10 = 0.90" in text
    assert any(line.split() == ["nodist", "n/a", f"{5 * i.mean():.0f}", "n/a", f"{10 * i.mean():.0f}", "n/a"]
               for line in text.splitlines())
    assert (tmp_path / "p.png").exists()
    assert (tmp_path / "p-roofline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_matched_ratios_latency_and_disk():
    a = {"points": [{"recall": 0.9, "qps": 1000.0, "mean_reads": 10.0, "lat_mean_ms": 1.0, "lat_p999_ms": 4.0,
                     "disk_util": 0.5},
                    {"recall": 1.0, "qps": 100.0, "mean_reads": 30.0, "lat_mean_ms": 3.0, "lat_p999_ms": 8.0,
                     "disk_util": 0.7}]}
    b = {"points": [{"recall": 0.9, "qps": 500.0, "mean_reads": 20.0, "lat_mean_ms": 2.0, "lat_p999_ms": 10.0},
                    {"recall": 1.0, "qps": 50.0, "mean_reads": 40.0, "lat_mean_ms": 4.0, "lat_p999_ms": 20.0}]}
    r = bench.matched_ratios(a, b, [0.95])["0.95"]
    assert r["qps_ratio"] == pytest.approx(2.0)
    assert r["reads_ratio"] == pytest.approx(20.0 / 30.0)
    assert r["lat_mean_ratio"] == pytest.approx(2.0 / 3.0)
    assert r["lat_p999_ratio"] == pytest.approx(6.0 / 15.0)
    assert r["disk_util_a"] == pytest.approx(0.6) and r["disk_util_b"] is None and r["disk_util_ratio"] is None


def test_add_disk_utilisation():
    pts = [{"qps": 1000.0, "mean_reads": 20.0}, {"qps": 500.0, "mean_reads": None}, {"qps": 10.0, "mean_reads": 0.0}]
    bench.add_disk_utilisation(pts, 40000.0)
    assert pts[0]["achieved_reads_per_s"] == 20000.0 and pts[0]["disk_util"] == 0.5
    assert pts[1]["achieved_reads_per_s"] is None and pts[1]["disk_util"] is None
    assert pts[2]["disk_util"] == 0.0
    bench.add_disk_utilisation(pts, None)
    assert pts[0]["achieved_reads_per_s"] == 20000.0 and pts[0]["disk_util"] is None


# --------------------------------------------------------------------------- disk ceiling


@pytest.mark.io_engine
def test_measure_read_ceiling_on_a_file_and_an_index(tmp_path, small_index):
    import os

    f = tmp_path / "blocks.bin"
    f.write_bytes(bytes(range(256)) * 16 * 64)  # 64 blocks of 4 KiB
    r = nearline.measure_read_ceiling(f, seconds=0.1, depth=4)
    assert r["reads"] > 0 and r["reads_per_s"] > 0 and r["bytes"] == r["reads"] * 4096
    assert r["file_blocks"] == 64 and r["depth"] == 4 and r["engine"] in ("io_uring", "pread")
    # Latency percentiles (nearest rank) are ordered and within the run; stalls
    # are counted spans no longer than the run in all.
    assert 0 < r["latency_p50_us"] <= r["latency_p99_us"] <= r["latency_p999_us"] <= r["latency_max_us"]
    assert r["latency_max_us"] <= r["elapsed_s"] * 1e6 + 1
    assert isinstance(r["stalls"], int) and 0 <= r["stall_s"] <= r["elapsed_s"]
    assert (r["stalls"] == 0) == (r["stall_s"] == 0)
    if os.environ.get("NEARLINE_IO") == "pread":  # the engine's own fallback rules apply
        assert r["engine"] == "pread"
    assert nearline.measure_read_ceiling(f, 8192, 2, 0.05, io="pread")["engine"] == "pread"
    # An index directory: its pages.bin, read in blocks of the index's read size.
    r = nearline.measure_read_ceiling(small_index, seconds=0.05)
    info = json.loads((Path(small_index) / "manifest.json").read_text())["layout"]
    assert r["path"].endswith("pages.bin") and r["block_size"] == info["block_size"]
    assert r["file_blocks"] == info["n_blocks"] and r["reads_per_s"] > 0


@pytest.mark.parametrize("kw, exc, match", [
    ({"depth": 0}, ValueError, "depth=0"),
    ({"depth": 257}, ValueError, "depth=257"),
    ({"block_size": 5000}, ValueError, "multiple of 4096"),
    ({"block_size": 0}, ValueError, "block_size=0"),
    ({"seconds": 0}, ValueError, "seconds=0"),
    ({"seconds": -2.0}, ValueError, "seconds=-2"),
    ({"seconds": float("nan")}, ValueError, "seconds=nan"),
    ({"seconds": "3"}, TypeError, "seconds must be a number"),
    ({"io": "mmap"}, ValueError, "unknown io engine"),
])
def test_measure_read_ceiling_rejects_bad_arguments(tmp_path, kw, exc, match):
    f = tmp_path / "b.bin"
    f.write_bytes(b"\0" * 8192)
    with pytest.raises(exc, match=match):
        nearline.measure_read_ceiling(f, **kw)


def test_measure_read_ceiling_rejects_bad_files(tmp_path):
    small = tmp_path / "small.bin"
    small.write_bytes(b"\0" * 4000)
    with pytest.raises(ValueError, match="smaller than one block"):
        nearline.measure_read_ceiling(small, seconds=0.05)
    with pytest.raises(ValueError, match="smaller than one block of 8192"):
        nearline.measure_read_ceiling(tmp_path / "small.bin", block_size=8192, seconds=0.05)
    with pytest.raises(FileNotFoundError, match="missing.bin"):
        nearline.measure_read_ceiling(tmp_path / "missing.bin")
    with pytest.raises(ValueError, match="without pages.bin"):
        nearline.measure_read_ceiling(tmp_path)


def test_worker_ceiling_action(tmp_path):
    f = tmp_path / "b.bin"
    f.write_bytes(b"\1" * 4096 * 8)
    res = _bench_worker.run({"action": "ceiling", "path": str(f), "depth": 2, "seconds": 0.05})
    assert res["reads_per_s"] > 0 and res["depth"] == 2 and res["block_size"] == 4096


# --------------------------------------------------------------------------- end to end: two variants, no peers


def test_bench_end_to_end_two_variants(tmp_path):
    cfg = bench.BenchConfig(
        data="synthetic:3000:16", systems=[], variants=["w2:W=2", "r12:R=12,entry_points=32"], Ls=[10, 20, 40],
        k=10, R=16, build_L=32, threads=2, reps=3, workdir=tmp_path, warmup=20, latency_queries=300,
        ceiling_seconds=0.2, ceiling_depth=8, out=tmp_path / "r.json", plot=tmp_path / "p.png",
    )
    res = bench.run_bench(cfg, progress=False)
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["params"]["systems"] == ["w2", "r12"] and saved["params"]["baseline"] == "w2"
    assert [v["name"] for v in saved["params"]["variants"]] == ["w2", "r12"]
    assert saved["summary"]["r12"]["variant"] == {"name": "r12", "build": {"R": 12}, "open": {"entry_points": 32},
                                                  "search": {}}
    # Two build keys -> two indexes, each with its own degree.
    assert saved["summary"]["w2"]["index"] != saved["summary"]["r12"]["index"]
    assert saved["builds"]["r12"]["info"]["R"] == 12 and saved["builds"]["w2"]["info"]["R"] == 16
    ceiling = saved["disk_ceiling"]
    assert len(ceiling["runs"]) == 3 and ceiling["median_reads_per_s"] > 0 and ceiling["depth"] == 8
    assert ceiling["path"].endswith("pages.bin") and ceiling["block_size"] >= 4096
    assert 0 < ceiling["median_latency_p99_us"] <= ceiling["median_latency_p999_us"]
    assert ceiling["median_stalls_per_s"] >= 0
    assert "disk read latency at that depth" in bench.format_report(res)
    for system in ("w2", "r12"):
        assert len(saved["runs"][system]) == 3
        pts = saved["summary"][system]["points"]
        assert [p["L"] for p in pts] == [10, 20, 40]
        for p in pts:
            assert 0 < p["recall"] <= 1 and p["qps"] > 0
            assert p["lat_queries"] == 300 and "engine total_us" in p["latency_source"]
            assert 0 < p["lat_p50_ms"] <= p["lat_p99_ms"] <= p["lat_p999_ms"]
            assert p["mean_io_wait_us"] is not None and p["mean_cpu_us"] > 0
            assert p["mean_reads"] > 0 and p["achieved_reads_per_s"] == pytest.approx(p["qps"] * p["mean_reads"])
            assert p["disk_util"] == pytest.approx(p["achieved_reads_per_s"] / ceiling["median_reads_per_s"])
    # Each repetition's order rotates systems and the ceiling.
    assert [r["rep"] for r in saved["runs"]["w2"]] == [0, 1, 2]
    assert "r12/w2" in saved["comparisons"]
    for row in saved["comparisons"]["r12/w2"]["at_recall"].values():
        assert {"qps_ratio", "reads_ratio", "lat_mean_ratio", "lat_p999_ratio", "disk_util_a"} <= set(row)
    text = bench.format_report(res)
    assert "disk ceiling:" in text and "latency w2: 300 queries per L" in text and "io µs" in text
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The roofline from the engine's own stats (dist_us where this engine reports it).
    assert "Roofline (per query, µs)" in text
    for system in ("w2", "r12"):
        r = saved["roofline"][system]
        assert r["available"] and r["source"] == "closed-loop latency run, 1 query in flight per worker"
        assert r["total_us"] > 0 and 0 <= r["io_wait_us"] <= r["total_us"]
        if r["dist_us"] is None:
            assert r["other_us"] is None and "dist_us" in r["note"]
        else:
            assert r["dist_us"] > 0 and r["other_us"] == pytest.approx(
                max(0.0, r["total_us"] - r["dist_us"] - r["io_wait_us"]))
    assert (tmp_path / "p-roofline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --------------------------------------------------------------------------- a fair peer: diskannpy's best thread count


def test_split_system_and_peer_thread_systems(tmp_path):
    assert peers.split_system("diskannpy") == ("diskannpy", None)
    assert peers.split_system("diskannpy@8") == ("diskannpy", 8)
    for bad, match in (("annoy", "unknown system"), ("hnswlib@4", "only diskannpy take"),
                       ("diskannpy@0", "positive integer"), ("diskannpy@x", "positive integer")):
        with pytest.raises(ValueError, match=match):
            peers.split_system(bad)
    cfg = bench.BenchConfig(data="x", systems=["nearline", "diskannpy"], threads=2, workdir=tmp_path)
    assert cfg.peer_thread_counts() == [4, 8]
    assert cfg.all_systems() == ["nearline", "diskannpy", "diskannpy@4", "diskannpy@8"]
    cfg.peer_threads = [2, 3, 3]  # the bench's own count and repeats add nothing
    assert cfg.peer_thread_systems() == ["diskannpy@3"]
    cfg = bench.BenchConfig(data="x", systems=["nearline", "diskannpy", "diskannpy@16"], threads=1, workdir=tmp_path,
                            peer_threads=[16, 2])
    assert cfg.all_systems() == ["nearline", "diskannpy", "diskannpy@16", "diskannpy@2"]
    cfg.validate()
    assert cfg.baseline_system() == "diskannpy"
    # Range mode compares by doubling k only: no thread sweep.
    cfg = bench.BenchConfig(data="x", systems=["nearline", "diskannpy"], radius=1.0, workdir=tmp_path)
    assert "diskannpy@4" not in cfg.all_systems()
    for kw, match in (({"systems": ["hnswlib@2"]}, "only diskannpy"), ({"peer_threads": [0]}, "--peer-threads")):
        with pytest.raises(ValueError, match=match):
            bench.BenchConfig(**{"data": "x", "systems": ["nearline", "diskannpy"], "workdir": tmp_path,
                                 **kw}).validate()


def _curve(*pts):
    return {"points": [{"L": 10 * (i + 1), "recall": r, "qps": q} for i, (r, q) in enumerate(pts)]}


def test_best_peer_ratios_and_report():
    summary = {
        "nearline": _curve((0.85, 3000.0), (0.95, 2000.0), (0.99, 1000.0)),
        "w8": _curve((0.85, 2500.0), (0.95, 1500.0), (0.99, 900.0)),
        "diskannpy": _curve((0.85, 1500.0), (0.95, 1000.0), (0.99, 500.0)),
        "diskannpy@4": _curve((0.85, 2000.0), (0.95, 1600.0), (0.985, 700.0)),
        "diskannpy@8": _curve((0.85, 1800.0), (0.95, 1250.0), (0.99, 600.0)),
        "hnswlib": _curve((0.85, 9000.0), (0.99, 8000.0)),
    }
    systems = ["nearline", "w8", "diskannpy", "hnswlib", "diskannpy@4", "diskannpy@8"]
    best = bench.best_peer_ratios(summary, systems, ["nearline", "w8"], 2, [0.95, 0.99])
    assert set(best) == {"diskannpy"}
    fam = best["diskannpy"]
    assert fam["threads"] == {"diskannpy": 2, "diskannpy@4": 4, "diskannpy@8": 8}
    row = fam["at_recall"]["0.95"]
    assert row["best"] == "diskannpy@4" and row["best_threads"] == 4 and row["equal_threads"] == "diskannpy"
    assert row["ratios"]["nearline"]["qps_ratio_best"] == pytest.approx(2000 / 1600)
    assert row["ratios"]["nearline"]["qps_ratio_equal_threads"] == pytest.approx(2.0)
    assert row["ratios"]["w8"]["qps_ratio_best"] == pytest.approx(1500 / 1600)
    # At 0.99 diskannpy@4 does not reach the target: the best of those that do.
    row = best["diskannpy"]["at_recall"]["0.99"]
    assert row["qps"]["diskannpy@4"] is None and row["best"] == "diskannpy@8"
    assert row["ratios"]["nearline"]["qps_ratio_best"] == pytest.approx(1000 / 600)
    # One member only: nothing to choose from.
    assert bench.best_peer_ratios(summary, ["nearline", "diskannpy"], ["nearline"], 2, [0.95]) == {}
    result = {"params": {"k": 10, "threads": 2}, "summary": summary, "comparisons": {}, "builds": {},
              "best_peer": best}
    text = bench.format_report(result)
    assert ("QPS ratio nearline/best diskannpy @ recall 0.95 = 1.25 (best: diskannpy@4, 4 threads; "
            "QPS diskannpy 1000, diskannpy@4 1600, diskannpy@8 1250); at equal threads (diskannpy) = 2.00") in text
    assert "diskannpy at its best thread count" in text


def test_bench_diskannpy_at_its_best_thread_count(tmp_path):
    """End to end on tiny data: diskannpy at the bench's thread count and at 2x and 4x it, one index,
    the same alternation; the best-peer ratios in the summary, the report and the JSON."""
    pytest.importorskip("diskannpy")
    cfg = bench.BenchConfig(data="synthetic:2000:16", systems=["nearline", "diskannpy"], Ls=[10, 20, 40], k=10,
                            R=16, build_L=32, pq_bytes=8, threads=1, reps=1, workdir=tmp_path, warmup=10,
                            latency_queries=20, ceiling=False, target_recalls=[0.95], out=tmp_path / "r.json")
    res = bench.run_bench(cfg, progress=False)
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["params"]["systems"] == ["nearline", "diskannpy", "diskannpy@2", "diskannpy@4"]
    assert saved["params"]["peer_threads"] == [2, 4]
    # One diskannpy index, searched at 1, 2 and 4 threads; the extra runs skip the latency run.
    keys = {saved["summary"][s]["index"] for s in ("diskannpy", "diskannpy@2", "diskannpy@4")}
    assert len(keys) == 1
    assert [saved["runs"][s][0]["threads"] for s in ("nearline", "diskannpy", "diskannpy@2", "diskannpy@4")] == \
        [1, 1, 2, 4]
    assert saved["summary"]["diskannpy"]["points"][0]["lat_queries"] == 20
    assert saved["summary"]["diskannpy@4"]["points"][0].get("lat_queries") is None
    for s in ("diskannpy@2", "diskannpy@4"):
        assert all(p["qps"] > 0 and 0 < p["recall"] <= 1 for p in saved["summary"][s]["points"])
    fam = saved["best_peer"]["diskannpy"]
    assert fam["threads"] == {"diskannpy": 1, "diskannpy@2": 2, "diskannpy@4": 4}
    row = fam["at_recall"]["0.95"]
    best_qps = max(q for q in row["qps"].values() if q is not None)
    assert row["qps"][row["best"]] == best_qps
    r = row["ratios"]["nearline"]
    assert r["qps_ratio_best"] == pytest.approx(r["qps"] / best_qps)
    assert r["qps_ratio_best"] <= r["qps_ratio_equal_threads"] + 1e-12
    text = bench.format_report(res)
    assert "QPS ratio nearline/best diskannpy @ recall 0.95 = " in text
    assert "build diskannpy@4" in text and "the index of diskannpy" in text
    # Runs of one index compare no builds.
    assert "build time ratio diskannpy@2/diskannpy" not in text and "build time ratio nearline/diskannpy" in text


def test_worker_records_what_a_search_borrowed_from_the_cache(tmp_path):
    """Each nearline point carries the index's borrow counters after its batch: at a budget whose workers'
    share holds L 10 but not L 600, the L 600 batch borrows from the cache and the point says so."""
    ds = datasets.materialize(datasets.load_dataset("synthetic:3000:32", tmp_path, queries=50), tmp_path, 10)
    nearline.build(ds.base, tmp_path / "i", preset="diskann", R=16, build_L=32, memory_budget=1_000_000,
                   threads=2).close()
    res = _bench_worker.run({"action": "search", "system": "nearline", "index_dir": str(tmp_path / "i"),
                             "queries": str(ds.queries_path), "gt": str(ds.gt_path), "k": 10, "Ls": [10, 600],
                             "params": {"threads": 2, "W": 4}, "warmup": 0,
                             "variant": {"open": {"memory_budget": 1_000_000}, "search": {"queries_in_flight": 1}}})
    small, large = res["points"]
    assert small["cache_borrows"] == 0 and small["cache_planned_bytes"] > 0
    assert large["cache_borrows"] >= 1 and 0 < large["cache_borrowed_peak_bytes"] < large["cache_planned_bytes"]
    assert large["recall"] >= small["recall"]
