"""``preset="auto"``: the planner's rules choose the graph composition
(``planner::auto``; the rule table itself is a Rust table test)."""

from __future__ import annotations

import numpy as np
import pytest

import nearline
from nearline import cli
from conftest import clustered, exact_knn, run_cli


@pytest.fixture(scope="module")
def data64():
    return clustered(20000, 64, seed=5)


def _chosen(plan):
    """(the preset auto kept with its rule, {lost preset: why})."""
    ds = plan["decisions"]
    preset = next(d for d in ds if d["what"] == "preset")
    lost = {d["value"]: d["rule"] for d in ds if d["what"] == "candidate"}
    return preset, lost


def test_every_list_in_the_budget_picks_dgai_else_starling(data64):
    base, _ = data64
    # 20k × 64 float32 is 5.12 MB; every list at R 32 fits in all of it: the list-cache
    # compositions read the same pages there, and DGAI's served more in every cell measured.
    roomy, lost = _chosen(nearline.plan(base, memory_budget=1.0, R=32, threads=2))
    assert roomy["value"] == "dgai" and roomy["rule"].startswith("auto: DGAI")
    assert lost == {}
    # Half of it does not hold every list: several records share a page.
    half, lost = _chosen(nearline.plan(base, memory_budget=0.5, R=32, threads=2))
    assert half["value"] == "starling" and "holds 10 plain records" in half["rule"]
    assert set(lost) == {"dgai", "gorgeous", "alayalaser", "pageann"}
    # DGAI's lists fit beside shorter codes than gorgeous' (a topology record has no
    # vector), too short to refine; gorgeous' do not fit at all.
    assert "every adjacency list fits only beside PQ codes" in lost["dgai"]
    assert "cannot hold every adjacency list" in lost["gorgeous"]
    assert "shuffling co-locates" in lost["alayalaser"]
    assert "write_ratio=0" in lost["pageann"]


def test_an_option_dgai_refuses_keeps_gorgeous(data64):
    base, _ = data64
    # A disk budget of exactly one plain record slot each (2,000 pages of 10 records):
    # DGAI's topology and vector pages take one page more, while the replicated layout
    # meets it by packing no lists, so the same rule keeps gorgeous.
    budget = 2000 * 4096
    with pytest.raises(ValueError, match="disk_budget"):
        nearline.plan(base, preset="dgai", memory_budget=1.0, R=32, threads=2, disk_budget=budget)
    chosen, lost = _chosen(nearline.plan(base, memory_budget=1.0, R=32, threads=2,
                                         disk_budget=budget))
    assert chosen["value"] == "gorgeous" and chosen["rule"].startswith("auto: Gorgeous")
    assert set(lost) == {"dgai"} and "disk_budget" in lost["dgai"]


def test_a_static_collection_gets_a_page_graph(tmp_path, data64):
    base, _ = data64
    # write_ratio=0 declares the collection static: at 64-d a page graph packs 15 records a
    # page against 10 plain ones, so auto keeps pageann; any other hint keeps starling.
    fixed, lost = _chosen(nearline.plan(base, memory_budget=0.5, R=32, threads=2, write_ratio=0))
    assert fixed["value"] == "pageann" and "15 page-graph records against 10 plain" in fixed["rule"]
    moving, lost = _chosen(nearline.plan(base, memory_budget=0.5, R=32, threads=2, write_ratio=0.1))
    assert moving["value"] == "starling" and "write_ratio=0" in lost["pageann"]
    f = tmp_path / "base.fbin"
    nearline.write_vectors(f, base)
    r = run_cli("plan", str(f), "--memory-budget", "0.5", "--R", "32", "--write-ratio", "0")
    assert r.returncode == 0, r.stderr
    assert "auto: PageANN" in r.stdout


def test_a_candidate_beyond_the_budget_loses_with_the_planners_reason():
    base, _ = clustered(20000, 32, seed=5)
    # 0.3 of 2.56 MB: neither starling's maps nor gorgeous' lists fit.
    # Cosine: the coded layout (l2 only) is out, so every rule is tried.
    chosen, lost = _chosen(nearline.plan(base, memory_budget=0.3, R=32, threads=2, metric="cosine"))
    assert chosen["value"] == "diskann"
    assert "below what the starling preset" in lost["starling"]
    assert "below what the gorgeous preset" in lost["gorgeous"]
    assert "l2 metric only" in lost["alayalaser"]
    # With l2 the baseline's codes would be too short to rank: the codes go
    # in the records.
    chosen, _ = _chosen(nearline.plan(base, memory_budget=0.3, R=32, threads=2))
    assert chosen["value"] == "alayalaser" and "that rank well enough" in chosen["rule"]


def test_auto_build_searches_at_recall_and_records_the_preset(tmp_path, data64):
    base, queries = data64
    with nearline.build(base, tmp_path / "a.index", memory_budget=0.5, R=32, build_L=64, threads=2) as idx:
        info = idx.info()
        assert info["preset"] == "starling" and info["memory"]["within_budget"]
        ids, _ = idx.search(queries, k=10, L=64)
    assert nearline.recall(ids, exact_knn(base, queries, 10), 10) >= 0.9
    # The index records what auto chose; it reopens as that preset.
    with nearline.open(tmp_path / "a.index") as idx:
        assert idx.info()["preset"] == "starling"


def test_a_build_measures_how_well_pq_ranks_its_data(tmp_path):
    # 20k × 128 Gaussian noise at 15% of the raw bytes: by size starling's 16-byte codes
    # would do (the plan reads no data), but the build measures how well they rank this
    # data (no structure for PQ to use: recall@10 ~0.2) and puts the codes in the records.
    rng = np.random.default_rng(1)
    base = rng.standard_normal((20000, 128)).astype(np.float32)
    queries = rng.standard_normal((100, 128)).astype(np.float32)
    planned, lost = _chosen(nearline.plan(base, memory_budget=0.15, R=32, threads=2))
    assert planned["value"] == "starling" and "a build measures" in lost["alayalaser"]
    f = tmp_path / "noise.fbin"
    nearline.write_vectors(f, base)
    r = run_cli("build", str(f), str(tmp_path / "a.index"), "--memory-budget", "0.15", "--R", "32",
                "--build-L", "64", "--threads", "2", "-q")
    assert r.returncode == 0, r.stderr
    assert "preset=alayalaser" in r.stdout and "recall@10" in r.stdout, r.stdout
    with nearline.open(tmp_path / "a.index") as idx:
        info = idx.info()
        rule = info["build"]["auto_rule"]
        assert info["preset"] == "alayalaser" and info["memory"]["within_budget"]
        assert "starling composition" in rule and "below the 0.63" in rule, rule
        ids, _ = idx.search(queries, k=10, L=100)
    # Noise is hard for any graph: what counts is that the build's choice finds more of
    # the true neighbours than the plan's choice at the same budget and L.
    truth = exact_knn(base, queries, 10)
    with nearline.build(base, tmp_path / "s.index", preset="starling", memory_budget=0.15, R=32,
                        build_L=64, threads=2) as s:
        sids, _ = s.search(queries, k=10, L=100)
    got, plan_s = nearline.recall(ids, truth, 10), nearline.recall(sids, truth, 10)
    assert got > plan_s + 0.1, (got, plan_s)
    # A named preset records no rule.
    with nearline.build(base[:2000], tmp_path / "b.index", preset="diskann", R=16, threads=2) as idx:
        assert "auto_rule" not in idx.info()["build"]


def test_a_layout_names_its_composition(data64):
    base, _ = data64
    for layout, preset in (("id", "diskann"), ("shuffled", "starling"), ("replicated", "gorgeous"),
                           ("coded", "alayalaser"), ("pq_coded", "aisaq"), ("page_graph", "pageann"),
                           ("decoupled", "dgai")):
        p, _ = _chosen(nearline.plan(base, layout=layout, memory_budget=1.0, R=32, threads=2))
        assert p["value"] == preset, layout


def test_cli_plan_prints_the_rule_and_every_lost_candidate(tmp_path, data64, capsys):
    base, _ = data64
    f = tmp_path / "base.fbin"
    nearline.write_vectors(f, base)
    assert cli.main(["plan", str(f), "--memory-budget", "0.5", "--R", "32"]) == 0
    out = capsys.readouterr().out
    assert "auto: Starling" in out
    assert "gorgeous" in out and "cannot hold every adjacency list" in out


def test_bad_preset_names_the_choices(data64):
    base, _ = data64
    with pytest.raises(ValueError, match="auto, diskann"):
        nearline.plan(base, preset="automatic")


def test_auto_cells_reads_a_bench_result(tmp_path):
    """benches/analysis/auto_cells.py: auto against the best named preset and
    diskannpy at each target, from one run's comparisons."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    def cmp(qa, qb):
        return {"at_recall": {"0.95": {"qps_a": qa, "qps_b": qb}}}

    result = {
        "params": {"memory_budget": 0.05},
        "dataset": {"name": "toy"},
        "builds": {"auto": {"info": {"build": {"preset": "starling", "memory_budget": 1000},
                                     "memory": {"within_budget": True}}}},
        "comparisons": {"auto/diskannpy": cmp(1800.0, 1000.0), "starling/diskannpy": cmp(1900.0, 1000.0),
                        "diskann/diskannpy": cmp(1500.0, 1000.0), "diskannpy@8/diskannpy": cmp(3000.0, 1000.0)},
    }
    f = tmp_path / "r.json"
    f.write_text(json.dumps(result))
    script = Path(__file__).resolve().parents[1] / "benches" / "analysis" / "auto_cells.py"
    out = subprocess.run([sys.executable, str(script), str(f), "--json", str(tmp_path / "rows.json")],
                         capture_output=True, text=True, check=True).stdout
    rows = json.loads((tmp_path / "rows.json").read_text())
    assert len(rows) == 1 and rows[0]["auto_chose"] == "starling" and rows[0]["best_preset"] == "starling"
    assert rows[0]["auto_vs_best"] == round(1800 / 1900, 3) and rows[0]["auto_vs_diskannpy"] == 1.8
    assert "| toy |" in out
    # A result without an auto variant is refused with the reason.
    del result["comparisons"]["auto/diskannpy"]
    f.write_text(json.dumps(result))
    bad = subprocess.run([sys.executable, str(script), str(f)], capture_output=True, text=True)
    assert bad.returncode != 0 and "no auto/diskannpy comparison" in bad.stderr
