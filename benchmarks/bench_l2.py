#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""ADPConnector as LMCache's L2 tier against fio and LMCache's own L2 adapters.

For one medium (a directory on a disk, or /dev/shm) and each chunk size: fio
with O_DIRECT at the chunk size, then `lmcache bench l2 --no-skip-verify` for
ADP and each peer, all on the same medium. Writes
benchmarks/results/<date>-<time>-<medium>.md and the raw outputs to
benchmarks/results/raw/<date>-<time>-<medium>/. Method: benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import datetime
import importlib.util
import json
import os
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from lmcache.cli.commands.bench.l2_adapter_bench.data import make_object_keys
from lmcache.lmcache_fs import LMCacheFSClient
from lmcache.v1.distributed.l2_adapters.native_connector_l2_adapter import _object_key_to_string

HERE = Path(__file__).resolve().parent
COMMIT = subprocess.run(
    ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE
).stdout.strip()
from hugetlb_l1 import REPORT_ENV  # noqa: E402
from tools import (  # noqa: E402
    describe_build,
    exit_on_sigterm,
    hugetlb_pool,
    native_build,
    native_module,
    require_tool,
)

# The package measured: this tree's build if it has one (an editable install may point at another tree),
# else the installed one; copied aside for the whole run, so that a rebuild meanwhile changes nothing.
PACKAGE = HERE.parent / "lmcache_adp"
if native_module(PACKAGE) is None:
    PACKAGE = Path(importlib.util.find_spec("lmcache_adp").origin).parent
SNAPSHOT = Path(tempfile.mkdtemp(prefix="lmcache-adp-bench-"))
atexit.register(shutil.rmtree, SNAPSHOT, True)
shutil.copytree(PACKAGE, SNAPSHOT / "lmcache_adp", ignore=shutil.ignore_patterns("__pycache__"))
SUB_ENV = {
    **os.environ,
    "LMCACHE_DISABLE_BANNER": "1",
    "PYTHONPATH": os.pathsep.join([str(SNAPSHOT), str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])]),
}
if __name__ == "__main__":
    # Run as the bench, this process measures the snapshot too, with format_card quiet (the benches' children keep
    # their INFO logs: SUB_ENV was taken above). Imported (tests/benchmarks/test_bench_l2.py) it changes neither:
    # an ADP_LOG_LEVEL=WARNING set at pytest's collection went to every gateway the tests started, which then never
    # printed the INFO "gateway ready" line they wait for: every gateway test failed after 60 s, and CI ran out of
    # its 90 minutes.
    sys.path.insert(0, str(SNAPSHOT))
    os.environ.setdefault("ADP_LOG_LEVEL", "WARNING")

BUILD = native_build(PACKAGE)  # the tree's, not the snapshot's (a copy: no commit, no sources)

import lmcache_adp  # noqa: E402
from lmcache_adp.log import showing_info  # noqa: E402

MiB, GiB = 1 << 20, 1 << 30
RESULTS = HERE / "results"
SHM_DIR = "/dev/shm/lmcache-adp-bench"
NUM_KEYS, IN_FLIGHT = 32, 4  # a round: IN_FLIGHT batches of NUM_KEYS keys submitted, then awaited
QD = 4  # I/O threads of every adapter (ADP/fs_native num_workers, raw_block workers) = fio jobs
FIO_JOBS = (QD, 2 * QD)  # QD 4 is the target; QD 8 shows what more depth gives
TARGETS = (
    "ADP >= 1.0x the best O_DIRECT peer and >= 0.9x fio QD4 (store and load); lookup <= 0.2x fs_native; "
    "through the gateway (unix + ring) store and load >= 0.9x embedded ADP"
)
GATEWAY_ROLES = ("gateway", "gateway-tcp")  # rows served by an `lmcache-adp gateway` process on the card
# --l1-hugetlb: every `lmcache bench l2` (ADP rows and peers alike) gets its L1 from the 2 MiB hugetlb pool
# (`--l1-use-hugepages`): one physical run per 2 MiB, the same for every row, where an ordinary L1's
# scattering differs from process to process (results/2026-12-05-2000-probe27-direct-read.md).
L1_HUGETLB = False
# --fio-think-us: one more fio row, QD4 reads where each job waits that long after each read (as a worker
# checking a CRC before its next read): fio QD4 over it is what hiding that CPU time behind the I/O can gain.
FIO_THINK_US = 0
# The fio row at ADP's durability: QD4 writes, each job with an fdatasync after every SLICE_KEYS writes, as each ADP
# worker syncs (put_slices) before it acknowledges its slice of a batch (NUM_KEYS keys cut into QD slices). fio's
# own row syncs once at the end (--end_fsync=1); a store acknowledged only when durable cannot. On this VM's disk
# those syncs cost fio ~7 % at 256 KiB in the median pass, 2-38 % in single passes
# (results/2026-12-06-1600-disk32-store-gap.md); ADP's group commit merges some of them (153 fdatasyncs for 17
# rounds at 256 KiB where the slices alone would be 272), fio's jobs cannot.
SLICE_KEYS = NUM_KEYS // QD
FIO_SYNC_ROW = f"fio O_DIRECT QD{QD}, fdatasync every {SLICE_KEYS} writes (ADP's syncs)"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


GATEWAY_PORT = free_port()


def sh(cmd: list[str], log: Path = Path(os.devnull), env: dict | None = None, cwd: Path | None = None) -> int:
    with open(log, "w") as out:
        return subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env or SUB_ENV, cwd=cwd).returncode


# --extra-adp LABEL=DIR: rows "ADP LABEL" run another built package (a tree's lmcache_adp, e.g. an older commit
# built in its own worktree) beside this one, in the same run. Filled by main(): row name -> its snapshot.
EXTRA: dict[str, dict] = {}


def extra_adp(arg: str) -> tuple[str, Path]:
    """Parses LABEL=DIR; DIR is a tree with lmcache_adp/ built in place, or the lmcache_adp directory itself."""
    label, sep, d = arg.partition("=")
    if not sep or not label or not d:
        raise argparse.ArgumentTypeError(f"--extra-adp {arg!r}: expected LABEL=DIR")
    pkg = Path(d).resolve()
    if pkg.name != "lmcache_adp":
        pkg = pkg / "lmcache_adp"
    if native_module(pkg) is None:
        raise argparse.ArgumentTypeError(f"--extra-adp {arg!r}: no built lmcache_adp._native in {pkg}")
    return label, pkg


def add_extra(label: str, pkg: Path) -> None:
    """Copies the package aside (as this tree's: a rebuild during the run changes nothing) and registers the
    row: its subprocesses (the bench, the card's format) import that copy first."""
    snap = Path(tempfile.mkdtemp(prefix=f"extra-{len(EXTRA)}-", dir=SNAPSHOT))
    shutil.copytree(pkg, snap / "lmcache_adp", ignore=shutil.ignore_patterns("__pycache__"))
    env = {**SUB_ENV, "PYTHONPATH": os.pathsep.join([str(snap), *SUB_ENV["PYTHONPATH"].split(os.pathsep)[1:]])}
    EXTRA[f"ADP {label}"] = {"env": env, "package": pkg, "build": native_build(pkg)}


def prefill(path: Path, nbytes: int) -> None:
    """Writes the whole file once (zeros, O_DIRECT), like a card in service: no holes, no first touch."""
    chunk = 64 * MiB
    sh(
        [
            "dd",
            "if=/dev/zero",
            f"of={path}",
            f"bs={chunk}",
            f"count={nbytes // chunk}",
            "oflag=direct",
            "conv=fsync",
            "status=none",
        ]
    )


# What the rows leave behind (fs_native's files, the sparse and preallocated card images) is moved aside under
# run-<pid>/retired/ and deleted with the run, not before the next row: deleting a pass's ~9,200 fs_native files
# on a disk mounted `discard` (this VM's /) slowed fs_native's next stores 3-4x (1,162 MiB/s, then 360 and 300 in
# the passes after such a delete; 950, 1,109, 846 with the files moved aside:
# results/2026-12-06-1040-fsnative-reset.md), a bias in ADP's favour (its card is re-formatted, never deleted).
# Below this much free space the run deletes instead, and the report names the rows that ran after a delete.
RETIRE_MIN_FREE = 16 * GiB
DELETED_BEFORE: list[str] = []  # "<row>, <size> KiB, pass <p>": rows that ran right after a delete


def retire(work: Path) -> bool:
    """Moves the rows' leftovers out of the next row's way (run-<pid>/retired/<n>/) without deleting them;
    where the filesystem has less than RETIRE_MIN_FREE free, deletes them. False when something was deleted."""
    leftovers = [p for p in (work / "files", work / "sparse.img", work / "prealloc.img") if p.exists()]
    if not leftovers:
        return True
    st = os.statvfs(work)
    if st.f_bavail * st.f_frsize < RETIRE_MIN_FREE:
        for p in leftovers:
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
        return False
    retired = work / "retired"
    retired.mkdir(exist_ok=True)
    slot = retired / str(len(list(retired.iterdir())))
    slot.mkdir()
    for p in leftovers:
        p.rename(slot / p.name)
    return True


def reset(work: Path, env: dict | None = None) -> bool:
    """Fresh state for the next adapter: empty card (new superblock), no files, nothing dirty in the page cache.
    With `env` (an --extra-adp row) the card is formatted by that row's package. False when the previous rows'
    leftovers had to be deleted (retire)."""
    kept = retire(work)
    card = str(work / "card.img")
    if env is None:
        lmcache_adp.format_card(card)
    # cwd: `-c` puts it first on sys.path, and a checkout's own lmcache_adp there would be imported instead
    elif sh([sys.executable, "-c", f"import lmcache_adp; lmcache_adp.format_card({card!r})"], env=env, cwd=work):
        raise RuntimeError(f"format_card({card}) failed with {env['PYTHONPATH']}")
    os.sync()
    return kept


def l1_pages(sizes_kb: list[int]) -> int:
    """2 MiB pages one `lmcache bench l2` L1 takes at the largest chunk size (store and load buffers of a
    round: 2 x NUM_KEYS x IN_FLIGHT chunks), one more for the rounding."""
    return -(-2 * NUM_KEYS * IN_FLIGHT * max(sizes_kb) * 1024 // (2 * MiB)) + 1


def fio(
    work: Path, raw: Path, bs: int, jobs: int, rw: str, nbytes: int, p: int, think_us: int = 0, sync_every: int = 0
) -> float:
    """MiB/s of `jobs` synchronous O_DIRECT sequential streams, each over its own slice of a written file; with
    `think_us`, each job waits that long after each I/O before its next, as a worker checking a CRC issues nothing
    meanwhile (asleep: fio 3.33 with --thinktime_spin of the whole think time hung); with `sync_every`, each job
    calls fdatasync after every that many writes (--fdatasync)."""
    tag = f"{f'-think{think_us}' if think_us else ''}{f'-sync{sync_every}' if sync_every else ''}"
    out = raw / f"fio-{bs // 1024}k-qd{jobs}-{rw}{tag}-pass{p}.json"
    per_job = nbytes // jobs
    sh(
        [
            "fio",
            "--name=adp-limit",
            f"--filename={work / 'fio.img'}",
            f"--filesize={nbytes}",
            f"--size={per_job}",
            f"--offset_increment={per_job}",
            f"--numjobs={jobs}",
            "--iodepth=1",
            "--ioengine=psync",
            "--direct=1",
            f"--bs={bs}",
            f"--rw={rw}",
            *([f"--thinktime={think_us}", "--thinktime_blocks=1"] if think_us else []),
            *([f"--fdatasync={sync_every}"] if sync_every else []),
            "--end_fsync=1",
            "--group_reporting",
            "--output-format=json",
            f"--output={out}",
        ]
    )
    return json.loads(out.read_text())["jobs"][0][rw]["bw_bytes"] / MiB


def memcpy_mibps(bs: int, nbytes: int) -> float:
    """One thread copying nbytes of warm memory (like the card's data in a load phase) in bs-byte chunks
    into warm buffers as many as one bench round loads into; the faster of two passes."""
    src = np.ones((nbytes // bs, bs), np.uint8)
    dst = np.ones((NUM_KEYS * IN_FLIGHT, bs), np.uint8)
    best = 0.0
    for _ in range(2):
        t0 = time.perf_counter()
        for i in range(len(src)):
            np.copyto(dst[i % len(dst)], src[i])
        best = max(best, nbytes / MiB / (time.perf_counter() - t0))
    return best


def adapters(work: Path, bs: int, card_gb: int) -> list[tuple[str, str, dict, int]]:
    """(name, role, --l2-adapter spec, --l1-align-bytes). Roles: adp; odirect (peers using O_DIRECT);
    buffered (peers through the page cache, no target); diag (ADP variations that explain the numbers);
    floor (LMCache's adapter around a connector that does nothing: lookup only); gateway, gateway-tcp
    (ADP through `lmcache-adp gateway` on the same card: Unix socket + ring, TCP loopback)."""
    files = str(work / "files")

    def plugin(**params) -> dict:
        return {
            "type": "native_plugin",
            "module_path": "lmcache_adp",
            "class_name": "ADPConnector",
            "adapter_params": {"num_workers": QD, **params},
        }

    def adp(card: str = "card.img", **params) -> dict:
        return plugin(card=str(work / card), card_size_gb=card_gb, **params)

    return [
        ("ADP", "adp", adp(), 4096),
        *((name, "adp", adp(), 4096) for name in EXTRA),
        ("ADP, L1 align 1", "adp", adp(), 1),
        ("ADP via gateway, unix + ring", "gateway", plugin(gateway=f"unix://{work / 'gw.sock'}"), 4096),
        (
            "ADP via gateway, TCP loopback",
            "gateway-tcp",
            plugin(gateway=f"tcp://127.0.0.1:{GATEWAY_PORT}", token_file=str(work / "gw.token")),
            4096,
        ),
        (
            "fs_native O_DIRECT",
            "odirect",
            {"type": "fs_native", "base_path": files, "num_workers": QD, "use_odirect": True},
            4096,
        ),
        (
            "raw_block",
            "odirect",
            {
                "type": "raw_block",
                "device_path": str(work / "raw.img"),
                "slot_bytes": bs + 4096,
                "num_store_workers": QD,
                "num_load_workers": QD,
                "load_checkpoint_on_init": False,
            },
            4096,
        ),
        ("fs_native buffered", "buffered", {"type": "fs_native", "base_path": files, "num_workers": QD}, 4096),
        ("fs (buffered)", "buffered", {"type": "fs", "base_path": files}, 4096),
        ("ADP durable=false", "diag", adp(durable=False), 4096),
        ("ADP num_workers=8", "diag", adp(num_workers=2 * QD), 4096),
        ("ADP on a new sparse image", "diag", adp("sparse.img"), 4096),
        ("ADP on a new preallocated image", "diag", adp("prealloc.img", card_preallocate=True), 4096),
        (
            "no-op connector",
            "floor",
            {"type": "native_plugin", "module_path": "noop_connector", "class_name": "NoopConnector"},
            4096,
        ),
    ]


def lmcache_bench(
    spec: dict, align: int, bs: int, rounds: int, out: Path, only: list[str], env: dict | None = None
) -> dict:
    """Runs `lmcache bench l2`; rates come from the median round, which bursts of load from other
    processes on a shared machine move less than the mean. --l1-hugetlb: run through hugetlb_l1.py (LMCache
    0.5.6 without CUDA gives `--l1-use-hugepages` ordinary memory), which records what the process's
    /proc/self/smaps showed right after mapping its L1 (out + .l1.jsonl); a row whose L1 was not on 2 MiB hugetlb
    pages stops the run (SystemExit with what smaps showed)."""
    l1_report = out.with_suffix(".l1.jsonl")
    if L1_HUGETLB:
        l1_report.unlink(missing_ok=True)
        env = {**(env or SUB_ENV), REPORT_ENV: str(l1_report)}
    rc = sh(
        [
            *([sys.executable, str(HERE / "hugetlb_l1.py")] if L1_HUGETLB else ["lmcache"]),
            "bench",
            "l2",
            "--l2-adapter",
            json.dumps(spec),
            "--num-keys",
            str(NUM_KEYS),
            "--in-flight",
            str(IN_FLIGHT),
            "--data-size-kb",
            str(bs // 1024),
            "--l1-align-bytes",
            str(align),
            "--rounds",
            str(rounds),
            "--warmup-rounds",
            "1",
            "--lookup-max-hit-rate",
            "1.0",
            "--no-skip-verify",
            *(["--l1-use-hugepages"] if L1_HUGETLB else []),
            "--format",
            "json",
            "--output",
            str(out),
            "-q",
            *only,
        ],
        out.with_suffix(".log"),
        env,
    )
    if L1_HUGETLB:
        checks = [json.loads(ln) for ln in l1_report.read_text().splitlines()] if l1_report.exists() else []
        if not checks or not all(c["ok"] for c in checks):
            seen = "; ".join(c["check"] for c in checks) or "no L1 mapped through hugetlb_l1.py (none recorded)"
            raise SystemExit(f"--l1-hugetlb: `lmcache bench l2` ({out.name}, exit {rc}): {seen}; refusing the run "
                             f"(its L1 would be ordinary memory; log: {out.with_suffix('.log')})")  # fmt: skip
    if not out.exists():
        return {"status": f"FAILED (exit {rc})"}
    ops = {m["operation"]: m for k, m in json.loads(out.read_text())["metrics"].items() if k.startswith("op_")}
    complete = all(m["total_success"] == m["total_keys"] and not m["rounds_timed_out"] for m in ops.values())
    row = {
        "status": ("lookup only" if only else "verified")
        if rc == 0 and complete
        else f"FAILED (exit {rc}, all keys: {complete})"
    }
    for op in ("Store", "Load"):
        if op in ops:
            row[op.lower()] = NUM_KEYS * IN_FLIGHT * bs / MiB / ops[op]["duration_p50_ms"] * 1000
    row["lookup_us"] = ops["Lookup"]["duration_p50_ms"] * 1000 / ops["Lookup"]["keys_per_round"]
    return row


def native_lookup_us(spec: dict, num_keys: int) -> float | None:
    """Median us/key of submit_batch_exists on the connector itself (no LMCache adapter around it), for the
    keys the bench stored, in batches of NUM_KEYS; the second of two passes."""
    if spec.get("module_path") == "lmcache_adp":
        client = lmcache_adp.ADPConnector(**spec["adapter_params"])
    elif spec["type"] == "fs_native":
        client = LMCacheFSClient(spec["base_path"], QD, "", spec.get("use_odirect", False), 0)
    else:
        return None
    keys = [_object_key_to_string(k) for k in make_object_keys(num_keys)]
    poller = select.poll()
    poller.register(client.event_fd(), select.POLLIN)
    times = []
    for i in list(range(0, num_keys, NUM_KEYS)) * 2:
        t0 = time.perf_counter()
        client.submit_batch_exists(keys[i : i + NUM_KEYS])
        while not client.drain_completions():
            poller.poll(1000)
        times.append(time.perf_counter() - t0)
    client.close()
    return statistics.median(times[len(times) // 2 :]) * 1e6 / NUM_KEYS


@contextlib.contextmanager
def serving(role: str, work: Path, log: Path):
    """For gateway rows: `lmcache-adp gateway` owns the card (Unix socket and TCP loopback) while the row runs,
    and is stopped with SIGTERM after it (the next reset formats the card, which needs its lock)."""
    if role not in GATEWAY_ROLES:
        yield
        return
    (work / "gw.token").write_text("bench-token\n")
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "lmcache_adp.cli",
                "gateway",
                "--card",
                str(work / "card.img"),
                "--socket",
                str(work / "gw.sock"),
                "--listen",
                f"tcp://127.0.0.1:{GATEWAY_PORT}",
                "--token-file",
                str(work / "gw.token"),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=showing_info(SUB_ENV),  # the ready line below is INFO
            cwd=work,  # `-m` puts the cwd first on sys.path: a checkout's unbuilt package there (audit 13)
        )
        try:
            deadline = time.monotonic() + 120
            while "gateway ready" not in log.read_text():
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"gateway did not start:\n{log.read_text()}")
                time.sleep(0.1)
            yield
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=120)


def best_of(old: dict | None, new: dict) -> dict:
    """Merges two passes: the higher rates and the lower times; a failure in either pass stands."""
    if old is None or "FAILED" in new["status"]:
        return new
    if "FAILED" in old["status"]:
        return old
    merged = {**old}
    for k, pick in (("store", max), ("load", max), ("lookup_us", min), ("native_lookup_us", min)):
        if new.get(k) is not None:
            merged[k] = pick(old[k], new[k])
    return merged


def run_size(
    work: Path, raw: Path, bs: int, nbytes: int, card_gb: int, medium: str, passes: int = 2, only: tuple = ()
) -> list[dict]:
    """`passes` passes over fio and the adapters (all, or the rows named in `only`), every other one in reverse
    order, so that where a run stands in the sequence does not favour it; each row keeps the better of its
    passes, and every pass's rates in "passes" (the same-run pairs)."""
    rows: dict[str, dict] = {}
    per_pass: dict[str, list[dict]] = {}

    def keep(name: str, row: dict) -> None:
        rows[name] = best_of(rows.get(name), row)
        per_pass.setdefault(name, []).append({k: row.get(k) for k in ("store", "load", "status")})

    entries = [e for e in adapters(work, bs, card_gb) if not only or e[0] in only]
    rounds = max(2, nbytes // (NUM_KEYS * IN_FLIGHT * bs))
    for p in range(1, passes + 1):
        order = entries if p % 2 else entries[::-1]
        for jobs in FIO_JOBS:
            name = f"fio O_DIRECT QD{jobs}"
            keep(
                name,
                {
                    "name": name,
                    "role": "fio" if jobs == QD else "info",
                    "align": "-",
                    "status": "psync, sequential",
                    "store": fio(work, raw, bs, jobs, "write", nbytes, p),
                    "load": fio(work, raw, bs, jobs, "read", nbytes, p),
                },
            )
        keep(
            FIO_SYNC_ROW,
            {
                "name": FIO_SYNC_ROW,
                "role": "fio-sync",
                "align": "-",
                "status": "psync, sequential",
                "store": fio(work, raw, bs, QD, "write", nbytes, p, sync_every=SLICE_KEYS),
            },
        )
        if FIO_THINK_US:
            name = f"fio O_DIRECT QD{QD}, {FIO_THINK_US} us idle after each read"
            keep(
                name,
                {
                    "name": name,
                    "role": "info",
                    "align": "-",
                    "status": "psync, sequential",
                    "load": fio(work, raw, bs, QD, "read", nbytes, p, FIO_THINK_US),
                },
            )
        if medium == "shm" and p == 1:
            rows["memcpy"] = {
                "name": "memcpy, 1 thread",
                "role": "memcpy",
                "align": "-",
                "status": "numpy copyto",
                "load": memcpy_mibps(bs, nbytes),
            }
        for name, role, spec, align in order:
            if p > 1 and role in ("buffered", "floor"):  # no target rides on them: one pass is enough
                continue
            env = EXTRA[name]["env"] if name in EXTRA else None
            if not reset(work, env):
                DELETED_BEFORE.append(f"{name}, {bs // 1024} KiB, pass {p}")
            print(f"  {bs // 1024} KiB, pass {p}: {name}", flush=True)
            slug = "".join(c if c.isalnum() else "-" for c in name.lower())
            out = raw / f"{bs // 1024}k-{slug}-pass{p}.json"
            with serving(role, work, out.with_suffix(".gateway.log")):
                row = {
                    "name": name,
                    "role": role,
                    "align": align,
                    **lmcache_bench(spec, align, bs, rounds, out, ["--only", "lookup"] if role == "floor" else [], env),
                }
                if row["status"] == "verified" and env is None:  # the extra package is not imported here
                    row["native_lookup_us"] = native_lookup_us(spec, (rounds + 1) * NUM_KEYS * IN_FLIGHT)
            keep(name, row)
    reset(work)
    for name, r in rows.items():
        r["passes"] = per_pass.get(name, [])
    return list(rows.values())


def selected(rows: list[str]) -> tuple[str, ...]:
    """The rows --row names, and every --extra-adp row with them (an extra row is asked for by its option);
    () when --row is not given: every row."""
    return (*rows, *(name for name in EXTRA if name not in rows)) if rows else ()


def pass_pairs(rows: list[dict]) -> list[str]:
    """Table lines: each ADP row's store and load over the best O_DIRECT peer of the same pass, pass by pass
    (the pairs the targets are judged on; the best-of-passes table above mixes passes)."""
    peers = [r for r in rows if r["role"] == "odirect"]
    n = max((len(r.get("passes", [])) for r in rows), default=0)
    lines = []
    for r in rows:
        if r["role"] not in ("adp", "diag") or not r.get("passes"):
            continue
        cells = []
        for op in ("store", "load"):
            ratios = []
            for p, mine in enumerate(r["passes"]):
                best = max(
                    (q["passes"][p][op] for q in peers if len(q.get("passes", [])) > p and q["passes"][p].get(op)),
                    default=None,
                )
                ok = mine.get(op) and mine["status"] == "verified" and best
                ratios.append(mine[op] / best if ok else None)
            text = ", ".join("-" if x is None else f"{x:.2f}x" for x in ratios)
            low = min((x for x in ratios if x is not None), default=None)
            cells.append(f"{text} (min {low:.2f}x)" if low is not None else text)
        lines.append(f"| {r['name']} | {cells[0]} | {cells[1]} |")
    if not lines or not peers:
        return []
    return [
        "",
        f"Same-run pairs, pass by pass ({n} passes, every other one in reverse order): each ADP row over the best "
        "O_DIRECT peer of the same pass.",
        "",
        "| ADP row | store / peer, each pass | load / peer, each pass |",
        "|---|---|---|",
        *lines,
    ]


def fmt(v: float | None, digits: int = 0) -> str:
    return "-" if v is None else f"{v:,.{digits}f}"


def ratio(a: float | None, b: float | None, goal: float, higher: bool = True) -> str:
    if not a or not b:
        return "-"
    r = a / b
    return f"{r:.2f}x {'ok' if (r >= goal if higher else r <= goal) else 'MISS'}"


def report(
    rows_by_size: dict[int, list[dict]],
    medium: str,
    work: Path,
    load: tuple[float, float],
    seconds: float,
    passes: int = 2,
) -> str:
    lines = [
        f"# L2 benchmark: {medium} ({work.parent})",
        "",
        f"{datetime.datetime.now():%Y-%m-%d %H:%M}, bench_l2.py at commit {COMMIT or '(not a git checkout)'}, "
        f"lmcache_adp from {PACKAGE}; {describe_build(BUILD)}; {os.cpu_count()} cores, kernel "
        f"{os.uname().release}, load average {load[0]:.1f} at the start and {load[1]:.1f} at the end; "
        f"took {seconds / 60:.1f} min. Command: `python benchmarks/bench_l2.py {' '.join(sys.argv[1:])}`",
        "- L1 of every row: "
        + (
            "hugetlb, 2 MiB pages (`lmcache bench l2 --l1-use-hugepages` run through benchmarks/hugetlb_l1.py, "
            "--l1-hugetlb): one physical run per 2 MiB, the same for ADP and peers; each row's process checked its "
            "L1 in /proc/self/smaps right after mapping it (KernelPageSize 2048 kB, all of it hugetlb; raw/*.l1.jsonl)"
            if L1_HUGETLB
            else "ordinary memory (torch.empty), physically scattered differently in each row's process"
        ),
        "- Each row's leftovers (fs_native's files, card images) moved aside until the run ended, not deleted "
        "before the next row (a delete on a `discard` mount slowed the next stores; bench_l2.py retire)"
        + (
            f"; **deleted for want of free space (< {RETIRE_MIN_FREE // GiB} GiB) before: "
            + "; ".join(DELETED_BEFORE)
            + "**: those rows' stores may be slowed"
            if DELETED_BEFORE
            else ""
        ),
        *(
            f"- Row '{name}': lmcache_adp from {x['package']}; {describe_build(x['build'])}"
            for name, x in EXTRA.items()
        ),
        "",
        f"Each round submits {IN_FLIGHT} batches of {NUM_KEYS} keys and waits for them (1 warmup round); "
        f"every adapter and fio run at queue depth {QD}. MiB/s and lookup us/key come from the median round "
        f"(lookups hit stored keys); each row is the better of {passes} passes (one for buffered and floor). "
        "'Connector only' times submit_batch_exists on the native connector without LMCache's adapter "
        "around it. Method and limits: benchmarks/README.md.",
        "",
        f"Targets: {TARGETS}" + ("; ADP load >= 0.7x single-thread memcpy." if medium == "shm" else "."),
        "",
    ]
    for bs, rows in rows_by_size.items():
        lines += [
            f"## {bs // 1024} KiB chunks",
            "",
            "| adapter | role | L1 align | store MiB/s | load MiB/s | lookup us/key | same, connector only | result |",
            "|---|---|---|---:|---:|---:|---:|---|",
        ]
        lines += [
            f"| {r['name']} | {r['role']} | {r['align']} | {fmt(r.get('store'))} | {fmt(r.get('load'))} | "
            f"{fmt(r.get('lookup_us'), 2)} | {fmt(r.get('native_lookup_us'), 2)} | {r['status']} |"
            for r in rows
        ]
        ok = [r for r in rows if r["status"] == "verified"]
        peers = [r for r in ok if r["role"] == "odirect"]
        best = {op: max(peers, key=lambda r: r[op]) if peers else {} for op in ("store", "load")}
        fio_row = next(r for r in rows if r["role"] == "fio")
        fio_sync = next((r["store"] for r in rows if r["role"] == "fio-sync"), None)
        fs_native = {
            k: min((r[k] for r in ok if r["name"].startswith("fs_native") and r.get(k) is not None), default=None)
            for k in ("lookup_us", "native_lookup_us")
        }
        memcpy = next((r["load"] for r in rows if r["role"] == "memcpy"), None)
        lines += [
            "",
            f"Best O_DIRECT peer: store {best['store'].get('name')}, load {best['load'].get('name')}. "
            "fs_native lookup: the faster of its two rows.",
            "",
            "| ADP row | store / best peer | load / best peer | store / fio QD4 | load / fio QD4 "
            "| lookup / fs_native | same, connector only |"
            + (" store / fio QD4 with ADP's syncs |" if fio_sync else "")
            + (" load / memcpy |" if memcpy else ""),
            "|---|---|---|---|---|---|---|" + ("---|" if fio_sync else "") + ("---|" if memcpy else ""),
        ]
        for r in ok:
            if r["role"] in ("adp", "diag"):
                lines.append(
                    f"| {r['name']} | {ratio(r['store'], best['store'].get('store'), 1)} | "
                    f"{ratio(r['load'], best['load'].get('load'), 1)} | {ratio(r['store'], fio_row['store'], 0.9)} | "
                    f"{ratio(r['load'], fio_row['load'], 0.9)} | "
                    f"{ratio(r['lookup_us'], fs_native['lookup_us'], 0.2, False)} | "
                    f"{ratio(r.get('native_lookup_us'), fs_native['native_lookup_us'], 0.2, False)} |"
                    + (f" {ratio(r['store'], fio_sync, 0.9)} |" if fio_sync else "")
                    + (f" {ratio(r['load'], memcpy, 0.7)} |" if memcpy else "")
                )
        if fio_sync:
            lines += [
                "",
                f"'store / fio QD4 with ADP's syncs': over the row '{FIO_SYNC_ROW}', fio at the durability of ADP's "
                "stores (one fdatasync a slice of a batch, each acknowledged only when durable; fio QD4 syncs once, "
                "at the end). Information beside the target, which stays 'store / fio QD4'.",
            ]
        lines += pass_pairs(rows)
        embedded = next((r for r in ok if r["name"] == "ADP"), None)
        gateways = [r for r in ok if r["role"] in GATEWAY_ROLES]
        if embedded and gateways:
            lines += [
                "",
                "Through the gateway, against embedded ADP (same card, same connector settings; the TCP "
                "row has no target):",
                "",
                "| gateway row | store / embedded | load / embedded | lookup, connector only / embedded |",
                "|---|---|---|---|",
            ]
            for r in gateways:
                cells = [
                    ratio(r[op], embedded[op], 0.9) if r["role"] == "gateway" else f"{r[op] / embedded[op]:.2f}x"
                    for op in ("store", "load")
                ]
                lookup = r.get("native_lookup_us"), embedded.get("native_lookup_us")
                cells.append(f"{lookup[0] / lookup[1]:.1f}x" if all(lookup) else "-")
                lines.append(f"| {r['name']} | {' | '.join(cells)} |")
        lines.append("")
    return "\n".join(lines)


def run_medium(medium: str, args: argparse.Namespace, stamp: str) -> Path:
    work = (
        Path(args.dir if medium == "disk" else SHM_DIR).resolve() / f"run-{os.getpid()}"
    )  # own files, even if runs overlap
    results = RESULTS / "tmp" if args.quick else RESULTS  # quick runs are smoke tests, not results
    raw = results / "raw" / f"{stamp}-{medium}"
    work.mkdir(parents=True)
    raw.mkdir(parents=True, exist_ok=True)
    nbytes = (256 if args.quick else 2048) * MiB  # per measured store or load phase
    card_gb = 2 if args.quick else 4
    t0, load0 = time.time(), os.getloadavg()[0]
    print(f"{medium}: writing the card, raw_block and fio images in {work}", flush=True)
    only = selected(args.row)
    # raw_block's image only where a row reads it: 4 GiB written for nothing otherwise (minutes on a busy disk)
    uses_raw = any("raw.img" in json.dumps(e[2]) for e in adapters(work, 4096, card_gb) if not only or e[0] in only)
    images = {"card.img": card_gb * GiB, **({"raw.img": card_gb * GiB} if uses_raw else {}), "fio.img": nbytes}
    try:
        for name, size in images.items():
            prefill(work / name, size)
        rows = {
            kb * 1024: run_size(work, raw, kb * 1024, nbytes, card_gb, medium, args.passes, only)
            for kb in args.sizes_kb
        }
    finally:
        shutil.rmtree(work)
    (raw / "rows.json").write_text(json.dumps(rows, indent=1))
    md = results / f"{stamp}-{medium}.md"
    md.write_text(report(rows, medium, work, (load0, os.getloadavg()[0]), time.time() - t0, args.passes))
    return md


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--dir",
        default="/var/tmp/lmcache-adp-bench",
        help="directory on the disk under test; each run works in its own run-<pid>/ under it",
    )
    p.add_argument("--medium", choices=("disk", "shm", "both"), default="both")
    p.add_argument("--sizes-kb", type=lambda s: [int(x) for x in s.split(",")], default=[256, 2048])
    p.add_argument("--quick", action="store_true", help="smoke run: 256 MiB per phase, written to results/tmp/")
    p.add_argument("--passes", type=int, default=2, help="passes over fio and the rows, every other one reversed")
    p.add_argument(
        "--row",
        action="append",
        default=[],
        metavar="NAME",
        help="run only this row (repeat for more; fio always runs); default: every row",
    )
    p.add_argument(
        "--extra-adp",
        type=extra_adp,
        action="append",
        default=[],
        metavar="LABEL=DIR",
        help="one more ADP row, 'ADP LABEL', from the lmcache_adp built in place in tree DIR (another commit)",
    )
    p.add_argument(
        "--l1-hugetlb",
        action="store_true",
        help="every row's L1 from the 2 MiB hugetlb pool (grown for the run by one L1's pages, given back after; "
        "root): the same physical contiguity for ADP and peers. Each `lmcache bench l2` runs through "
        "benchmarks/hugetlb_l1.py (LMCache 0.5.6 without CUDA falls back to ordinary memory) and checks its L1 in "
        "/proc/self/smaps: a row whose L1 is not on hugetlb pages stops the run",
    )
    p.add_argument(
        "--fio-think-us",
        type=int,
        default=0,
        metavar="US",
        help="one more fio row: QD4 reads, each job idle US microseconds after each read (a CRC's time)",
    )
    args = p.parse_args()
    if args.passes < 1:
        p.error("--passes must be at least 1")
    for label, pkg in args.extra_adp:
        add_extra(label, pkg)
    names = [e[0] for e in adapters(Path("/"), 256 * 1024, 4)]
    unknown = [r for r in args.row if r not in names]
    if unknown:
        p.error(f"--row {', '.join(map(repr, unknown))}: no such row; rows: {', '.join(map(repr, names))}")
    require_tool("fio")  # before any run: the limit is measured first
    exit_on_sigterm()  # stopped by SIGTERM, the run removes its run-<pid>/ and snapshot as on Ctrl-C
    stamp = f"{datetime.datetime.now():%Y-%m-%d-%H%M}"
    global L1_HUGETLB, FIO_THINK_US
    L1_HUGETLB, FIO_THINK_US = args.l1_hugetlb, args.fio_think_us
    with hugetlb_pool(l1_pages(args.sizes_kb)) if L1_HUGETLB else contextlib.nullcontext():
        for medium in ("disk", "shm") if args.medium == "both" else (args.medium,):
            print(f"wrote {run_medium(medium, args, stamp)}", flush=True)


if __name__ == "__main__":
    main()
