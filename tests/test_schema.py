"""One declaration of every option and statistic (the engine's ``nearline.SCHEMA``), and every
surface generated from it agrees: the Python signatures and docstrings, the CLI's flags, the
bench's variant keys, the server's JSON schema, and the statistics a search returns."""

from __future__ import annotations

import argparse
import inspect

import numpy as np
import pytest

import nearline
from conftest import clustered
from nearline import bench, cli, cli_options

# Parameters that are the Python call's own, not engine options.
_PYTHON_ONLY = {
    "build": {"data", "path", "dtype", "progress"},
    "open": {"path"},
    "search": {"self", "queries", "return_stats"},
    "range_search": {"self", "queries", "radius", "return_stats"},
}
_FUNCS = {"build": nearline.build, "open": nearline.open, "search": nearline.Index.search,
          "range_search": nearline.Index.range_search}


def _names(stage):
    return [o["name"] for o in nearline.SCHEMA["options"] if stage in o["stages"]]


@pytest.mark.parametrize("stage", list(_FUNCS))
def test_python_signature_and_docstring_follow_the_schema(stage):
    func = _FUNCS[stage]
    params = set(inspect.signature(func).parameters) - _PYTHON_ONLY[stage]
    assert params == set(_names(stage)), f"{stage}: signature and schema differ"
    assert nearline.VOCABULARY["options"][stage] == _names(stage)
    doc = func.__doc__
    assert "{options}" not in doc and "{stats}" not in doc
    for o in nearline.SCHEMA["options"]:
        if stage in o["stages"]:
            assert f"{o['name']}: " in doc and o["default"].split()[0] in doc, (stage, o["name"])
    if stage == "search":
        for s in nearline.SCHEMA["stats"]:
            assert f"{s['name']}: " in doc


def test_every_option_is_typed_documented_and_defaulted():
    kinds = {"int", "float", "bool", "name", "budget", "size", "int_or_auto", "ids"}
    seen = set()
    for o in nearline.SCHEMA["options"]:
        assert o["type"] in kinds, o
        assert o["doc"] and o["default"] and o["stages"], o
        assert o["cli"].startswith("--")
        for st in o["stages"]:
            assert (o["name"], st) not in seen, f"{o['name']} declared twice for {st}"
            seen.add((o["name"], st))
        if "choices_from" in o:
            assert o["choices_from"] in nearline.VOCABULARY


def _subparsers():
    parser = cli.build_parser()
    return parser._subparsers._group_actions[0].choices


@pytest.mark.parametrize("command, stages, excluded", [
    ("build", ("build",), {"ids"}),
    ("search", ("search", "range_search"), set()),
    ("plan", ("build",), {"ids", "overwrite"}),
])
def test_cli_flags_are_generated_from_the_schema(command, stages, excluded):
    p = _subparsers()[command]
    flags = {a.dest: a for a in p._actions}
    for stage in stages:
        for o in cli_options.specs(stage):
            if o["name"] in excluded:
                continue
            assert o["name"] in flags, f"{command}: no flag for {o['name']}"
            a = flags[o["name"]]
            assert o["cli"] in a.option_strings
            assert o["default"].replace("%", "%%") in a.help
            if o["type"] == "bool":
                assert isinstance(a, argparse.BooleanOptionalAction)


def test_cli_gives_the_engine_only_what_the_user_gave():
    p = cli.build_parser()
    args = p.parse_args(["search", "idx", "q.fbin", "--L", "50", "--no-repeatable", "--adaptive-beam",
                         "--memory-budget", "0.2", "--range-ratio", "0.25", "--queries-in-flight", "auto"])
    assert cli_options.given(args, "search") == {"L": 50, "repeatable": False, "adaptive_beam": True,
                                                 "queries_in_flight": "auto"}
    assert cli_options.given(args, "range_search")["ratio"] == 0.25
    assert cli_options.given(args, "open") == {"memory_budget": 0.2}
    for bad in (["search", "idx", "q.fbin", "--sigma", "1.5"],            # (0, 1]
                ["build", "d.fbin", "out", "--recall-target", "1"],      # (0, 1)
                ["search", "idx", "q.fbin", "--entry-cutoff", "0.5"]):   # >= 1
        with pytest.raises(SystemExit):
            p.parse_args(bad)
    with pytest.raises(SystemExit):
        p.parse_args(["build", "d.fbin", "out", "--layout", "nope"])


def test_bench_variant_keys_are_the_schema_less_what_the_bench_sets():
    for stage, call in (("build", "build"), ("open", "open"), ("search", "search")):
        assert set(bench.VARIANT_KEYS[stage]) | bench._BENCH_OWNS[stage] == set(_names(call))
    assert set(bench.VARIANT_KEYS["range"]) == set(_names("range_search")) - set(_names("search"))


def test_server_schema_is_generated_from_the_schema(tmp_path):
    from nearline.server import Server

    base, _ = clustered(600, 8, seed=3, queries=5)
    with nearline.build(base, tmp_path / "i", preset="diskann", R=16, build_L=32, threads=2) as ix:
        srv = Server({"i": ix}, port=0)
        try:
            paths = srv.openapi["paths"]
            props = paths["/v1/collections/{name}/search"]["post"]["requestBody"]["content"]["application/json"]
            props = props["schema"]["properties"]
            assert set(_names("search")) <= set(props)
            assert props["executor"]["enum"] == nearline.VOCABULARY["executors"]
            assert props["sigma"] == {**props["sigma"], "type": "number", "exclusiveMinimum": 0.0, "maximum": 1.0}
        finally:
            srv.stop(close_indexes=False)


@pytest.mark.parametrize("preset, budget", [("gorgeous", 1_300_000), ("spfresh", None)])
def test_search_returns_exactly_the_declared_statistics(tmp_path, preset, budget):
    base, queries = clustered(3000, 64, seed=5, queries=8)
    # gorgeous: a budget whose cache holds part of the adjacency lists, so the refine stage runs.
    with nearline.build(base, tmp_path / "i", preset=preset, threads=2, memory_budget=budget) as ix:
        _, _, stats = ix.search(queries, k=5, return_stats=True)
        declared = {s["name"]: s["dtype"] for s in nearline.SCHEMA["stats"]}
        assert set(stats) == set(declared)
        assert "refined" in stats
        for name, arr in stats.items():
            assert np.asarray(arr).dtype == np.dtype(declared[name]), name
            assert len(arr) == len(queries)
        if preset == "gorgeous":
            # Two-stage search: the refine stage ranks exactly at least one entry a read it issues.
            assert int(np.sum(stats["refine_reads"])) > 0
            assert int(np.sum(stats["refined"])) >= int(np.sum(stats["refine_reads"]))
