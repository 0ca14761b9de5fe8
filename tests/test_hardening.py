"""Regression tests of the "Hardening" issue, Python and CLI side.

Each test names the defect it guards against and fails on the behaviour
before the fix (checked against the previous release where it could be):

* defect 1, data loss: ``build(..., overwrite=True)`` deleted whatever
  directory was at the target, the build's own input file included;
* defect 5, leftovers: a build killed with SIGKILL left ``.NAME.building-PID/``
  forever; plus the crash test (a build killed at random points leaves the
  target absent or the previous index, never half-written);
* defect 3, budgets that lie: budgets below the minimum built silently with
  1 PQ byte;
* defect 9, error types: a permission error named the hidden build directory;
* ergonomics: the README's first example could not run twice, ``progress=True``
  and ``len(index)``.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import nearline
from nearline import cli

pytestmark = pytest.mark.io_engine

ROOT = Path(__file__).resolve().parents[1]
N, DIM = 3000, 16
#: Small, fast build options (a build of N x DIM takes well under a second).
# The DiskANN composition, whose defaults (L 100, W 4, medoid entry) the
# report tests read back.
FAST = dict(preset="diskann", R=16, build_L=32, threads=2)


@pytest.fixture(scope="module")
def vectors() -> np.ndarray:
    return np.random.default_rng(5).normal(size=(N, DIM)).astype(np.float32)


@pytest.fixture
def base_file(tmp_path, vectors) -> Path:
    p = tmp_path / "base.fbin"
    nearline.write_vectors(p, vectors)
    return p


def _snapshot(d: Path) -> dict[str, bytes]:
    """Every file under ``d`` (relative name -> content)."""
    return {str(f.relative_to(d)): f.read_bytes() for f in sorted(d.rglob("*")) if f.is_file()}


def _leftovers(parent: Path, name: str) -> list[str]:
    """Hidden staging or moved-aside directories of builds of ``parent/name``."""
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(f".{name}."))


def _searches(path: Path, vectors: np.ndarray) -> None:
    """The index at ``path`` opens, passes its checks and finds base rows themselves."""
    with nearline.open(path) as idx:
        assert len(idx) == N
        ids, d = idx.search(vectors[:20], k=1, L=32)
        assert (ids[:, 0] == np.arange(20)).mean() >= 0.9, ids[:, 0]
        assert idx.info()["memory"]["within_budget"]


def _cli(argv: list[str], capsys) -> tuple[int, str, str]:
    rc = cli.main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


# --------------------------------------------------------------------------- defect 1: data loss


@pytest.mark.build_only
def test_overwrite_refuses_the_directory_holding_the_data_python(tmp_path, vectors):
    """The issue's scenario: the data file and a note in ``d``, then ``build("d/base.fbin", "d", overwrite=True)``.
    The old version replaced ``d`` with index files (notes and data gone)."""
    d = tmp_path / "d"
    d.mkdir()
    nearline.write_vectors(d / "base.fbin", vectors)
    (d / "notes.txt").write_text("notes\n")
    before = _snapshot(d)
    with pytest.raises(ValueError, match=r"refusing to replace"):
        nearline.build(str(d / "base.fbin"), str(d), overwrite=True, progress=False, **FAST)
    assert _snapshot(d) == before
    assert _leftovers(tmp_path, "d") == []
    # A directory that is not an index is refused even when the data lies elsewhere.
    e = tmp_path / "e"
    e.mkdir()
    (e / "notes.txt").write_text("mine\n")
    with pytest.raises(ValueError, match=r"not a nearline index.*refusing"):
        nearline.build(vectors, e, overwrite=True, progress=False, **FAST)
    assert _snapshot(e) == {"notes.txt": b"mine\n"}


@pytest.mark.build_only
def test_overwrite_refuses_the_directory_holding_the_data_cli(tmp_path, vectors, capsys):
    """Same scenario through ``nearline build ... --overwrite``: exit 2, one line, nothing touched."""
    d = tmp_path / "d"
    d.mkdir()
    nearline.write_vectors(d / "base.fbin", vectors)
    (d / "notes.txt").write_text("notes\n")
    before = _snapshot(d)
    rc, out, err = _cli(["-q", "build", str(d / "base.fbin"), str(d), "--overwrite", "--R", "16"], capsys)
    assert rc == 2
    assert err.startswith("nearline: error: ") and err.count("\n") == 1 and "refusing to replace" in err
    assert _snapshot(d) == before
    assert _leftovers(tmp_path, "d") == []


@pytest.mark.build_only
def test_overwrite_refuses_an_index_that_holds_the_data(tmp_path, base_file, vectors):
    """A valid index directory that also holds the build's input is not replaced either."""
    idx = tmp_path / "i.index"
    nearline.build(base_file, idx, progress=False, **FAST).close()
    shutil.copy(base_file, idx / "base.fbin")
    before = _snapshot(idx)
    with pytest.raises(ValueError, match=r"read by this build and lies inside"):
        nearline.build(idx / "base.fbin", idx, overwrite=True, progress=False, **FAST)
    assert _snapshot(idx) == before


@pytest.mark.build_only
def test_overwrite_replaces_an_index(tmp_path, base_file, vectors, capsys):
    """Overwriting a real index works (API and CLI); without the flag it is refused."""
    target = tmp_path / "x.index"
    nearline.build(base_file, target, progress=False, **FAST).close()
    with pytest.raises(ValueError, match="already exists.*overwrite"):
        nearline.build(base_file, target, progress=False, **FAST)
    with nearline.build(base_file, target, overwrite=True, progress=False, R=24, build_L=32, threads=2) as idx:
        assert idx.info()["R"] == 24
    rc, out, err = _cli(["-q", "build", str(base_file), str(target), "--overwrite", "--R", "20", "--build-L", "32"],
                        capsys)
    assert rc == 0, err
    with nearline.open(target) as idx:
        assert idx.info()["R"] == 20
    _searches(target, vectors)
    assert _leftovers(tmp_path, "x.index") == []


class _Stop(Exception):
    pass


def _stop_in_graph(stage: str, done: int, total: int) -> None:
    if stage == "graph" and done > 0:
        raise _Stop()


def _interrupt_in_graph(stage: str, done: int, total: int) -> None:
    if stage == "graph" and done > 0:
        raise KeyboardInterrupt()


@pytest.mark.build_only
@pytest.mark.parametrize("how", ["callback error", "ctrl-c", "bad data"])
def test_old_index_survives_a_failed_or_cancelled_overwrite(tmp_path, base_file, vectors, how):
    """The old index stays intact (byte for byte, and it searches) when the new build fails or is cancelled."""
    target = tmp_path / "x.index"
    nearline.build(base_file, target, progress=False, **FAST).close()
    before = _snapshot(target)
    if how == "callback error":
        with pytest.raises(_Stop):
            nearline.build(base_file, target, overwrite=True, progress=_stop_in_graph, **FAST)
    elif how == "ctrl-c":
        with pytest.raises(KeyboardInterrupt):
            nearline.build(base_file, target, overwrite=True, progress=_interrupt_in_graph, **FAST)
    else:
        bad = vectors.copy()
        bad[N - 1, 3] = np.nan  # the last row: found late, after the build has started
        nearline.write_vectors(tmp_path / "bad.fbin", bad)
        with pytest.raises(ValueError, match="NaN"):
            nearline.build(tmp_path / "bad.fbin", target, overwrite=True, progress=False, **FAST)
    assert _snapshot(target) == before
    _searches(target, vectors)
    assert _leftovers(tmp_path, "x.index") == []


@pytest.mark.build_only
def test_old_index_survives_a_failed_overwrite_cli(tmp_path, base_file, vectors, capsys):
    target = tmp_path / "x.index"
    nearline.build(base_file, target, progress=False, **FAST).close()
    before = _snapshot(target)
    bad = vectors.copy()
    bad[N - 1, 0] = np.inf
    nearline.write_vectors(tmp_path / "bad.fbin", bad)
    rc, out, err = _cli(["-q", "build", str(tmp_path / "bad.fbin"), str(target), "--overwrite"], capsys)
    assert rc == 2 and err.count("\n") == 1 and "finite" in err
    assert _snapshot(target) == before
    assert _leftovers(tmp_path, "x.index") == []


# --------------------------------------------------------------------------- defect 5: leftovers, crash safety

_CHILD = """
import sys
import nearline
src, dst, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
print("ready", flush=True)
nearline.build(src, dst, R=16, build_L=32, threads=2, seed=seed, overwrite=True, progress=False)
print("done", flush=True)
"""


@pytest.mark.build_only
def test_build_killed_at_random_points(tmp_path, base_file, vectors):
    """20 builds killed with SIGKILL at random (seeded) points: the target is then either absent or a
    complete index (the previous one, or the new one when the kill came after its commit), never
    half-written; the next build removes the killed builds' leftovers. The old version left every
    ``.NAME.building-PID`` behind for good."""
    target = tmp_path / "crash.index"
    # Calibrate the kill window on this machine: one in-process build of the same size.
    t0 = time.perf_counter()
    nearline.build(base_file, tmp_path / "calib.index", R=16, build_L=32, threads=2, progress=False).close()
    window = 1.3 * (time.perf_counter() - t0) + 0.05
    shutil.rmtree(tmp_path / "calib.index")

    rng = np.random.default_rng(20261124)
    current = None  # the seed of the index the target holds (None: no target)
    killed_with_leftovers = 0
    completed = 0
    trials = 20
    for trial in range(trials):
        seed = trial + 1
        child = subprocess.Popen([sys.executable, "-c", _CHILD, str(base_file), str(target), str(seed)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
        try:
            assert child.stdout is not None
            assert child.stdout.readline().strip() == "ready", child.stderr.read() if child.stderr else ""
            time.sleep(float(rng.uniform(0.0, window)))
            child.send_signal(signal.SIGKILL)
            out, err = child.communicate(timeout=60)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        finished = "done" in out
        if child.returncode not in (-signal.SIGKILL, 0):
            pytest.fail(f"trial {trial}: the build failed on its own (exit {child.returncode}): {err[-2000:]}")
        if not target.exists():
            assert current is None and not finished, f"trial {trial}: the previous index (seed {current}) vanished"
        else:
            with nearline.open(target) as idx:
                got = idx.info()["build"]["seed"]
            assert got in (current, seed), f"trial {trial}: the target holds seed {got}, expected {current} or {seed}"
            if finished:
                assert got == seed
            _searches(target, vectors)
            completed += got == seed
            current = got
        killed_with_leftovers += bool(_leftovers(tmp_path, "crash.index"))
    # The random points hit builds in progress, not only imports or finished builds.
    assert killed_with_leftovers >= 3, killed_with_leftovers
    # A normal build of the same name succeeds and removes every leftover of the killed ones.
    nearline.build(base_file, target, overwrite=True, progress=False, seed=99, **FAST).close()
    assert _leftovers(tmp_path, "crash.index") == []
    with nearline.open(target) as idx:
        assert idx.info()["build"]["seed"] == 99
    _searches(target, vectors)


# --------------------------------------------------------------------------- defect 3: budgets that lie

_MINIMUM = re.compile(r"at least (\d+) bytes.*fraction of at least ([0-9.]+)")


@pytest.mark.parametrize("budget", [0, 1, "0MB", "1KB"])
def test_budget_below_the_minimum_is_refused(tmp_path, vectors, budget):
    """The old version built these with 1 PQ byte and no word; now a ValueError names the minimum
    in bytes and as a fraction of the raw vectors, and that minimum itself builds."""
    with pytest.raises(ValueError) as e:
        nearline.build(vectors, tmp_path / "b.index", memory_budget=budget, progress=False, **FAST)
    m = _MINIMUM.search(str(e.value))
    assert m, str(e.value)
    minimum, fraction = int(m.group(1)), float(m.group(2))
    assert minimum > 1000 and abs(fraction - minimum / vectors.nbytes) < 2e-3
    assert not (tmp_path / "b.index").exists() and _leftovers(tmp_path, "b.index") == []
    with nearline.build(vectors, tmp_path / "b.index", memory_budget=minimum, progress=False, **FAST) as idx:
        mem = idx.info()["memory"]
        assert mem["within_budget"] and mem["budget_auto"] is False and mem["budget"] == minimum
    with pytest.raises(ValueError, match="at least"):
        nearline.build(vectors, tmp_path / "c.index", memory_budget=minimum - 1, progress=False, **FAST)


@pytest.mark.parametrize("budget", ["0", "1", "0MB", "1KB"])
def test_budget_below_the_minimum_cli(tmp_path, base_file, budget, capsys):
    rc, out, err = _cli(["-q", "build", str(base_file), str(tmp_path / "b.index"), "--memory-budget", budget], capsys)
    assert rc == 2
    assert err.count("\n") == 1 and err.startswith("nearline: error: memory_budget=")
    assert _MINIMUM.search(err), err
    assert not (tmp_path / "b.index").exists()


def test_no_budget_sizes_one(tmp_path, vectors):
    with nearline.build(vectors, tmp_path / "a.index", progress=False, **FAST) as idx:
        mem = idx.info()["memory"]
        assert mem["budget_auto"] is True and mem["within_budget"] and mem["budget"] >= mem["minimum"]
    with nearline.open(tmp_path / "a.index", memory_budget="4MB") as idx:
        mem = idx.info()["memory"]
        assert mem["budget_auto"] is False and mem["budget"] == 4_000_000 and mem["within_budget"]


def _readme_python_example() -> str:
    text = (ROOT / "README.md").read_text()
    m = re.search(r"## Python\s+```python\n(.*?)```", text, re.S)
    assert m, "README.md has no Python example under '## Python'"
    return m.group(1)


@pytest.mark.build_only
def test_readme_example_runs_twice(tmp_path):
    """The README's first Python example, run twice in a row in the same directory (as a user
    re-running it would) with fewer vectors so the test stays fast; it ends on ``within_budget``."""
    code = _readme_python_example()
    assert "100_000" in code and "overwrite=True" in code and "within_budget" in code
    code = code.replace("100_000", "8_000")
    for run in range(2):
        r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, f"run {run + 1}: {r.stderr[-3000:]}"
        assert r.stdout.strip().splitlines()[-1] == "True", r.stdout[-2000:]
    assert _leftovers(tmp_path, "vectors.index") == []


def test_plan_names_each_rule_and_the_minimum(tmp_path, base_file, capsys):
    """``nearline.plan`` / ``nearline plan``: every choice comes with its rule, and the memory minimum."""
    p = nearline.plan(base_file, memory_budget="1MB")
    assert p["decisions"] and all(d["what"] and d["rule"] for d in p["decisions"])
    assert all(d["rule"] for d in p["search"]["decisions"])
    mem = p["memory"]
    assert 0 < mem["minimum"] <= mem["budget"] == 1_000_000
    rc, out, err = _cli(["plan", str(base_file), "--memory-budget", "1MB"], capsys)
    assert rc == 0, err
    for d in p["decisions"] + p["search"]["decisions"]:
        assert d["rule"] in out
    assert re.search(r"^\s+minimum\s+\d", out, re.M), out
    # Too small a budget: the plan refuses it with the minimum, as the build would.
    with pytest.raises(ValueError, match=_MINIMUM):
        nearline.plan(base_file, memory_budget="1KB")
    rc, out, err = _cli(["plan", str(base_file), "--memory-budget", "1KB"], capsys)
    assert rc == 2 and _MINIMUM.search(err)
    # An index: the open's plan.
    nearline.build(base_file, tmp_path / "p.index", progress=False, **FAST).close()
    q = nearline.plan(tmp_path / "p.index", memory_budget="4MB")
    assert q["open"] and all(d["rule"] for d in q["open"]) and q["memory"]["minimum"] > 0
    rc, out, err = _cli(["plan", str(tmp_path / "p.index"), "--memory-budget", "4MB"], capsys)
    assert rc == 0 and "open decisions:" in out and all(d["rule"] in out for d in q["open"])


# --------------------------------------------------------------------------- defect 9: error types


def test_missing_index_is_file_not_found(tmp_path, capsys):
    with pytest.raises(FileNotFoundError, match="nope.index"):
        nearline.open(tmp_path / "nope.index")
    rc, out, err = _cli(["info", str(tmp_path / "nope.index")], capsys)
    assert rc == 2 and err.count("\n") == 1 and "nope.index" in err


@contextlib.contextmanager
def _unwritable(d: Path):
    """``d`` made unwritable: mode 0555, or as root (which ignores mode bits) the immutable attribute."""
    d.mkdir()
    if os.geteuid() != 0:
        d.chmod(0o555)
        try:
            yield "mode 0555"
        finally:
            d.chmod(0o755)
        return
    r = subprocess.run(["chattr", "+i", str(d)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"running as root and chattr +i is not available ({r.stderr.strip()}): no permission error "
                    "can be provoked; test_parent_is_a_file_names_the_target covers the error path")
    try:
        yield "immutable (chattr +i, as root)"
    finally:
        subprocess.run(["chattr", "-i", str(d)], check=True)


def test_permission_error_names_the_target(tmp_path, vectors, base_file, capsys):
    """A build into an unwritable directory raises PermissionError naming the target the user gave;
    the old version raised a bare OSError naming its hidden ``.NAME.building-PID`` directory."""
    ro = tmp_path / "ro"
    with _unwritable(ro):
        for target in (ro / "x.index", ro / "sub" / "x.index"):
            with pytest.raises(PermissionError) as e:
                nearline.build(vectors, target, progress=False, **FAST)
            assert str(target) in str(e.value) and ".building" not in str(e.value), str(e.value)
        rc, out, err = _cli(["-q", "build", str(base_file), str(ro / "x.index")], capsys)
        assert rc == 2 and err.count("\n") == 1
        assert str(ro / "x.index") in err and ".building" not in err
        assert list(ro.iterdir()) == []


def test_parent_is_a_file_names_the_target(tmp_path, vectors):
    """Root-proof variant of the test above: the target's parent is a regular file."""
    (tmp_path / "afile").write_text("x")
    target = tmp_path / "afile" / "x.index"
    with pytest.raises(OSError) as e:
        nearline.build(vectors, target, progress=False, **FAST)
    assert str(target) in str(e.value) and ".building" not in str(e.value), str(e.value)


# --------------------------------------------------------------------------- ergonomics (Python)


def test_len_of_an_index(tmp_path, vectors):
    with nearline.build(vectors, tmp_path / "l.index", progress=False, **FAST) as idx:
        assert len(idx) == N == idx.n


class _TTY:
    """A stand-in stderr that says it is a terminal and keeps what is written."""

    def __init__(self) -> None:
        self.parts: list[str] = []

    def write(self, s: str) -> int:
        self.parts.append(s)
        return len(s)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return True

    def text(self) -> str:
        return "".join(self.parts)


@pytest.mark.build_only
def test_progress_bars(tmp_path, vectors, monkeypatch):
    """``progress=True`` draws tqdm bars per stage on stderr; ``None`` (the default) draws them only when
    stderr is a terminal; ``False`` never."""
    for progress, tty, drawn in ((True, False, True), (None, True, True), (None, False, False), (False, True, False)):
        err = _TTY()
        if not tty:
            monkeypatch.setattr(err, "isatty", lambda: False)
        monkeypatch.setattr(sys, "stderr", err)
        nearline.build(vectors, tmp_path / "g.index", overwrite=True, progress=progress, **FAST).close()
        monkeypatch.undo()
        text = err.text()
        assert (("graph" in text) and ("pq" in text)) == drawn, (progress, tty, text[-500:])


def test_plots_raise_no_deprecation_warnings(tmp_path):
    """matplotlib's mathtext on pyparsing 3.3 warned hundreds of times per test run
    (``PyparsingDeprecationWarning``); requirements-dev.txt pins a pyparsing without them."""
    code = ("import matplotlib; matplotlib.use('Agg'); import matplotlib.pyplot as plt\n"
            "fig = plt.figure(); plt.title(r'$\\xi$ at recall@10'); fig.savefig(%r)\n" % str(tmp_path / "x.png"))
    r = subprocess.run([sys.executable, "-W", "error::DeprecationWarning", "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]


# --------------------------------------------------------------------------- ergonomics (CLI, real engine)


def test_search_json_reports_the_L_and_W_used(tmp_path, base_file, vectors, capsys):
    """``search --json`` reports the L and W the search ran with, not the options as given (None)."""
    idx = tmp_path / "s.index"
    nearline.build(base_file, idx, progress=False, **FAST).close()
    q = tmp_path / "q.fbin"
    nearline.write_vectors(q, vectors[:50])
    default_W = nearline.DEFAULTS["presets"]["diskann"]["W"]
    for extra, L, W in (([], max(10, nearline.DEFAULTS["L"]), default_W), (["--L", "40", "--W", "2"], 40, 2),
                        (["--k", "120"], 120, default_W)):
        rc, out, err = _cli(["search", str(idx), str(q), "--json", *extra], capsys)
        assert rc == 0, err
        s = __import__("json").loads(out)
        assert (s["L"], s["W"]) == (L, W), (extra, s)


def test_info_rounds_floats_and_uses_the_api_names(tmp_path, base_file, capsys):
    idx = tmp_path / "i.index"
    nearline.build(base_file, idx, progress=False, alpha=1.2, **FAST).close()
    with nearline.open(idx) as i:
        spec = i.info()["build"]
    assert spec["R"] == 16 and spec["build_L"] == 32 and "r" not in spec and "build_l" not in spec
    rc, out, err = _cli(["info", str(idx)], capsys)
    assert rc == 0, err
    rows = dict(line.split(None, 1) for line in out.splitlines() if len(line.split(None, 1)) == 2)
    assert rows["build.R"].strip() == "16" and rows["build.build_L"].strip() == "32"
    assert rows["build.alpha"].strip() == "1.2"  # stored as float32: 1.2000000476837158
    # Full-precision floats (0.009666666666666645, 0.232203875) are gone: 4 significant digits.
    assert not re.search(r"\d\.\d{7,}", out), [ln for ln in out.splitlines() if re.search(r"\d\.\d{7,}", ln)]
    assert [cli._short(v) for v in (0.009666666666666645, 0.232203875, 1.2000000476837158, 2.0, 12345.678,
                                    1.161e-06, True, None)] == \
        ["0.009667", "0.2322", "1.2", "2", "12345.7", "1.161e-06", "True", "None"]
    assert re.search(r"^plan\.open\.entry\s+medoid\s+\(.+\)$", out, re.M)


# --------------------------------------------------------------------------- defect 8: ids, one validation path


@pytest.mark.parametrize("ids, error, match", [
    (np.arange(300) + 0.5, TypeError, "floats are refused rather than truncated"),
    (np.arange(300) - 1, ValueError, r"ids\[0\] = -1 is negative"),
    (np.zeros(300, dtype=np.int64), ValueError, "ids must be unique"),
])
def test_bad_ids_get_the_same_error_from_the_api_and_the_cli(tmp_path, ids, error, match, capsys):
    """``--ids float.npy`` used to truncate silently and -1 became 18446744073709551615 in the message;
    the CLI and the API now share the engine's check and its words."""
    base = np.random.default_rng(3).random((300, 8), dtype=np.float32)
    with pytest.raises(error, match=match):
        nearline.build(base, tmp_path / "api", ids=ids, progress=False)
    data = tmp_path / "b.fbin"
    nearline.write_vectors(data, base)
    np.save(tmp_path / "ids.npy", ids)
    rc, _, err = _cli(["build", str(data), str(tmp_path / "cli"), "--ids", str(tmp_path / "ids.npy"), "-q"], capsys)
    assert rc == cli.EXIT_ERROR and err.startswith("nearline: error:") and re.search(match, err), err
    assert "Traceback" not in err and "18446744073709551615" not in err
    assert not (tmp_path / "cli").exists() and not (tmp_path / "api").exists()
