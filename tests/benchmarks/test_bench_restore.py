# SPDX-License-Identifier: Apache-2.0
"""benchmarks/bench_restore.py up to its fio step, with dd and fio on PATH replaced (no server started; dd
writes only where a test asks it to): the lmcache_adp it measures and its children import (this tree's, when
built in place, even where an editable install points at another tree), its refusal of a prompt too small for
the fio step or not of whole chunks, the fio file's size and fio's block (the chunk of the shape given), its work
directory removed and its raw outputs kept (<results>/raw/*-FAILED) when a step fails or it is stopped by
SIGTERM."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks" / "bench_restore.py"
sys.path.insert(0, str(ROOT / "benchmarks"))
pytest.importorskip("lmcache")
import tools  # noqa: E402

# fio: records its PID, the lmcache_adp a Python child under its environment (the one every MP server and
# gateway of the run inherits) imports, the size of the file it was given and its block size, writes its JSON
# output file (empty: in the run's raw dir), then fails, or (FIO_MODE=wait) waits to be stopped.
FAKE_FIO = f"""#!/bin/sh
echo $$ >> "$FAKE_PIDS"
{sys.executable} -c 'import lmcache_adp; print(lmcache_adp.__file__)' > "$FIO_SAW" 2>&1
for a in "$@"; do
  case "$a" in
    --filename=*) stat -c %s "${{a#--filename=}}" > "$FIO_SAW.size";;
    --bs=*) echo "${{a#--bs=}}" > "$FIO_SAW.bs";;
    --output=*) : > "${{a#--output=}}";;
  esac
done
[ "$FIO_MODE" = wait ] && exec sleep 30
exit 1
"""
# dd: does nothing, or (REAL_DD set) runs the real dd without oflag=direct (tmp_path may be a tmpfs).
FAKE_DD = f"""#!/bin/sh
[ -z "$REAL_DD" ] && exit 0
for a in "$@"; do shift; [ "$a" = oflag=direct ] || set -- "$@" "$a"; done
exec {shutil.which("dd")} "$@"
"""


def start(tmp_path: Path, *args: str, fio_mode: str = "fail", real_dd: bool = False) -> subprocess.Popen:
    """The bench run from tmp_path without PYTHONPATH, its --workdir tmp_path/work, --results-dir
    tmp_path/results, dd and fio faked."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "fio").write_text(FAKE_FIO)
    (bin_dir / "dd").write_text(FAKE_DD)
    for tool in ("fio", "dd"):
        (bin_dir / tool).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env['PATH']}", FIO_MODE=fio_mode)
    env.update(FAKE_PIDS=str(tmp_path / "fio.pids"), FIO_SAW=str(tmp_path / "fio.saw"))
    if real_dd:
        env["REAL_DD"] = "1"
    cmd = [sys.executable, str(BENCH), "--workdir", str(tmp_path / "work"), "--tiers", "mock"]
    cmd += ["--results-dir", str(tmp_path / "results"), *args]
    return subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@contextlib.contextmanager
def stopped_after(proc: subprocess.Popen, tmp_path: Path):
    """Kills the bench and the fake fio's it started (by their PIDs) if the test left them running."""
    try:
        yield
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        pids = tmp_path / "fio.pids"
        for pid in map(int, pids.read_text().split()) if pids.exists() else ():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.skipif(tools.native_module(ROOT / "lmcache_adp") is None, reason="this tree is not built in place")
def test_it_measures_this_tree_and_so_do_its_children_and_a_failed_step_removes_the_work_directory(tmp_path):
    """Run without PYTHONPATH=. from elsewhere, it imported the editable install's lmcache_adp (another
    worktree's) and so did its MP servers; now this tree's, named in its output, and the environment its
    children inherit imports it too. fio failing (a bare CalledProcessError) left --workdir behind."""
    proc = start(tmp_path)
    with stopped_after(proc, tmp_path):
        out, _ = proc.communicate(timeout=120)
    assert f"lmcache_adp measured: {ROOT / 'lmcache_adp'}\n" in out, out
    assert (tmp_path / "fio.saw").read_text().strip() == str(ROOT / "lmcache_adp" / "__init__.py")
    assert proc.returncode == 1 and "CalledProcessError" in out, out
    assert not (tmp_path / "work").exists(), list((tmp_path / "work").rglob("*"))


def test_a_prompt_too_small_for_the_fio_step_is_refused_before_anything_runs(tmp_path):
    """Below 2048 tokens of the default shape each of fio's 8 jobs got less than its 32 MiB block: fio failed
    with a bare CalledProcessError after the fio file was written, and the work directory stayed."""
    proc = start(tmp_path, "--tokens", "1024")
    with stopped_after(proc, tmp_path):
        out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2, out
    assert "--tokens 1024: a prompt of 128 MiB" in out and "at least 256 MiB is needed, 2048 tokens" in out, out
    assert not (tmp_path / "fio.pids").exists() and not (tmp_path / "work").exists()


def test_sigterm_stops_the_step_it_waits_for_and_removes_the_work_directory(tmp_path):
    """SIGTERM during the fio step: fio is stopped, --workdir removed, the exit status 143 (it died where it
    stood before, with fio left running and the work directory on the disk)."""
    proc = start(tmp_path, fio_mode="wait")
    with stopped_after(proc, tmp_path):
        deadline = time.monotonic() + 120
        while not (tmp_path / "fio.saw").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (tmp_path / "fio.saw").exists(), "fio never started"
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 128 + signal.SIGTERM, out
        assert not (tmp_path / "work").exists(), list((tmp_path / "work").rglob("*"))
        (pid,) = map(int, (tmp_path / "fio.pids").read_text().split())
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()


def test_a_workdir_holding_files_it_did_not_make_is_refused_and_left_alone(tmp_path):
    """--workdir is removed before and after a run: pointed at a directory holding someone's files, it deleted
    them. Now refused up front (exit 2), nothing touched; a directory an earlier run made (its marker) or an
    empty one is still taken."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "keep.txt").write_text("not the benchmark's")
    proc = start(tmp_path)
    with stopped_after(proc, tmp_path):
        out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2 and "holds files this benchmark did not make" in out, out
    assert (work / "keep.txt").read_text() == "not the benchmark's"
    assert not (tmp_path / "fio.pids").exists()


def test_a_workdir_an_earlier_run_left_is_taken_and_removed(tmp_path):
    work = tmp_path / "work"
    (work / "raw").mkdir(parents=True)
    (work / ".bench_restore-workdir").touch()
    (work / "raw" / "old.log").write_text("from a run killed with SIGKILL")
    proc = start(tmp_path)
    with stopped_after(proc, tmp_path):
        out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1 and (tmp_path / "fio.pids").exists(), out  # it got as far as the (failing) fio step
    assert not work.exists()


def failed_raw(tmp_path: Path) -> list[str]:
    """The files of the raw dir the run kept in tmp_path/results/raw/<stamp>-restore-FAILED."""
    (dest,) = (tmp_path / "results" / "raw").glob("*-restore-FAILED")
    return sorted(p.name for p in dest.iterdir())


def test_a_run_that_fails_outside_the_server_keeps_its_raw_outputs(tmp_path):
    """Only a server's death kept the raw dir (server logs, fio's JSON, samples so far); any other failure (here
    fio's) removed it with the work directory. Now every failure copies it to <results>/raw/<stamp>-<tag>-FAILED."""
    proc = start(tmp_path)
    with stopped_after(proc, tmp_path):
        out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1 and "CalledProcessError" in out, out
    assert failed_raw(tmp_path) == ["fio-before-bs33554432-j4.json", "samples.json"], out
    assert "raw outputs of the failed run in" in out and not (tmp_path / "work").exists()


def test_a_run_stopped_by_sigterm_keeps_its_raw_outputs(tmp_path):
    proc = start(tmp_path, fio_mode="wait")
    with stopped_after(proc, tmp_path):
        deadline = time.monotonic() + 120
        while not (tmp_path / "fio.saw").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, out
    assert "samples.json" in failed_raw(tmp_path), out


@pytest.mark.parametrize("tokens", ["1000", "2300", "0"])
def test_tokens_not_a_multiple_of_the_chunk_are_refused_up_front(tmp_path, tokens):
    """--tokens 2300 ran: LMCache stores whole 256-token chunks, so the prompt measured was not the one named."""
    proc = start(tmp_path, "--tokens", tokens)
    with stopped_after(proc, tmp_path):
        out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2, out
    assert f"--tokens {tokens}: must be a positive multiple of 256 (LMCache's chunk)" in out, out
    assert not (tmp_path / "fio.pids").exists() and not (tmp_path / "work").exists()


def test_the_fio_file_is_the_prompt_exactly_and_fio_reads_it_in_chunks_of_the_shape(tmp_path):
    """A shape of 512 bytes a token: a chunk (the object LMCache stores) is 128 KiB; 9 chunks (an odd count).
    dd wrote 64 MiB blocks, nbytes // 64 MiB of them: 0 bytes here (a short file for any odd count of 32 MiB
    chunks), and fio read 32 MiB blocks whatever the shape. Now the file is the prompt's 9 x 128 KiB and fio's
    block is the chunk."""
    shape = ["--layers", "1", "--kv-heads", "1", "--head-dim", "128"]
    proc = start(tmp_path, "--tokens", str(9 * 256), *shape, real_dd=True)
    with stopped_after(proc, tmp_path):
        out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1, out  # the fake fio fails after looking
    assert (tmp_path / "fio.saw.size").read_text().split() == [str(9 * 128 * 1024)], out
    assert (tmp_path / "fio.saw.bs").read_text().split() == [str(128 * 1024)], out


def test_l1_hugetlb_with_an_shm_tier_is_refused_up_front(tmp_path):
    """--l1-hugetlb (restore37: the L1's physical layout sets the disk requests' size and moved the item-5 ratio
    more than the plugin did) puts every server's L1 on 2 MiB hugetlb pages; LMCache cannot make such an L1 a
    /dev/shm pool, so a NAME+shm tier beside it is refused before anything runs."""
    proc = start(tmp_path, "--l1-hugetlb", "--tiers", "mock,adp+shm")
    with stopped_after(proc, tmp_path):
        out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2, out
    assert "--l1-hugetlb with a NAME+shm tier" in out, out
    assert not (tmp_path / "fio.pids").exists() and not (tmp_path / "work").exists()


def restored(total_s: float) -> dict:
    """One restore's sample as measure_tier keeps it (an L2 restore of 8 chunks)."""
    return {"total_s": total_s, "lookup_s": total_s / 2, "retrieve_s": total_s / 2, "l2_loaded_chunks": 8.0,
            "prefetch": {"hits": 8, "requested": 8, "from_l1": 0, "from_l2": 8, "ms": total_s * 500}}  # fmt: skip


def a_run(l1_hugetlb: bool, checks: dict[str, str | None]) -> dict:
    """samples.json of a run of the tiers in `checks` (tier -> its server's l1_check, None: not recorded, as
    before hugel1) with fio's rows into ordinary and hugetlb buffers."""
    import bench_restore

    fio = [{"when": "before", "bs": 32 << 20, "jobs": j, "iomem": m, "bw_bytes": bw, "cmd": "fio"}
           for j, m, bw in ((4, "malloc", 1 << 30), (8, "malloc", 3 << 29), (4, "mmaphuge", 2 << 30),
                            (8, "mmaphuge", 5 << 29))]  # fmt: skip
    tiers = {
        name: {"cpu_tier": [restored(0.4)], "l2": [restored({"mock": 0.2}.get(name, 0.6))], "store_s": 1.0,
               "l2_written_s": 1.0, "rounds": [{"position": i + 1, "reclaim": {}, "store_s": 1.0,
                                                "l2_written_s": 1.0, **({"l1_check": c} if c else {})}]}
        for i, (name, c) in enumerate(checks.items())
    }  # fmt: skip
    return {
        "when": "2026-12-07T21:30:00", "command": "python benchmarks/bench_restore.py", "repeat": 1, "rounds": 1,
        "seed": 1, "tier_orders": [list(checks)], "l1_size_gb": 1.5, "l1_hugetlb": l1_hugetlb, "server_env": [],
        "notes": {}, "fio": fio, "tiers": tiers,
        "prompt": {"tokens": 2048, "bytes": 256 << 20, "chunk_bytes": 32 << 20, "shape": {"num_layers": 32}},
        "host": {"cpus": 2, "kernel": "6", "disk": "/dev/vda ext4", "loadavg_start": [1.0, 1.0, 1.0],
                 "loadavg_end": [2.0, 2.0, 2.0]},
        "versions": {"lmcache_adp": "0.1.0", "lmcache": "0.5.6", "git": "abc", "package": "p",
                     "native": bench_restore.native_build()},
    }  # fmt: skip


HUGE = "L1 on 2 MiB hugetlb pages: its largest mapping 1536 MiB (/anon_hugepage (deleted)), KernelPageSize 2048 kB"
SMALL = (
    "no mapping of >= 1536 MiB on 2 MiB hugetlb pages: its largest mapping 1536 MiB (anonymous), KernelPageSize 4 kB"
)


def test_the_report_states_the_l1_each_server_was_seen_with_never_only_what_was_asked():
    """Its header said "Every server's L1 from 2 MiB hugetlb pages (--l1-hugetlb)" whenever the flag was given;
    with LMCache 0.5.6 on a host without CUDA every such L1 was 4 KiB pages (item5v). Now it says what each
    server's /proc/PID/smaps showed, and that an unchecked run's L1 was not checked; the limit is fio's read into
    hugetlb buffers where the L1 was (2 GiB/s: 0.125 s for 256 MiB), fio's own (1 GiB/s: 0.250 s) otherwise."""
    import bench_restore

    old = bench_restore.render(a_run(True, {"mock": None, "adp": None}))
    assert "hugetlb pages (--l1-hugetlb)" not in old and "Every server's L1 from" not in old
    assert "the servers' L1 was not checked in this run" in old
    seen = bench_restore.render(a_run(True, {"mock": HUGE, "adp": SMALL}))
    assert "each server's /proc/PID/smaps checked after its start: 1 of 2 servers" in seen, seen
    assert f"- mock, round 1: {HUGE}" in seen and f"- adp, round 1: {SMALL}" in seen
    assert "| medium's limit: bytes / fio O_DIRECT read | 0.125 |" in seen
    assert "| before the tiers | 32 MiB | 4 | 2 MiB hugetlb (--iomem=mmaphuge) | 2.00 | 0.125 |" in seen
    plain = bench_restore.render(a_run(False, {"mock": SMALL}))
    assert "L1: hugetlb not asked for;" in plain and "| medium's limit: bytes / fio O_DIRECT read | 0.250 |" in plain


class FakeServer:
    """An MPServer whose process is `sleep` (ordinary memory only); the run must stop before any client."""

    started: list[FakeServer] = []

    def __init__(self, adapters, workdir, **kw):
        self.args = [sys.executable, "-c", "pass", "server", "--l1-size-gb", str(kw["l1_size_gb"])]
        self.env: dict = {}
        self.proc = None
        FakeServer.started.append(self)

    def start(self):
        self.proc = subprocess.Popen(["sleep", "60"])
        self.pid = self.proc.pid
        return self

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        return self.proc.wait()

    def log_tail(self) -> str:
        return ""

    @property
    def url(self):
        raise AssertionError("a client was started: the server's L1 was not checked")


def test_l1_hugetlb_refuses_a_server_whose_l1_is_not_on_hugetlb_pages(tmp_path, monkeypatch):
    """--l1-hugetlb: each server is started through benchmarks/hugetlb_l1.py (LMCache's own --l1-use-hugepages
    falls back to ordinary memory without CUDA) and its /proc/PID/smaps is read once it answers; a server with no
    mapping of the L1's size on 2 MiB hugetlb pages (here `sleep`) stops the run with what smaps showed, the
    server stopped, before any client. Before, the run went on and its report claimed hugetlb L1s."""
    import bench_restore

    monkeypatch.setattr(bench_restore, "MPServer", FakeServer)
    shape = bench_restore.KVShape(num_layers=2, num_heads=1, head_dim=8, block_size=16, num_blocks=17)
    with pytest.raises(SystemExit) as e:
        bench_restore.measure_tier("adp", {}, shape, 256, 1, 0.5, tmp_path, l1_hugetlb=True)
    msg = str(e.value)
    assert "--l1-hugetlb: adp's MP server (PID" in msg and "no mapping of >= 512 MiB on 2 MiB hugetlb pages" in msg
    assert "KernelPageSize 4 kB" in msg and "refusing the run" in msg
    server = FakeServer.started[-1]
    assert server.args[:3] == [sys.executable, str(ROOT / "benchmarks" / "hugetlb_l1.py"), "server"], server.args
    assert server.proc.poll() is not None
