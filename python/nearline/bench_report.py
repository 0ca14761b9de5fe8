"""The benchmark's text reports: the table per system and L, the ratios at target recall (or AP), the disk
utilisation, the roofline, the best-peer ratios, the disk ceiling and the builds. ``nearline.bench`` re-exports
``format_report`` and ``format_range_report``.
"""

from __future__ import annotations

from typing import Any, Optional

from nearline.bench_stats import TARGET_APS, TARGET_RECALLS, _ms


def _fmt(v: Optional[float], spec: str) -> str:
    return "-" if v is None else format(v, spec)


def _pct(v: Optional[float]) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"


def format_report(result: dict[str, Any]) -> str:
    """The text report: per-system table, ratios at matched recall (AP in range mode), disk ceiling, builds."""
    params = result["params"]
    if params.get("mode") == "range":
        return format_range_report(result)
    k = params["k"]
    lines = []
    width = max([len("system")] + [len(s) for s in result["summary"]])
    hdr = (f"{'system':<{width}} {'L':>4} {'recall@' + str(k):>9} {'QPS':>9} {'mean ms':>8} {'p50 ms':>8} "
           f"{'p99 ms':>8} {'p99.9 ms':>8} {'reads':>7} {'hops':>6} {'ℓ':>6} {'ξ':>5} {'io µs':>7} {'cpu µs':>7} "
           f"{'disk':>5}")
    lines.append(hdr)
    lines.append("-" * len(hdr))
    for system, s in result["summary"].items():
        for pt in s["points"]:
            lines.append(
                f"{system:<{width}} {pt['L']:>4} {_fmt(pt.get('recall'), '.4f'):>9} {_fmt(pt.get('qps'), '.0f'):>9} "
                f"{_fmt(pt.get('lat_mean_ms'), '.3f'):>8} {_fmt(pt.get('lat_p50_ms'), '.3f'):>8} "
                f"{_fmt(pt.get('lat_p99_ms'), '.3f'):>8} {_fmt(pt.get('lat_p999_ms'), '.3f'):>8} "
                f"{_fmt(pt.get('mean_reads'), '.1f'):>7} {_fmt(pt.get('mean_hops'), '.1f'):>6} "
                f"{_fmt(pt.get('mean_path_length'), '.1f'):>6} {_fmt(pt.get('vertex_util'), '.3f'):>5} "
                f"{_fmt(pt.get('mean_io_wait_us'), '.0f'):>7} {_fmt(pt.get('mean_cpu_us'), '.0f'):>7} "
                f"{_pct(pt.get('disk_util')):>5}"
            )
        if s.get("refused"):
            ls = ", ".join(str(x) for x in s["refused"]["Ls"])
            lines.append(f"{system:<{width}} L {ls}: refused by the memory budget ({s['refused']['reason']})")
    lines.append("")
    lines.extend(_latency_notes(result))
    lines.extend(_ceiling_lines(result))
    lines.append("")
    for pair, comp in result["comparisons"].items():
        a, b = pair.split("/", 1)
        if not comp["at_recall"]:
            targets = params.get("target_recalls") or TARGET_RECALLS
            lines.append(f"{pair}: no target recall ({', '.join(f'{t:.2f}' for t in targets)}) reached by both")
        for t, r in comp["at_recall"].items():
            line = f"QPS ratio {a}/{b} @ recall {t} = {_fmt(r['qps_ratio'], '.2f')}"
            if r.get("reads_ratio") is not None:
                line += f", mean reads ratio = {r['reads_ratio']:.2f}"
            if r.get("lat_mean_ratio") is not None:
                line += f", mean latency ratio = {r['lat_mean_ratio']:.2f}"
            if r.get("lat_p999_ratio") is not None:
                line += f", p99.9 latency ratio = {r['lat_p999_ratio']:.2f}"
            if r.get("disk_util_a") is not None or r.get("disk_util_b") is not None:
                line += f", disk {_pct(r.get('disk_util_a'))} vs {_pct(r.get('disk_util_b'))}"
            lines.append(line)
        summ = result["summary"]
        if summ.get(a, {}).get("index") is None or summ.get(a, {}).get("index") != summ.get(b, {}).get("index"):
            lines.append(f"build time ratio {a}/{b} = {_fmt(comp['build_time_ratio'], '.2f')}, "
                         f"peak build RSS ratio = {_fmt(comp['peak_build_rss_ratio'], '.2f')}")
    best_lines = _best_peer_lines(result)
    if best_lines:
        lines.append("")
        lines.extend(best_lines)
    roof_lines = _roofline_lines(result, width)
    if roof_lines:
        lines.append("")
        lines.extend(roof_lines)
    lines.append("")
    lines.extend(_build_lines(result, width))
    return "\n".join(lines)


def _na(v: Optional[float], spec: str) -> str:
    return "n/a" if v is None else format(v, spec)


def _roofline_lines(result: dict[str, Any], width: int) -> list[str]:
    """The roofline table (``roofline``): distance, I/O-wait and other time per query, per system,
    then where each nearline row was taken and from which run."""
    roof = result.get("roofline") or {}
    if not roof:
        return []
    target = next(iter(roof.values())).get("target_recall")
    k = result["params"].get("k")
    hdr = (f"{'system':<{width}} {'distance':>9} {'I/O wait':>9} {'other':>9} {'total':>9} {'distance %':>10}")
    lines = [f"Roofline (per query, µs) at recall@{k} = {_fmt(target, '.2f')}: distance = the engine's time "
             "computing distances (dist_us), I/O wait = waiting for reads with nothing of the query to compute, "
             "other = total - distance - I/O wait; n/a: not measured", hdr, "-" * len(hdr)]
    notes = []
    for system, r in roof.items():
        share = r.get("dist_share")
        lines.append(f"{system:<{width}} {_na(r.get('dist_us'), '.0f'):>9} {_na(r.get('io_wait_us'), '.0f'):>9} "
                     f"{_na(r.get('other_us'), '.0f'):>9} {_na(r.get('total_us'), '.0f'):>9} "
                     f"{('n/a' if share is None else f'{100 * share:.0f}%'):>10}")
        at = r.get("at")
        if not (r.get("available") and at):
            continue
        if at["how"] == "interpolated" and len(at["L"]) == 2:
            where = f"interpolated between L {at['L'][0]} and {at['L'][1]}"
        elif at["how"] == "interpolated":
            where = f"L {at['L'][0]}"
        else:
            where = f"L {at['L'][0]}, recall {at['recall']:.4f} (the nearest to the target; no bracket)"
        note = f"roofline {system}: {where}; from the {r.get('source')}"
        if r.get("dist_us") is None:
            note += (f"; this engine reports no dist_us: distance time unavailable (distance + other = "
                     f"{_fmt(r.get('non_io_us'), '.0f')} µs)")
        notes.append(note)
    return lines + notes


def _best_peer_lines(result: dict[str, Any]) -> list[str]:
    """The ratios against each thread-scalable peer at its best thread count (``best_peer``)."""
    out: list[str] = []
    threads = result["params"].get("threads")
    for base, fam in (result.get("best_peer") or {}).items():
        counts = ", ".join(f"{m} {n}" for m, n in sorted(fam["threads"].items(), key=lambda kv: kv[1]))
        out.append(f"{base} at its best thread count (it runs one query per thread; threads: {counts}; "
                   f"nearline's configurations run {threads} threads):")
        if not fam["at_recall"]:
            out.append(f"  no target recall reached by any {base} run")
        for t, row in fam["at_recall"].items():
            others = ", ".join(f"{m} {_fmt(q, '.0f')}" for m, q in row["qps"].items())
            for c, r in row["ratios"].items():
                out.append(f"QPS ratio {c}/best {base} @ recall {t} = {_fmt(r['qps_ratio_best'], '.2f')} "
                           f"(best: {row['best']}, {row['best_threads']} threads; QPS {others}); "
                           f"at equal threads ({row['equal_threads'] or '-'}) = "
                           f"{_fmt(r['qps_ratio_equal_threads'], '.2f')}")
    return out


def _ceiling_lines(result: dict[str, Any]) -> list[str]:
    ceiling = result.get("disk_ceiling")
    if not ceiling:
        return []
    rates = ", ".join(f"{r:.0f}" for r in ceiling.get("reads_per_s", []))
    return [
        f"disk ceiling: {_fmt(ceiling.get('median_reads_per_s'), '.0f')} random {ceiling.get('block_size')} B "
        f"reads/s (median of {rates}; {ceiling.get('engine')}, depth {ceiling.get('depth')}, "
        f"{'O_DIRECT' if ceiling.get('direct_io') else 'page cache: O_DIRECT refused'}); "
        "disk = QPS x mean reads / ceiling"
    ] + ([
        f"disk read latency at that depth: p99 {_fmt(_ms(ceiling.get('median_latency_p99_us')), '.2f')} ms, "
        f"p99.9 {_fmt(_ms(ceiling.get('median_latency_p999_us')), '.2f')} ms; "
        f"stalls (>= 10 ms, no read completing): {_fmt(ceiling.get('median_stalls_per_s'), '.1f')}/s "
        "(the disk's own tail, with the CPUs idle; see docs/benchmarks.md for pauses under CPU load)"
    ] if ceiling.get("median_latency_p999_us") is not None else [])


def format_range_report(result: dict[str, Any]) -> str:
    """Range mode's report: AP, QPS, reads and results per system and L; ratios at matched AP; builds."""
    params = result["params"]
    rng = result.get("range") or {}
    lines = []
    how = (f"picked for {params['range_neighbors']:g} mean exact neighbours per query"
           if params.get("range_neighbors") is not None else "given")
    metric = result.get("dataset", {}).get("metric", params.get("metric", "l2"))
    within = "squared L2 distance <=" if metric == "l2" else f"{metric} score >="
    lines.append(f"range search: {within} {params['radius']:.6g} ({how}); exact answers per query: mean "
                 f"{_fmt(rng.get('gt_mean_results'), '.1f')}, median {_fmt(rng.get('gt_median_results'), '.0f')}, "
                 f"max {rng.get('gt_max_results', '-')}, empty {rng.get('gt_empty_queries', '-')}")
    k0 = params.get("doubling_k0")
    lines.append(f"doubling baseline: k-NN from k = {'L' if k0 is None else k0} (list size max(L, k)), k doubled "
                 "while every result is within the radius (rounds: searches per query); native: list doublings "
                 "per query (doubl)")
    if params.get("range_sweep") == "max_L":
        lines.append(f"native rows: L is max_L, the list size the doubling may reach (first list size "
                     f"min({params.get('range_start_L')}, max_L)); doubling rows: L is the k-NN list size")
    lines.append("")
    width = max([len("system")] + [len(s) for s in result["summary"]])
    hdr = (f"{'system':<{width}} {'L':>4} {'AP':>7} {'QPS':>9} {'results':>8} {'rounds':>6} {'doubl':>6} "
           f"{'reads':>8} {'mean ms':>8} {'p99 ms':>8} {'disk':>5}")
    lines.append(hdr)
    lines.append("-" * len(hdr))
    for system, s in result["summary"].items():
        for pt in s["points"]:
            lines.append(
                f"{system:<{width}} {pt['L']:>4} {_fmt(pt.get('ap'), '.4f'):>7} {_fmt(pt.get('qps'), '.0f'):>9} "
                f"{_fmt(pt.get('mean_results'), '.1f'):>8} {_fmt(pt.get('mean_rounds'), '.2f'):>6} "
                f"{_fmt(pt.get('mean_doublings'), '.2f'):>6} {_fmt(pt.get('mean_reads'), '.1f'):>8} {_fmt(pt.get('lat_mean_ms'), '.3f'):>8} "
                f"{_fmt(pt.get('lat_p99_ms'), '.3f'):>8} {_pct(pt.get('disk_util')):>5}"
            )
    lines.append("")
    lines.extend(_ceiling_lines(result))
    lines.append("")
    for pair, comp in result["comparisons"].items():
        a, b = pair.split("/", 1)
        if not comp["at_ap"]:
            targets = params.get("target_aps") or TARGET_APS
            lines.append(f"{pair}: no target AP ({', '.join(f'{t:.2f}' for t in targets)}) reached by both")
        for t, r in comp["at_ap"].items():
            line = f"QPS ratio {a}/{b} @ AP {t} = {_fmt(r['qps_ratio'], '.2f')}"
            if r.get("reads_ratio") is not None:
                line += f", mean reads ratio = {r['reads_ratio']:.2f}"
            if r.get("lat_mean_ratio") is not None:
                line += f", mean latency ratio = {r['lat_mean_ratio']:.2f}"
            lines.append(line)
    lines.append("")
    lines.extend(_build_lines(result, width))
    return "\n".join(lines)


def _build_lines(result: dict[str, Any], width: int) -> list[str]:
    lines = []
    first_of_index: dict[str, str] = {}
    for system, b in result["builds"].items():
        index = result["summary"].get(system, {}).get("index")
        if index is not None and index in first_of_index:
            lines.append(f"build {system:<{max(11, width)}} the index of {first_of_index[index]} (same build keys)")
            continue
        if index is not None:
            first_of_index[index] = system
        rss = b.get("peak_rss_bytes")
        lines.append(
            f"build {system:<{max(11, width)}} {_fmt(b.get('build_s'), '.1f')} s, peak RSS "
            f"{'-' if rss is None else f'{rss / 2**20:.0f} MiB'}"
            + (f", PQ {b['pq_bytes']} B/vector" if b.get("pq_bytes") else "")
            + (" (cached)" if b.get("cached") else "")
        )
    return lines


def _latency_notes(result: dict[str, Any]) -> list[str]:
    """One line per system: how many queries its percentiles cover, how measured, at what concurrency."""
    out = []
    threads = result["params"].get("threads")
    for system, s in result["summary"].items():
        pts = [p for p in s.get("points", []) if p.get("lat_queries")]
        if not pts:
            continue
        n = int(min(p["lat_queries"] for p in pts))
        conc = [p["lat_concurrency"] for p in pts if p.get("lat_concurrency") is not None]
        src = pts[0].get("latency_source", "")
        line = f"latency {system}: {n} queries per L, {src}"
        if conc:
            line += f", concurrency {min(conc):.1f}-{max(conc):.1f} of {threads} clients"
        if n < 1000:
            line += " (p99.9 needs >= 1000 queries to mean anything)"
        out.append(line)
    return out
