"""Tests of the nearline command line (engine calls monkeypatched with fakes)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

import nearline  # noqa: E402
from nearline import cli, datasets  # noqa: E402


class FakeIndex:
    """Exact search over an array, with per-query stats, mimicking nearline.Index."""

    def __init__(self, base, info=None):
        self.base = base
        self._info = info or {"n": len(base), "dim": base.shape[1], "dtype": "float32", "metric": "l2",
                              "preset": "balanced", "R": 64, "pq_bytes": 16, "page_size": 4096,
                              "records_per_page": 8, "memory": {"pq_codes": 2048, "total": 4096},
                              "build": {"seconds": 1.5}}
        self.closed = False

    def plan_search(self, nq=1, **opts):
        self.last_plan = opts
        return {"L": opts.get("L") or max(opts.get("k", 10), 100), "W": opts.get("W") or 4,
                "executor": opts.get("executor") or "beam", "page_search": opts.get("page_search") or "targets",
                "queries_in_flight": opts.get("queries_in_flight") or 4, "threads": opts.get("threads") or 2}

    def search(self, queries, k=10, *, L=None, W=None, threads=None, return_stats=False, executor=None,
               adaptive_beam=None, early_dispatch=None, queries_in_flight=None, page_search=None, sigma=None):
        self.last_search = {"executor": executor, "adaptive_beam": adaptive_beam,
                            "early_dispatch": early_dispatch, "queries_in_flight": queries_in_flight,
                            "page_search": page_search, "sigma": sigma}
        ids, d = datasets.brute_force_ground_truth(self.base, np.asarray(queries, np.float32), k)
        nq = len(queries)
        stats = {"hops": np.full(nq, 7), "reads": np.full(nq, 21), "total_us": np.full(nq, 100.0),
                 "io_utilisation": np.full(nq, 0.25)}
        return (ids, d, stats) if return_stats else (ids, d)

    def info(self):
        return self._info

    def close(self):
        self.closed = True

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.close()


@pytest.fixture
def engine(monkeypatch):
    """Fake engine functions on the nearline module; returns a dict of recorded calls."""
    calls: dict = {}
    base, queries = datasets.synthetic_clustered(300, 8, queries=20, seed=1)

    def build(data, path, **kw):
        calls["build"] = (data, path, kw)
        if isinstance(data, np.ndarray):
            calls["built"] = data
        if kw.get("progress"):
            kw["progress"]("graph", 5, 10)
            kw["progress"]("graph", 10, 10)
            kw["progress"]("layout", 1, 1)
        return FakeIndex(base)

    def open_(path, **kw):
        calls["open"] = (path, kw)
        return FakeIndex(calls.get("built", base))

    def gt(b, q, k, metric="l2", threads=None):
        calls["gt"] = (k, metric)
        return datasets.brute_force_ground_truth(b, q, k, metric)

    monkeypatch.setattr(nearline, "build", build, raising=False)
    monkeypatch.setattr(nearline, "open", open_, raising=False)
    monkeypatch.setattr(nearline, "read_vectors", lambda p, dtype=None: datasets.read_vectors(p), raising=False)
    monkeypatch.setattr(nearline, "read_ground_truth", datasets.read_ground_truth, raising=False)
    monkeypatch.setattr(nearline, "write_ground_truth", datasets.write_ground_truth, raising=False)
    monkeypatch.setattr(nearline, "compute_ground_truth", gt, raising=False)
    calls["base"], calls["queries"] = base, queries
    return calls


def _files(tmp_path, engine):
    b = datasets.write_bin(tmp_path / "b.fbin", engine["base"])
    q = datasets.write_bin(tmp_path / "q.fbin", engine["queries"])
    ids, d = datasets.brute_force_ground_truth(engine["base"], engine["queries"], 10)
    g = datasets.write_ground_truth(tmp_path / "gt.bin", ids, d)
    return str(b), str(q), str(g)


# --------------------------------------------------------------------------- argument errors


@pytest.mark.parametrize("argv", [
    [], ["frobnicate"], ["build", "only-one"], ["search", "i", "q", "--k", "0"],
    ["bench", "--data", "x", "--L", "10,abc"], ["bench", "--data", "x", "--compare", "annoy"],
    ["build", "d", "o", "--memory-budget", "1.5"], ["build", "d", "o", "--metric", "hamming"], ["bench"],
    ["search", "i", "q", "--executor", "warp"], ["search", "i", "q", "--early-dispatch", "0"],
    ["search", "i", "q", "--early-dispatch", "1.5"], ["search", "i", "q", "--early-dispatch", "nan"],
    ["search", "i", "q", "--queries-in-flight", "0"], ["search", "i", "q", "--queries-in-flight", "65"],
    ["search", "i", "q", "--queries-in-flight", "many"], ["search", "i", "q", "--io", "mmap"],
    ["search", "i", "q", "--radius", "nan"], ["search", "i", "q", "--sigma", "0"], ["search", "i", "q", "--sigma", "2"],
    ["search", "i", "q", "--page-search", "pages"], ["build", "d", "o", "--layout", "random"],
    ["bench", "--data", "x", "--compare", "hnswlib@2"], ["bench", "--data", "x", "--compare", "diskannpy@0"],
    ["bench", "--data", "x", "--peer-threads", "0"],
    ["build", "d", "o", "--shuffle", "metis"], ["search", "i", "q", "--range-ratio", "0"],
])
def test_bad_arguments_are_argparse_errors(argv, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2
    assert "usage:" in capsys.readouterr().err


def test_parser_values():
    a = cli.build_parser().parse_args(["bench", "--data", "synthetic:100:4", "--compare", "diskannpy,hnswlib",
                                       "--L", "10,20", "--memory-budget", "512MB", "--cache-budget", "0.25"])
    assert a.compare == ["diskannpy", "hnswlib"] and a.L == [10, 20]
    assert a.memory_budget == ["512MB"] and a.cache_budget == 0.25
    a = cli.build_parser().parse_args(["bench", "--data", "x", "--memory-budget", "0.1,0.2,1GiB"])
    assert a.memory_budget == [0.1, 0.2, "1GiB"]
    a = cli.build_parser().parse_args(["build", "d", "o", "--build-L", "50", "--memory-budget", "1000000"])
    # Options not given are left to the engine (its defaults are in the help).
    assert a.build_L == 50 and a.memory_budget == 1_000_000 and a.R is None
    help_text = cli.build_parser()._subparsers._group_actions[0].choices["build"].format_help()
    # The engine's defaults, rendered from its presets (R 64, build L 100 in every graph preset).
    help_text = " ".join(help_text.split())
    assert "maximum graph degree (default: the preset's, 64)" in help_text
    assert "build candidate list size (default: the preset's, 100)" in help_text


# --------------------------------------------------------------------------- engine errors


def test_engine_error_is_one_line_exit_2(engine, monkeypatch, capsys):
    def boom(path, **kw):
        raise ValueError("idx/header.json: field 'version': expected 1,\n got 7")

    monkeypatch.setattr(nearline, "open", boom, raising=False)
    assert cli.main(["info", "idx"]) == 2
    err = capsys.readouterr().err
    assert err == "nearline: error: idx/header.json: field 'version': expected 1, got 7\n"
    assert "Traceback" not in err


def test_os_error_names_file(engine, monkeypatch, capsys):
    def missing(path, **kw):
        raise FileNotFoundError(2, "No such file or directory", path)

    monkeypatch.setattr(nearline, "open", missing, raising=False)
    assert cli.main(["info", "nowhere"]) == 2
    assert "nowhere" in capsys.readouterr().err


def test_debug_shows_traceback(engine, monkeypatch):
    monkeypatch.setattr(nearline, "open", lambda p, **kw: (_ for _ in ()).throw(ValueError("bad")), raising=False)
    with pytest.raises(ValueError, match="bad"):
        cli.main(["--debug", "info", "idx"])


def test_build_ctrl_c_exits_130(engine, monkeypatch, tmp_path, capsys):
    def interrupted(data, path, **kw):
        kw["progress"]("graph", 1, 10)
        raise KeyboardInterrupt

    monkeypatch.setattr(nearline, "build", interrupted, raising=False)
    assert cli.main(["-q", "build", "d.fbin", str(tmp_path / "o")]) == 130
    assert "build cancelled" in capsys.readouterr().err


# --------------------------------------------------------------------------- commands


def test_build_passes_options(engine, tmp_path, capsys):
    b, _, _ = _files(tmp_path, engine)
    ids_file = tmp_path / "ids.npy"
    np.save(ids_file, np.arange(300, dtype=np.int64) + 1000)
    rc = cli.main(["build", b, str(tmp_path / "idx"), "--metric", "ip", "--R", "32", "--build-L", "80",
                   "--alpha", "1.1", "--pq-bytes", "16", "--memory-budget", "2GiB", "--page-size", "8192",
                   "--threads", "2", "--seed", "9", "--ids", str(ids_file), "--overwrite"])
    assert rc == 0
    data, path, kw = engine["build"]
    assert data == b and path == str(tmp_path / "idx")
    assert kw["metric"] == "ip" and kw["R"] == 32 and kw["build_L"] == 80 and kw["alpha"] == 1.1
    assert kw["pq_bytes"] == 16 and kw["memory_budget"] == "2GiB" and kw["page_size"] == 8192
    assert kw["threads"] == 2 and kw["seed"] == 9 and kw["overwrite"] is True
    assert np.array_equal(kw["ids"], np.arange(300) + 1000) and callable(kw["progress"])
    assert "built" in capsys.readouterr().out


def test_search_reports_recall_and_writes(engine, tmp_path, capsys):
    _, q, g = _files(tmp_path, engine)
    out = tmp_path / "res.npz"
    assert cli.main(["search", "idx", q, "--k", "5", "--gt", g, "--out", str(out), "--memory-budget", "0"]) == 0
    text = capsys.readouterr().out
    assert "recall@5" in text and "1.0000" in text and "mean reads" in text
    z = np.load(out)
    assert z["ids"].shape == (20, 5) and "stats_reads" in z
    assert engine["open"][1]["memory_budget"] == 0
    assert cli.main(["search", "idx", q, "--k", "10", "--gt", g, "--json", "--out", str(tmp_path / "r.json")]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["recall@10"] == 1.0 and summary["mean"]["reads"] == 21 and summary["latency_ms"]["p99"] == 0.1
    assert len(json.loads((tmp_path / "r.json").read_text())["ids"]) == 20


def test_search_executor_options_reach_the_index(engine, tmp_path, capsys, monkeypatch):
    _, q, g = _files(tmp_path, engine)
    opened, opened_kw = [], []
    real_open = nearline.open

    def open_(path, **kw):
        idx = real_open(path, **kw)
        opened.append(idx)
        opened_kw.append(kw)
        return idx

    monkeypatch.setattr(nearline, "open", open_, raising=False)
    assert cli.main(["search", "idx", q, "--k", "5", "--json"]) == 0
    # Options not given reach the engine as None (its planner chooses).
    assert opened[-1].last_search == {"executor": None, "adaptive_beam": None, "early_dispatch": None,
                                      "queries_in_flight": None, "page_search": None, "sigma": None}
    capsys.readouterr()
    assert cli.main(["search", "idx", q, "--k", "5", "--gt", g, "--json", "--executor", "beam", "--adaptive-beam",
                     "--early-dispatch", "0.5", "--queries-in-flight", "8", "--page-search", "block",
                     "--sigma", "0.5"]) == 0
    assert opened[-1].last_search == {"executor": "beam", "adaptive_beam": True, "early_dispatch": 0.5,
                                      "queries_in_flight": 8, "page_search": "block", "sigma": 0.5}
    summary = json.loads(capsys.readouterr().out)
    assert summary["executor"] == "beam" and summary["queries_in_flight"] == 8 and summary["recall@5"] == 1.0
    assert cli.main(["search", "idx", q, "--executor", "pipeline", "--json"]) == 0
    assert opened[-1].last_search["executor"] == "pipeline"
    assert cli.main(["search", "idx", q, "--queries-in-flight", "AUTO", "--json"]) == 0
    assert opened[-1].last_search["queries_in_flight"] == "auto"
    assert cli.main(["search", "idx", q, "--io", "uring-poll", "--json"]) == 0
    assert opened_kw[-1]["io"] == "uring-poll"


def test_gt_command(engine, tmp_path, capsys):
    b, q, _ = _files(tmp_path, engine)
    assert cli.main(["gt", b, q, str(tmp_path / "g.bin"), "--k", "7", "--metric", "cosine"]) == 0
    ids, d = datasets.read_ground_truth(tmp_path / "g.bin")
    assert ids.shape == (20, 7) and engine["gt"] == (7, "cosine")


def test_info_table_and_json(engine, capsys):
    assert cli.main(["info", "idx"]) == 0
    text = capsys.readouterr().out
    assert "memory.total" in text and "4.0 KiB" in text and "build.seconds" in text
    assert cli.main(["info", "idx", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["memory"]["total"] == 4096


def test_demo(engine, tmp_path, capsys):
    assert cli.main(["-q", "demo", "--n", "300", "--dim", "8", "--workdir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for key in ("recall@10", "QPS", "mean reads/query", "mean hops", "build time"):
        assert key in out
    assert "1.0000" in out  # the fake engine searches exactly


def test_bench_wires_config(engine, monkeypatch, tmp_path, capsys):
    from nearline import bench

    seen = {}

    def fake_run(cfg, progress=True):
        seen["cfg"] = cfg
        return {"params": {"k": cfg.k}, "summary": {}, "comparisons": {}, "builds": {}}

    monkeypatch.setattr(bench, "run_bench", fake_run)
    assert cli.main(["-q", "bench", "--data", "synthetic:100:4", "--compare", "diskannpy,faiss-hnsw",
                     "--L", "10,30", "--reps", "5", "--queries-repeat", "3", "--workdir", str(tmp_path)]) == 0
    cfg = seen["cfg"]
    assert cfg.systems == ["nearline", "diskannpy", "faiss-hnsw"] and cfg.Ls == [10, 30]
    assert cfg.reps == 5 and cfg.queries_repeat == 3 and cfg.workdir == tmp_path
    assert cfg.peer_threads is None  # default: 2x and 4x --threads
    assert cli.main(["-q", "bench", "--data", "synthetic:100:4", "--compare", "diskannpy,diskannpy@16",
                     "--peer-threads", "3,6", "--workdir", str(tmp_path)]) == 0
    assert seen["cfg"].systems == ["nearline", "diskannpy", "diskannpy@16"] and seen["cfg"].peer_threads == [3, 6]
    assert cli.main(["-q", "bench", "--data", "synthetic:100:4", "--peer-threads", "none",
                     "--workdir", str(tmp_path)]) == 0
    assert seen["cfg"].peer_threads == []


def test_entry_options_are_passed(engine, monkeypatch, tmp_path, capsys):
    from nearline import bench

    b, q, _ = _files(tmp_path, engine)
    assert cli.main(["build", b, str(tmp_path / "idx"), "--nav-sample", "0.01", "--entry-clusters", "300"]) == 0
    kw = engine["build"][2]
    assert kw["nav_sample"] == 0.01 and kw["entry_clusters"] == 300
    assert cli.main(["search", "idx", q, "--entry", "nav", "--nav-L", "64", "--nav-seeds", "8"]) == 0
    kw = engine["open"][1]
    assert kw["entry"] == "nav" and kw["nav_L"] == 64 and kw["nav_seeds"] == 8 and "entry_points" not in kw
    assert "entry" in capsys.readouterr().out
    seen = {}

    def fake_run(cfg, progress=True):
        seen["cfg"] = cfg
        return {"params": {"k": cfg.k}, "summary": {}, "comparisons": {}, "builds": {}}

    monkeypatch.setattr(bench, "run_bench", fake_run)
    assert cli.main(["-q", "bench", "--data", "synthetic:100:4", "--compare", "hnswlib", "--entry", "centroids",
                     "--nav-sample", "0.02", "--entry-clusters", "50", "--workdir", str(tmp_path)]) == 0
    cfg = seen["cfg"]
    assert cfg.entry == "centroids" and cfg.nav_sample == 0.02 and cfg.entry_clusters == 50
    p = cfg.params()
    assert p.entry == "centroids" and p.nav_sample == 0.02 and p.entry_clusters == 50


@pytest.mark.parametrize("argv", [
    ["build", "a", "b", "--nav-sample", "x"],
    ["build", "a", "b", "--nav-sample", "nan"],
    ["build", "a", "b", "--entry-clusters", "-3"],
    ["search", "i", "q", "--entry", "bogus"],
    ["search", "i", "q", "--nav-seeds", "0"],
])
def test_bad_entry_arguments_are_argparse_errors(argv, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2


def test_bench_wires_variants_baseline_latency_and_ceiling(engine, monkeypatch, tmp_path):
    from nearline import bench

    seen = {}

    def fake_run(cfg, progress=True):
        seen["cfg"] = cfg
        return {"params": {"k": cfg.k}, "summary": {}, "comparisons": {}, "builds": {}}

    monkeypatch.setattr(bench, "run_bench", fake_run)
    assert cli.main(["-q", "bench", "--data", "synthetic:100:4", "--compare", "diskannpy", "--variant", "w8:W=8",
                     "--variant", "sat:saturate=true,R=32,cache_nodes=100", "--baseline", "nearline",
                     "--target-recall", "0.9,0.97", "--latency-queries", "20000", "--perturb", "0.02",
                     "--ceiling-depth", "64", "--ceiling-seconds", "1.5", "--workdir", str(tmp_path)]) == 0
    cfg = seen["cfg"]
    assert [v.name for v in cfg.variants] == ["w8", "sat"]
    assert cfg.variants[0].search == {"W": 8}
    assert cfg.variants[1].build == {"saturate": True, "R": 32} and cfg.variants[1].open == {"cache_nodes": 100}
    # diskannpy also runs at 2x and 4x the bench's threads (all cores by default).
    from nearline import peers

    n = peers.env_threads(None)
    assert cfg.peer_thread_systems() == [f"diskannpy@{2 * n}", f"diskannpy@{4 * n}"]
    assert cfg.all_systems() == ["nearline", "w8", "sat", "diskannpy", *cfg.peer_thread_systems()]
    assert cfg.baseline_system() == "nearline"
    assert cfg.target_recalls == [0.9, 0.97] and cfg.latency_queries == 20000 and cfg.perturb == 0.02
    assert cfg.ceiling and cfg.ceiling_depth == 64 and cfg.ceiling_seconds == 1.5
    # Defaults: 10,000 latency queries, ceiling on at depth 32 for 3 s, the standard targets.
    assert cli.main(["-q", "bench", "--data", "synthetic:100:4", "--skip-nearline", "--compare", "",
                     "--variant", "only:W=2", "--no-ceiling", "--workdir", str(tmp_path)]) == 0
    cfg = seen["cfg"]
    assert cfg.systems == [] and cfg.all_systems() == ["only"] and not cfg.ceiling
    assert cfg.latency_queries == 10000 and cfg.ceiling_depth == 32 and cfg.ceiling_seconds == 3.0
    assert cfg.target_recalls == [0.90, 0.95, 0.99]


@pytest.mark.parametrize("extra, match", [
    (["--variant", "x:beam=2"], "unknown key 'beam'"),
    (["--variant", "x:W"], "not key=value"),
    (["--variant", "diskannpy:W=2"], "is taken"),
    (["--target-recall", "0.9,1.2"], "recalls in"),
    (["--ceiling-depth", "0"], "positive integer"),
    (["--ceiling-depth", "300"], "1..256"),
    (["--ceiling-seconds", "0"], "positive number"),
    (["--latency-queries", "-5"], "must be >= 0"),
    (["--perturb", "-1"], ">= 0"),
])
def test_bench_bad_new_options_are_argparse_errors(extra, match, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", "--data", "synthetic:100:4", *extra])
    assert e.value.code == 2
    assert match in capsys.readouterr().err


def test_bench_unknown_baseline_is_one_line_error(tmp_path, capsys):
    assert cli.main(["bench", "--data", "synthetic:100:4", "--compare", "", "--baseline", "nope",
                     "--workdir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("nearline: error: --baseline 'nope' is not one of the systems: nearline")


def test_disk_ceiling_command(tmp_path, capsys):
    f = tmp_path / "pages.bin"
    f.write_bytes(b"\0" * 4096 * 16)
    assert cli.main(["disk-ceiling", str(f), "--depth", "4", "--seconds", "0.05"]) == 0
    out = capsys.readouterr().out
    assert "reads/s" in out and "queue depth" in out and "engine" in out
    assert "read latency p50/p99/p99.9/max" in out and "stalls (≥ 10 ms" in out
    assert cli.main(["disk-ceiling", str(tmp_path / "pages.bin"), "--depth", "2", "--seconds", "0.05",
                     "--block-size", "8192", "--io", "pread", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["reads_per_s"] > 0 and r["block_size"] == 8192 and r["engine"] == "pread" and r["file_blocks"] == 8
    assert 0 < r["latency_p50_us"] <= r["latency_p99_us"] <= r["latency_p999_us"] <= r["latency_max_us"]
    assert r["stalls"] >= 0 and 0 <= r["stall_s"] <= r["elapsed_s"]


@pytest.mark.parametrize("argv, match", [
    (["disk-ceiling"], "usage:"),
    (["disk-ceiling", "f", "--depth", "0"], "positive integer"),
    (["disk-ceiling", "f", "--depth", "257"], "1..256"),
    (["disk-ceiling", "f", "--block-size", "5000"], "multiple of 4096"),
    (["disk-ceiling", "f", "--seconds", "-1"], "positive number"),
])
def test_disk_ceiling_bad_arguments(argv, match, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2 and match in capsys.readouterr().err


def test_disk_ceiling_engine_errors_are_one_line(tmp_path, capsys):
    small = tmp_path / "small.bin"
    small.write_bytes(b"\0" * 100)
    assert cli.main(["disk-ceiling", str(small), "--seconds", "0.05"]) == 2
    assert "smaller than one block" in capsys.readouterr().err
    assert cli.main(["disk-ceiling", str(tmp_path / "none.bin")]) == 2
    assert "none.bin" in capsys.readouterr().err


def test_progress_callback_bars():
    p = cli._Progress(True)
    p("graph", 1, 4)
    p("graph", 4, 4)
    assert p.bar.n == 4 and p.bar.total == 4
    p("layout", 0, 0)
    assert p.stage == "layout"
    p.close()
    assert p.bar is None


# --------------------------------------------------------------------------- help, version, global flags


def _subparsers():
    parser = cli.build_parser()
    return parser, parser._subparsers._group_actions[0].choices


def test_every_option_has_help_with_its_default():
    """Every option of every command says what it does and what it defaults to (flags: off)."""
    import argparse

    parser, subs = _subparsers()
    missing = []
    for name, p in [("nearline", parser), *subs.items()]:
        fmt = p._get_formatter()
        for a in p._actions:
            if isinstance(a, (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)):
                continue
            text = fmt._get_help_string(a) if a.help else ""
            if not text or (a.option_strings and "default" not in text and not a.required):
                missing.append(f"{name} {'/'.join(a.option_strings) or a.dest}")
    assert not missing, missing
    # Defaults come from the engine, e.g. R and build_L.
    build_help = " ".join(subs["build"].format_help().split())
    assert f"(default: the preset's, {nearline.DEFAULTS['presets']['diskann']['R']})" in build_help
    assert "(default: off)" in build_help  # --overwrite


def test_choice_lists_come_from_the_engine():
    _, subs = _subparsers()
    build_help, search_help = subs["build"].format_help(), subs["search"].format_help()
    for name in nearline.VOCABULARY["presets"] + nearline.VOCABULARY["metrics"]:
        assert name in build_help
    assert "{" + ",".join(nearline.VOCABULARY["executors"]) + "}" in search_help
    assert "{" + ",".join(nearline.VOCABULARY["presets"]) + "}" in build_help


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"nearline {nearline.__version__}"


@pytest.mark.parametrize("argv, expect", [
    (["info", "x"], (False, False, False)),
    (["-q", "-v", "--debug", "info", "x"], (True, True, True)),
    (["info", "x", "-q", "-v", "--debug"], (True, True, True)),
    (["-q", "info", "x", "--debug"], (True, False, True)),
    (["build", "d", "o", "-v"], (False, True, False)),
])
def test_global_flags_before_or_after_the_command(argv, expect):
    a = cli.build_parser().parse_args(argv)
    assert (a.quiet, a.verbose, a.debug) == expect


def test_debug_after_the_command_shows_traceback(engine, monkeypatch):
    monkeypatch.setattr(nearline, "open", lambda p, **kw: (_ for _ in ()).throw(ValueError("bad")), raising=False)
    with pytest.raises(ValueError, match="bad"):
        cli.main(["info", "idx", "--debug"])
