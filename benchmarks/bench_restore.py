#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Restore time of a long prompt through a real LMCache MP server, per tier.

What a user waits for when vLLM asks for a prompt it has seen before: LOOKUP
(LMCache prefetches the chunks into its CPU tier, L1) and RETRIEVE (L1 -> the
worker's KV blocks), measured with the client classes vLLM's LMCacheMPConnector
uses (lmcache_adp.testing), on CPU tensors, lmcache_driven transfer.

In one run, on one disk, for one prompt (default 8192 tokens of Llama-8B-shaped
KV: 32 layers, 8 KV heads, head dim 128, fp16 = 1 GiB in 32 chunks of 32 MiB):

  cpu_tier   restore while the prompt is still in L1 (from each server below)
  mock       L2 = LMCache's `mock` adapter: RAM, bandwidth limit set out of the way
  adp        L2 = the card through this plugin (embedded; O_DIRECT on an image file)
  adp_gw     the same through `lmcache-adp gateway` (when this build has it)
  adp_fit    as adp, on a card formatted with regions of two chunks each (its 4 KiB header and two
             chunks' footprints): no chunk runs from one region into the next (not in the default)
  adp_prealloc as adp, on an image allocated at creation (adapter_params card_preallocate; adp's is
             sparse): not in the default
  fs_native  L2 = LMCache's `fs_native` with use_odirect on the same disk
  fio        the medium's limit: the prompt's bytes over fio's O_DIRECT sequential
             read bandwidth, at the card's I/O size (one read per object: the chunk
             LMCache stores, 256 tokens of the shape given, 32 MiB by default)
             and depth (its 4 workers), plus a deeper row for reference; with
             --l1-hugetlb the same rows into 2 MiB hugetlb buffers as well

Each L2 tier gets its own fresh server: store the prompt, wait until LMCache
has written every chunk to L2, restore it from L1 (--repeat times), then
--repeat times: POST /cache/clear, restore from L2. Every restore must hit every
token with identical bytes, and an L2 restore must be reported as L2 by the
server (log line and counter) or it is not counted.

Run on the tree under test, built in place (it measures the tree it lives in, servers included, even
where an editable install points at another tree; without a build in place, the installed package):
    python benchmarks/bench_restore.py

The goal (issue 4): adp - mock (what the card adds) <= 1.05 x the medium's
limit, and < fs_native - mock. Medians of the repeats are compared; every
sample is kept. Writes benchmarks/results/<date>-restore.md and the raw
outputs (JSON of every sample, fio's JSON, server logs) to
benchmarks/results/raw/<date>-restore/; a run that fails or is stopped after it
started measuring keeps what it has (server and gateway logs, samples so far) in
benchmarks/results/raw/<date>-restore-FAILED/ (--results-dir: another results directory).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
import warnings
from dataclasses import asdict
from pathlib import Path

os.environ.setdefault("LMCACHE_LOG_LEVEL", "WARNING")  # client side; servers log INFO to raw/
os.environ.setdefault("LMCACHE_DISABLE_BANNER", "1")
warnings.filterwarnings("ignore", category=FutureWarning)

from hugetlb_l1 import l1_check_pid  # noqa: E402
from tools import (  # noqa: E402
    ProcessDied,
    dead_process,
    describe_build,
    exit_on_sigterm,
    fail_fast,
    hugetlb_pool,
    native_build,
    require_tool,
    round_orders,
    use_own_tree,
)

# This tree's package when it is built in place, here and in the servers it starts (not an editable install's).
if __name__ == "__main__":
    use_own_tree(Path(__file__).resolve().parents[1])

import lmcache_adp  # noqa: E402
from lmcache_adp import __version__ as adp_version  # noqa: E402
from lmcache_adp import format_card  # noqa: E402
from lmcache_adp.gateway_stats import read_gateway_stats  # noqa: E402
from lmcache_adp.testing import (  # noqa: E402
    KVShape,
    MPServer,
    VLLMClient,
    adp_adapter,
    drop_l1,
    restore_prompt,
    store_prompt,
)

# The tree's tests.support (the gateway launcher, the server-log reader), found
# once lmcache_adp is imported: an installed lmcache_adp is measured as installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.support.gateway import Gateway  # noqa: E402
from tests.support.mp_server import prefetch  # noqa: E402 (the server's log line for each lookup)

GiB, MiB = 1 << 30, 1 << 20
HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
CHUNK_TOKENS = 256  # LMCache's default chunk size
ADP_WORKERS = 4  # ADPConnector num_workers = fs_native num_workers = fio jobs
FIO_JOBS = (ADP_WORKERS, 2 * ADP_WORKERS)  # each job reads its share of the prompt: at least one block


def run_fio(path: Path, nbytes: int, bs: int, jobs: int, raw: Path, when: str, iomem: str = "malloc") -> dict:
    """Sequential O_DIRECT read of an nbytes file (whole bs blocks), `jobs` threads each reading its share (the
    same whole number of blocks each, the remainder unread: fio measures a rate) in bs requests, into buffers of
    `iomem`: malloc (fio's default, ordinary 4 KiB pages) or mmaphuge (anonymous MAP_HUGETLB, 2 MiB pages: the
    request size an L1 on hugetlb pages lets the disk see; item5v: scattered pages cap a request near 1 MiB)."""
    out = raw / (f"fio-{when}-bs{bs}-j{jobs}" + ("" if iomem == "malloc" else f"-{iomem}") + ".json")
    share = nbytes // bs // jobs * bs
    cmd = [
        require_tool("fio"), "--name=restore-limit", f"--filename={path}", "--rw=read", "--direct=1",
        "--ioengine=psync", f"--bs={bs}", f"--numjobs={jobs}", f"--size={share}",
        f"--offset_increment={share}", "--group_reporting", "--loops=3",
        "--output-format=json", f"--output={out}", *([f"--iomem={iomem}"] if iomem != "malloc" else []),
    ]  # fmt: skip
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    job = json.loads(out.read_text())["jobs"][0]["read"]
    return {"when": when, "bs": bs, "jobs": jobs, "iomem": iomem, "bw_bytes": job["bw_bytes"], "cmd": " ".join(cmd)}


def fio_limit(work: Path, nbytes: int, chunk: int, raw: Path, when: str, hugetlb: bool = False) -> list[dict]:
    """fio's rows at the card's I/O size: one read per stored object (`chunk` bytes) of an nbytes file (a whole
    number of chunks: --tokens a multiple of 256), written with one dd block per chunk, so exactly nbytes long.
    hugetlb (--l1-hugetlb): the same rows again into 2 MiB hugetlb buffers (fio --iomem=mmaphuge, from the pool
    grown for the servers' L1, idle while fio runs)."""
    path = work / "fio.dat"
    if not path.exists() or path.stat().st_size != nbytes:  # written once, for real (no holes)
        subprocess.run(
            ["dd", "if=/dev/urandom", f"of={path}", f"bs={chunk}", f"count={nbytes // chunk}", "iflag=fullblock",
             "oflag=direct", "conv=fsync", "status=none"], check=True,
        )  # fmt: skip
    rows = [run_fio(path, nbytes, chunk, jobs, raw, when) for jobs in FIO_JOBS]
    if hugetlb:
        rows += [run_fio(path, nbytes, chunk, jobs, raw, when, "mmaphuge") for jobs in FIO_JOBS]
    return rows


def other_load() -> list[str]:
    """Benchmarks or stress runs of other people on this machine right now (they skew every number)."""
    r = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True)
    mine = {os.getpid()}
    hits = []
    for line in r.stdout.splitlines():
        pid, _, args = line.strip().partition(" ")
        if int(pid) not in mine and any(w in args for w in ("bench_l2", "lmcache bench", "fio ", "stress")):
            hits.append(args[:120])
    return hits


def measure_tier(name: str, adapter: dict, shape: KVShape, tokens: int, repeat: int, l1_gb: float,
                 raw: Path, l1_shm: bool = False, gateway: Gateway | None = None,
                 server_env: dict | None = None, l1_hugetlb: bool = False,
                 trace: tuple[str, str] | None = None) -> dict:  # fmt: skip
    """One fresh server with this L2: store, restores from L1, then restores from L2. l1_shm: LMCache's L1
    pool in a /dev/shm file (`lmcache server --shm-name`), as docs tell a gateway's operators to run it.
    If the server (or the gateway it uses) dies meanwhile, ProcessDied with its log tail, at once."""
    shm = f"adp-restore-{os.getpid()}-{name.replace('+', '-')}"
    extra = (["--shm-name", shm] if l1_shm else []) + (["--l1-use-hugepages"] if l1_hugetlb else [])
    server = MPServer([adapter], raw, l1_size_gb=l1_gb, chunk_size=CHUNK_TOKENS, name=name, extra_args=extra)
    if l1_hugetlb:  # LMCache's own --l1-use-hugepages falls back to ordinary memory without CUDA: hugetlb_l1.py
        server.args = [sys.executable, str(HERE / "hugetlb_l1.py"), *server.args[server.args.index("server") :]]
    server.env.update(server_env or {})
    before = _reclaim()
    server.start()
    # What the server's L1 is made of (/proc/PID/smaps), recorded for the report; with --l1-hugetlb a server whose
    # L1 is not on 2 MiB hugetlb pages stops the run (item5v: every "--l1-hugetlb" L1 had been 4 KiB pages).
    l1 = l1_check_pid(server.pid, int(l1_gb * GiB))
    if l1_hugetlb and not l1.ok:
        server.stop()
        raise SystemExit(f"--l1-hugetlb: {name}'s MP server (PID {server.pid}), /proc/PID/smaps: {l1.text}; "
                         "refusing the run (its L1 would be ordinary memory)")  # fmt: skip
    samples: dict[str, list] = {"cpu_tier": [], "l2": []}
    watched = {f"lmcache server ({name})": (server.proc, server.log_tail)}
    if gateway is not None:
        watched["gateway"] = (gateway.proc, lambda: "\n".join(gateway.log().splitlines()[-40:]))
    try:
        with fail_fast(watched):
            client = VLLMClient(server.url, shape, timeout=600)
            dead = None
            try:
                stored = store_prompt(server, client, tokens)
                result = {"store_s": stored.store_s, "l2_written_s": stored.l2_write_s, "l1_check": l1.text}
                for _ in range(repeat):
                    samples["cpu_tier"].append(restore_prompt(server, client, stored))
                for _ in range(repeat):
                    left = drop_l1(server)
                    if left:
                        raise RuntimeError(f"{name}: {left} objects stay in L1 after POST /cache/clear")
                    if trace is None:
                        samples["l2"].append(restore_prompt(server, client, stored))
                        continue
                    how, rnd = trace
                    with trace_of(server.proc.pid, raw / f"{how}-{name}-{rnd}-l2-{len(samples['l2']) + 1}.txt", how):
                        samples["l2"].append(restore_prompt(server, client, stored))
            except BaseException as e:
                # A dead server can show as another error first (a refused HTTP request): reported as its death.
                dead = dead_process(watched, grace_s=2.0)
                if dead is not None and not isinstance(e, ProcessDied):
                    raise ProcessDied(dead) from e
                raise
            finally:
                if dead is None:  # close() would wait for a dead server's answer, without a timeout
                    client.close()
    finally:
        server.stop()
        if l1_shm:  # LMCache leaves its pool file behind when it is stopped
            Path(f"/dev/shm/lmcache_l1_pool_{shm}").unlink(missing_ok=True)
    after = _reclaim()
    result["reclaim"] = {k: after[k] - before.get(k, 0) for k in after}
    for kind, rs in samples.items():
        result[kind] = []
        for r in rs:
            if not r.ok:
                raise RuntimeError(f"{name} {kind}: restore failed: {r}")
            # The server's counter and its log line for the lookup must agree on the tier.
            p = prefetch(server, r.request_id)
            came_from_l2 = r.from_l2 and p is not None and (p.from_l1, p.from_l2) == (0, r.hit_chunks)
            if came_from_l2 != (kind == "l2"):
                raise RuntimeError(f"{name} {kind}: restore came from the wrong tier: {r}, log: {p}")
            result[kind].append({**asdict(r), "prefetch": asdict(p) if p else None, "total_s": r.total_s})
    return result


@contextlib.contextmanager
def trace_of(pid: int, out: Path, how: str):
    """A trace of a running server (every thread) around one restore (--trace): `strace` (strace -f -tt -T: its
    reads, eventfd writes and futex hand-offs; slows every syscall) or `perf` (perf record of the read and write
    syscalls' tracepoints and the scheduler's switches and wake-ups: little cost, and shows the CPU time of the
    card's CRC threads and how long a woken thread waited for a CPU), written as text to `out`; the threads' names
    beside it (out + .threads, the process's own id first). benchmarks/restore_timeline.py reads either."""
    names = []
    for task in sorted(Path(f"/proc/{pid}/task").iterdir(), key=lambda p: (int(p.name) != pid, int(p.name))):
        try:
            names.append(f"{task.name} {(task / 'comm').read_text().strip()}")
        except OSError:
            pass
    Path(str(out) + ".threads").write_text("\n".join(names) + "\n")
    if how == "strace":
        calls = "pread64,preadv,preadv2,read,write,futex,openat,close,io_submit,io_getevents,io_uring_enter"
        cmd = ["strace", "-f", "-tt", "-T", "-e", f"trace={calls}", "-p", str(pid), "-o", str(out)]
    else:
        events = [
            f"syscalls:sys_{e}_{c}" for c in ("read", "pread64", "preadv", "write", "openat") for e in ("enter", "exit")
        ]
        events += ["sched:sched_switch", "sched:sched_wakeup"]
        # System-wide (-a): `perf record -p` of these tracepoints recorded nothing here; the server's lines kept below.
        cmd = ["perf", "record", "-q", "-a", "-e", ",".join(events), "-o", str(out) + ".data"]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # every thread attached
    disk = Path(str(out) + ".diskstats")  # the disks' counters around the restore: its requests' mean size
    disk.write_text(Path("/proc/diskstats").read_text())
    try:
        yield
    finally:
        with disk.open("a") as f:
            f.write(Path("/proc/diskstats").read_text())
        time.sleep(0.3)  # the completions' last syscalls
        p.send_signal(signal.SIGINT)
        p.wait(timeout=60)
        if how == "perf":
            fields = "comm,pid,tid,time,event,trace"
            r = subprocess.run(
                ["perf", "script", "-F", fields, "-i", str(out) + ".data"], capture_output=True, text=True
            )
            out.write_text(server_lines(r.stdout, pid))
            Path(str(out) + ".data").unlink(missing_ok=True)


def server_lines(script: str, pid: int) -> str:
    """`perf script` lines of one process: its threads' syscalls, and the scheduler events naming one of its threads
    (a thread switched in or woken shows in another task's line). A comm may hold spaces."""
    mine = re.compile(rf"^\s*\S.*? {pid}/(\d+) ")
    lines = script.splitlines()
    tids = {m.group(1) for m in map(mine.match, lines) if m}
    named = re.compile(r"(?:next_pid|prev_pid| pid)=(\d+)")
    keep = (ln for ln in lines if mine.match(ln) or (" sched:sched_" in ln and set(named.findall(ln)) & tids))
    return "".join(ln + "\n" for ln in keep)


def tier_order_text(res: dict) -> str:
    """The order the tiers ran in, round by round, for the report (older results: the given order, every
    other round reversed)."""
    if not res.get("tier_orders"):
        return "every other one in reverse tier order"
    rounds = "; ".join(f"{i + 1}: {', '.join(o)}" for i, o in enumerate(res["tier_orders"]))
    return f"tier order by round (shuffled by seed {res['seed']}, every other round reversed) {rounds}"


def median(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def l1_text(res: dict) -> str:
    """What the report can say of the servers' L1: what each server's /proc/PID/smaps showed after its start (runs
    since hugel1 record it), never what was merely asked for."""
    checks = [(n, i + 1, r["l1_check"]) for n, t in res["tiers"].items() for i, r in enumerate(t.get("rounds", []))
              if r.get("l1_check")]  # fmt: skip
    asked = "asked for (--l1-hugetlb, each server started through benchmarks/hugetlb_l1.py)" if res.get(
        "l1_hugetlb") else "not asked for"  # fmt: skip
    if not checks:
        return (f"L1: hugetlb {asked}; the servers' L1 was not checked in this run (before hugel1 an L1 asked for "
                "on hugetlb pages was ordinary 4 KiB pages on a host without CUDA: LMCache 0.5.6's fallback).")  # fmt: skip
    on_huge = sum(c.startswith("L1 on 2 MiB hugetlb pages") for _, _, c in checks)
    lines = [f"L1: hugetlb {asked}; each server's /proc/PID/smaps checked after its start: {on_huge} of "
             f"{len(checks)} servers with the L1 ({res['l1_size_gb']} GiB) in one mapping on 2 MiB hugetlb pages "
             "(KernelPageSize 2048 kB, all of it Private_/Shared_Hugetlb):"]  # fmt: skip
    lines += [f"- {n}, round {rnd}: {c}" for n, rnd, c in checks]
    return "\n".join(lines)


def render(res: dict) -> str:
    nbytes = res["prompt"]["bytes"]
    fio_rows = res["fio"]
    # The limit for the servers' L1: into hugetlb buffers where it was (--l1-hugetlb), else fio's own (4 KiB pages).
    iomem = "mmaphuge" if res.get("l1_hugetlb") and any(r.get("iomem") == "mmaphuge" for r in fio_rows) else "malloc"
    limit_bw = max(r["bw_bytes"] for r in fio_rows if r["jobs"] == ADP_WORKERS and r.get("iomem", "malloc") == iomem)
    limit_s = nbytes / limit_bw
    tiers = res["tiers"]
    lines = [
        f"# Restore of a {res['prompt']['tokens']}-token prompt ({nbytes / GiB:.2f} GiB of KV) through the LMCache MP server",
        "",
        f"{res['when']}, {res['host']['cpus']} CPUs (load average {res['host']['loadavg_start'][0]:.1f} at the start, "
        f"{res['host']['loadavg_end'][0]:.1f} at the end: the machine is shared), {res['host']['kernel']}, "
        f"disk: {res['host']['disk']}; "
        f"lmcache {res['versions']['lmcache']}, lmcache-adp {res['versions']['lmcache_adp']} ({res['versions']['git']}, "
        f"package {res['versions'].get('package', '(not recorded)')}); "
        f"{describe_build(res['versions']['native'])}.",
        f"Shape {res['prompt']['shape']}; chunk {CHUNK_TOKENS} tokens "
        f"({res['prompt']['chunk_bytes'] / MiB:.0f} MiB per object); {res['repeat']} restores per tier "
        f"and round, {res.get('rounds', 1)} round(s), {tier_order_text(res)}; "
        "method in benchmarks/bench_restore.py; raw samples and server logs in raw/.",
        "",
        l1_text(res),
        "",
        f"Command: `{res.get('command', '(not recorded)')}`; MP servers' added environment: "
        f"{', '.join(res.get('server_env') or []) or 'none'}",
        "",
        "Restore = LOOKUP (LMCache prefetches L2 -> L1) + RETRIEVE (L1 -> worker KV blocks). Medians; [min-max].",
        "",
        "| tier | restore s | lookup (prefetch) s | retrieve s | adds over RAM L2 s |",
        "|---|---|---|---|---|",
    ]
    mock_l2 = median(tiers["mock"]["l2"], "total_s") if "mock" in tiers else None

    def row(label: str, rs: list[dict], adds: bool) -> str:
        tot = [r["total_s"] for r in rs]
        add = f"{median(rs, 'total_s') - mock_l2:+.3f}" if adds and mock_l2 is not None else ""
        return (f"| {label} | {statistics.median(tot):.3f} [{min(tot):.3f}-{max(tot):.3f}] | "
                f"{median(rs, 'lookup_s'):.3f} | {median(rs, 'retrieve_s'):.3f} | {add} |")  # fmt: skip

    cpu = [r for t in tiers.values() for r in t["cpu_tier"]]
    lines.append(row("CPU tier (L1), all servers", cpu, False))
    labels = {"mock": "RAM L2 (mock)", "adp": "card, this plugin (embedded)", "adp_gw": "card, this plugin (gateway)",
              "fs_native": "fs_native, O_DIRECT, same disk",
              "adp_fit": "card, this plugin (embedded), regions of two chunks",
              "adp_prealloc": "card, this plugin (embedded), image allocated at creation"}  # fmt: skip
    for name, t in tiers.items():
        base, _, l1 = name.partition("+")
        label = labels[base] + (", L1 in /dev/shm (--shm-name)" if l1 == "shm" else "")
        lines.append(row(label, t["l2"], base != "mock"))
    lines += [
        f"| medium's limit: bytes / fio O_DIRECT read | {limit_s:.3f} | | | {limit_s:+.3f} |",
        "",
        "fio, sequential O_DIRECT read of a 1-prompt file on the same disk (psync, the jobs share it):",
        "",
        "| run | block | jobs | buffers | GiB/s | prompt in s |",
        "|---|---|---|---|---|---|",
    ]
    buffers = {"malloc": "4 KiB pages (fio's malloc)", "mmaphuge": "2 MiB hugetlb (--iomem=mmaphuge)"}
    for r in fio_rows:
        lines.append(f"| {r['when']} the tiers | {r['bs'] / MiB:g} MiB | {r['jobs']} | "
                     f"{buffers[r.get('iomem', 'malloc')]} | {r['bw_bytes'] / GiB:.2f} | "
                     f"{nbytes / r['bw_bytes']:.3f} |")  # fmt: skip
    lines += [
        "",
        f"fio's block is the object LMCache stores for this shape: one chunk of {CHUNK_TOKENS} tokens, "
        f"{res['prompt']['chunk_bytes']} bytes ({res['prompt']['chunk_bytes'] / MiB:g} MiB), one read per object "
        f"as the card does. The medium's limit is the faster {ADP_WORKERS}-job run (the stricter goal) into "
        f"{buffers[iomem]} buffers, as the servers' L1.",
    ]
    for when in ("start", "end"):
        others = res["host"].get(f"other_load_{when}")
        if others:
            lines.append(f"Other benchmarks on the machine at the {when}: " + "; ".join(f"`{o}`" for o in others))
    lines += ["", "## Goal", ""]
    if "adp" in tiers and mock_l2 is not None:
        adp_adds = median(tiers["adp"]["l2"], "total_s") - mock_l2
        lines.append(f"- card adds {adp_adds:.3f} s; 1.05 x the medium's limit ({limit_s:.3f} s) = {1.05 * limit_s:.3f} s: "
                     f"{'met' if adp_adds <= 1.05 * limit_s else 'MISSED'} ({adp_adds / limit_s:.2f}x the limit)")  # fmt: skip
        if "fs_native" in tiers:
            fs_adds = median(tiers["fs_native"]["l2"], "total_s") - mock_l2
            lines.append(
                f"- fs_native adds {fs_adds:.3f} s: card below it: {'met' if adp_adds < fs_adds else 'MISSED'}"
            )
        if "adp_gw" in tiers:
            gw_adds = median(tiers["adp_gw"]["l2"], "total_s") - mock_l2
            lines.append(f"- through the gateway the card adds {gw_adds:.3f} s ({gw_adds / limit_s:.2f}x the limit)")
    # Issue 10 item 5: the L2->L1 phase (LMCache's prefetch, the lookup) of each tier against mock's with
    # the same kind of L1 (in process memory, or in /dev/shm).
    for name, t in tiers.items():
        base, _, l1 = name.partition("+")
        ref = "mock" + (f"+{l1}" if l1 else "")
        if base != "mock" and ref in tiers:
            a, m = median(t["l2"], "lookup_s"), median(tiers[ref]["l2"], "lookup_s")
            lines.append(f"- L2->L1 phase, {name} / {ref}: {a:.3f} / {m:.3f} s = {a / m:.2f}x (goal <= 1.2x)")
    for name, t in tiers.items():
        stalls = [r["reclaim"].get("allocstall_normal", 0) + r["reclaim"].get("allocstall_movable", 0)
                  for r in t.get("rounds", []) if "reclaim" in r]  # fmt: skip
        if stalls:
            lines.append(f"- {name}: direct-reclaim stalls (/proc/vmstat allocstall_*) per round: {stalls}")
    for name, note in res["notes"].items():
        lines.append(f"- {name}: {note}")
    lines.append("")
    lines.append("Store (for reference, not a goal): " + "; ".join(
        f"{n} STORE acknowledged in {t['store_s']:.2f} s, all chunks on L2 {t['l2_written_s']:.2f} s after it was sent"
        for n, t in tiers.items()))  # fmt: skip
    return "\n".join(lines) + "\n"


def l1_size_gb(nbytes: int) -> float:
    """Each MP server's L1 for a prompt of `nbytes`: the stored copy and a prefetched copy, and a GiB."""
    return round(2 * nbytes / GiB + 1, 1)


WORKDIR_MARK = ".bench_restore-workdir"  # in a --workdir this benchmark made


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=8192, help="prompt length (multiple of 256; default 8192 = 1 GiB)")
    ap.add_argument("--repeat", type=int, default=3, help="restores per tier and kind (default 3)")
    ap.add_argument("--workdir", default="/var/tmp/lmcache-adp-bench-restore",
                    help="on the disk under test: card image, fs_native files, fio file, logs (removed after)")  # fmt: skip
    ap.add_argument(
        "--tiers",
        default="mock,adp,adp_gw,fs_native",
        help="comma-separated; NAME+shm runs that tier's server with its L1 in /dev/shm (--shm-name)",
    )
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run the tiers this many times: in an order shuffled by --seed, every other round in reverse",
    )
    ap.add_argument("--seed", type=int, help="seed of the tier order (default: a random one, recorded)")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--tag", default="restore", help="result name: <date>-<tag>")
    ap.add_argument("--results-dir", default=str(RESULTS), help="where the report and raw/ go (default: %(default)s)")
    ap.add_argument(
        "--l1-hugetlb",
        action="store_true",
        help="every MP server's L1 from the 2 MiB hugetlb pool (`lmcache server --l1-use-hugepages`, started through "
        "benchmarks/hugetlb_l1.py: LMCache 0.5.6 without CUDA falls back to ordinary memory; the pool grown by one "
        "L1's pages for the run, given back after; root): the same physical contiguity for every tier, where an "
        "ordinary L1's differs from server to server and sets the disk requests' size (restore37, item5v). Each "
        "server's /proc/PID/smaps is checked: a run whose L1 is not on hugetlb pages is refused. fio's rows are "
        "run again into hugetlb buffers (--iomem=mmaphuge), the limit for such an L1",
    )
    ap.add_argument(
        "--server-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="set in every MP server's environment (e.g. OMP_WAIT_POLICY=PASSIVE, see README's CPU-only note)",
    )
    ap.add_argument(
        "--trace",
        choices=("strace", "perf"),
        help="trace every server around each L2 restore (raw/HOW-TIER-rN-l2-I.txt, the threads' names beside: "
        "benchmarks/restore_timeline.py reads them): strace slows the traced restores (a timeline, not a timing); "
        "perf records syscall and scheduler tracepoints (root)",
    )
    args = ap.parse_args()
    if args.seed is None:
        args.seed = int.from_bytes(os.urandom(4), "little")
    shape = KVShape(num_layers=args.layers, num_heads=args.kv_heads, head_dim=args.head_dim, block_size=16,
                    num_blocks=args.tokens // 16 + 1)  # fmt: skip
    if args.tokens <= 0 or args.tokens % CHUNK_TOKENS:  # LMCache stores whole chunks: a partial one is not stored
        ap.error(f"--tokens {args.tokens}: must be a positive multiple of {CHUNK_TOKENS} (LMCache's chunk)")
    chunk = CHUNK_TOKENS * shape.bytes_per_token  # the object LMCache writes: fio's block
    need = chunk * max(FIO_JOBS)
    if args.tokens * shape.bytes_per_token < need:  # fio would fail: a job's share smaller than one block
        least = max(FIO_JOBS) * CHUNK_TOKENS
        ap.error(f"--tokens {args.tokens}: a prompt of {args.tokens * shape.bytes_per_token / MiB:.0f} MiB; the fio "
                 f"step reads it in {chunk / MiB:g} MiB blocks (one per chunk) with up to {max(FIO_JOBS)} jobs, each "
                 f"its share: at least {need / MiB:g} MiB is needed, {least} tokens of this shape")  # fmt: skip
    work = Path(args.workdir)
    if work.exists() and (not work.is_dir() or any(work.iterdir())) and not (work / WORKDIR_MARK).exists():
        ap.error(f"--workdir {work}: exists and holds files this benchmark did not make; it removes its work "
                 f"directory before and after a run, so give it an empty or new directory")  # fmt: skip
    require_tool("fio")  # before any run: the limit is measured first
    exit_on_sigterm()  # stopped by SIGTERM, the servers are stopped and the work directory removed, as on Ctrl-C
    print(f"lmcache_adp measured: {Path(lmcache_adp.__file__).parent}", flush=True)
    args.stamp = datetime.datetime.now().strftime("%Y-%m-%d-%H%M")
    if args.l1_hugetlb and any(t.endswith("+shm") for t in args.tiers.split(",")):
        ap.error("--l1-hugetlb with a NAME+shm tier: LMCache's hugetlb L1 cannot be a /dev/shm pool (--shm-name)")
    l1_pages = -(-int(l1_size_gb(args.tokens * shape.bytes_per_token) * GiB) // (2 * MiB)) + 1
    try:
        with hugetlb_pool(l1_pages) if args.l1_hugetlb else contextlib.nullcontext():
            return measure(args, shape)
    except BaseException:  # a failed step, Ctrl-C, SIGTERM: the server logs and samples so far are kept
        keep_failed(args, work / "raw", getattr(args, "partial", None))
        raise
    finally:  # on any failure too: the card images, fs_native files and fio file are the disk's
        shutil.rmtree(args.workdir, ignore_errors=True)


def keep_failed(args: argparse.Namespace, raw: Path, res: dict | None = None) -> Path | None:
    """Copies the run's raw dir (server and gateway logs, fio's JSON, `res` as samples.json) to
    <results>/raw/<stamp>-<tag>-FAILED and says where; None when the run made none yet."""
    if not raw.is_dir():
        return None
    if res is not None:
        (raw / "samples.json").write_text(json.dumps(res, indent=1))
    (raw / "token").unlink(missing_ok=True)  # the gateway's TCP token: nothing to keep
    dest = Path(args.results_dir) / "raw" / f"{args.stamp}-{args.tag}-FAILED"
    shutil.copytree(raw, dest, dirs_exist_ok=True)
    print(f"raw outputs of the failed run in {dest}", file=sys.stderr, flush=True)
    return dest


def measure(args: argparse.Namespace, shape: KVShape) -> int:
    nbytes = args.tokens * shape.bytes_per_token
    gib = nbytes / GiB
    stamp = args.stamp
    results = Path(args.results_dir)
    work = Path(args.workdir)
    shutil.rmtree(work, ignore_errors=True)
    raw = work / "raw"  # staged here, copied into benchmarks/results at the end
    raw.mkdir(parents=True)
    (work / WORKDIR_MARK).touch()  # a later run may remove this directory (main's --workdir check)
    l1_gb = l1_size_gb(nbytes)
    card_gb = max(8, 4 * gib)  # region = card/64 must hold one 32 MiB chunk

    res: dict = {
        "when": datetime.datetime.now().isoformat(timespec="seconds"),
        "command": " ".join(["python", "benchmarks/bench_restore.py", *sys.argv[1:]]),
        "prompt": {
            "tokens": args.tokens,
            "bytes": nbytes,
            "shape": asdict(shape),
            "chunk_bytes": CHUNK_TOKENS * shape.bytes_per_token,
        },  # fmt: skip
        "repeat": args.repeat,
        "rounds": args.rounds,
        "seed": args.seed,
        "tier_orders": [],
        "versions": {
            "lmcache_adp": adp_version,
            "package": str(Path(lmcache_adp.__file__).parent),
            "lmcache": _version("lmcache"),
            "git": _git(),
            "native": native_build(),
        },  # fmt: skip
        "host": {
            "cpus": os.cpu_count(),
            "kernel": platform.release(),
            "disk": _disk(work),
            "loadavg_start": os.getloadavg(),
        },  # fmt: skip
        "l1_size_gb": l1_gb,
        "l1_hugetlb": args.l1_hugetlb,
        "server_env": args.server_env,
        "notes": {},
        "tiers": {},
    }
    args.partial = res  # what main keeps if a step fails
    print(f"fio on {work} ...", flush=True)
    res["host"]["other_load_start"] = other_load()
    res["fio"] = fio_limit(work, nbytes, res["prompt"]["chunk_bytes"], raw, "before", args.l1_hugetlb)
    adapters = {
        "mock": {"type": "mock", "max_size_gb": gib + 1, "mock_bandwidth_gb": 1000},
        "adp": adp_adapter(card=str(work / "card.img"), card_size_gb=card_gb, num_workers=ADP_WORKERS),
        "adp_fit": adp_adapter(card=str(work / "card-fit.img"), card_size_gb=card_gb, num_workers=ADP_WORKERS),
        # as adp, on an image allocated at creation (card_preallocate), not sparse
        "adp_prealloc": adp_adapter(
            card=str(work / "card-prealloc.img"), card_size_gb=card_gb, num_workers=ADP_WORKERS, card_preallocate=True
        ),
        "fs_native": {
            "type": "fs_native",
            "base_path": str(work / "fs_native"),
            "use_odirect": True,
            "num_workers": ADP_WORKERS,
        },  # fmt: skip
    }
    tiers = args.tiers.split(",")
    if any(t.partition("+")[0] == "adp_fit" for t in tiers):
        # Regions of their 4 KiB header and two chunks' footprints (4 KiB header block + payload): no chunk
        # runs from one region into the next (the default geometry, card / ~128, does every other time).
        fit = 4096 + 2 * (4096 + res["prompt"]["chunk_bytes"])
        format_card(str(work / "card-fit.img"), int(card_gb * GiB), fit)
        res["notes"]["adp_fit"] = f"card formatted with regions of {fit} bytes (two chunks each)"
    server_env = dict(kv.split("=", 1) for kv in args.server_env)
    res["tier_orders"] = round_orders(tiers, args.rounds, args.seed)
    for rnd, order in enumerate(res["tier_orders"]):
        for name in order:
            base, _, l1 = name.partition("+")
            gateway = None
            adapter = adapters.get(base)
            if base == "adp_gw":
                # A gateway that cannot start stops the run with its reason (asked for, so measured or failed).
                gateway = Gateway(raw, card_size_gb=card_gb, card=work / "gw-card.img", socket=work / "gw.sock").start()
                adapter = adp_adapter(gateway=gateway.url, num_workers=ADP_WORKERS)
            print(f"{name} (round {rnd + 1}) ...", flush=True)
            try:
                got = measure_tier(
                    name,
                    adapter,
                    shape,
                    args.tokens,
                    args.repeat,
                    l1_gb,
                    raw,
                    l1 == "shm",
                    gateway,
                    server_env,
                    args.l1_hugetlb,
                    (args.trace, f"r{rnd + 1}") if args.trace else None,
                )
                if gateway is not None:  # which path the gateway's loads took: segments (one copy) or the ring
                    st = read_gateway_stats(gateway.url)
                    res["notes"][f"{name}, round {rnd + 1}"] = (
                        f"gateway counters: {st.get('segment_loads', 0):.0f} objects loaded straight into L1, "
                        f"{st.get('segment_stores', 0):.0f} stored from it in place, {st.get('hits', 0):.0f} hits"
                    )
            except ProcessDied as e:  # keep what there is (server logs, samples so far) and stop at once
                print(f"{name} (round {rnd + 1}): {e}", file=sys.stderr, flush=True)
                keep_failed(args, raw, res)
                shutil.rmtree(work, ignore_errors=True)
                sys.stdout.flush()
                if gateway is not None:
                    gateway.stop()
                for seg in Path("/dev/shm").glob(f"lmcache_kv_{os.getpid()}_*"):  # this client's KV cache
                    seg.unlink(missing_ok=True)
                os._exit(1)  # not return: LMCache's client threads still wait on the dead server
            finally:
                if gateway is not None:
                    gateway.stop()
            # What a tier left unwritten (fs_native's O_DIRECT files are never synced: this VM's host may hold them)
            # is written now, not during the next tier's restores (tl39: the card's ran 1.3-2.3x slower right after
            # fs_native's than after mock's or first); how long it took is noted.
            t0 = time.monotonic()
            os.sync()
            res["notes"][f"sync after {name}, round {rnd + 1}"] = f"{time.monotonic() - t0:.2f} s"
            t = res["tiers"].setdefault(name, {"cpu_tier": [], "l2": [], "rounds": []})
            t["cpu_tier"] += got["cpu_tier"]
            t["l2"] += got["l2"]
            t["rounds"].append(
                {
                    "store_s": got["store_s"],
                    "l2_written_s": got["l2_written_s"],
                    "reclaim": got["reclaim"],
                    "l1_check": got["l1_check"],
                    "position": order.index(name) + 1,
                }
            )
            t["store_s"], t["l2_written_s"] = got["store_s"], got["l2_written_s"]
            print(f"  L1 restore {median(t['cpu_tier'], 'total_s'):.3f} s, "
                  f"L2 restore {median(t['l2'], 'total_s'):.3f} s", flush=True)  # fmt: skip
    print("fio again ...", flush=True)
    res["fio"] += fio_limit(work, nbytes, res["prompt"]["chunk_bytes"], raw, "after", args.l1_hugetlb)
    res["host"]["loadavg_end"] = os.getloadavg()
    res["host"]["other_load_end"] = other_load()

    (raw / "samples.json").write_text(json.dumps(res, indent=1))
    report = render(res)
    (raw / "token").unlink(missing_ok=True)  # the gateway's TCP token: nothing to keep
    dest = results / "raw" / f"{stamp}-{args.tag}"
    shutil.copytree(raw, dest, dirs_exist_ok=True)
    (results / f"{stamp}-{args.tag}.md").write_text(report)
    shutil.rmtree(work, ignore_errors=True)
    print(report)
    print(f"raw outputs in {dest}")
    return 0


def _version(dist: str) -> str:
    from importlib.metadata import version

    return version(dist)


def _reclaim() -> dict[str, int]:
    """The kernel's direct-reclaim counters: a tier run while the machine was short of memory stalls in them
    (this VM has no swap; a tmpfs card and an L1 in /dev/shm are memory that cannot be reclaimed)."""
    keys = ("allocstall_normal", "allocstall_movable", "pgsteal_direct", "pgmajfault")
    out = {}
    with open("/proc/vmstat") as f:
        for line in f:
            k, _, v = line.partition(" ")
            if k in keys:
                out[k] = int(v)
    return out


def _git() -> str:
    r = subprocess.run(["git", "-C", str(HERE), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return r.stdout.strip() or "?"


def _disk(path: Path) -> str:
    r = subprocess.run(["df", "--output=source,fstype", str(path)], capture_output=True, text=True)
    return " ".join(r.stdout.split()[2:]) or "?"


if __name__ == "__main__":
    sys.exit(main())
