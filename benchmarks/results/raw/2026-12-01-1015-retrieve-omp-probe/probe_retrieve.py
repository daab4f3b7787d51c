# SPDX-License-Identifier: Apache-2.0
"""Where a slow RETRIEVE (L1 -> KV) spends its time in the MP server: per-thread CPU of the
server, its page faults and context switches, sampled around each phase of a restore."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, "/work/wt-restore")
from lmcache_adp.testing import KVShape, MPServer, VLLMClient, adp_adapter, drop_l1, store_prompt  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def threads(pid: int) -> dict[int, tuple[str, float]]:
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            comm = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
            f = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
            st = Path(f"/proc/{pid}/task/{tid}/status").read_text()
            vol = sum(int(l.split()[1]) for l in st.splitlines() if l.startswith("voluntary_ctxt"))
            inv = sum(int(l.split()[1]) for l in st.splitlines() if l.startswith("nonvoluntary_ctxt"))
            sw = vol + inv * 100000
            out[int(tid)] = (comm, (int(f[11]) + int(f[12])) / TICK, sw)
        except FileNotFoundError:
            pass
    return out


def proc(pid: int) -> dict[str, int]:
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    st = {"minflt": int(f[7]), "majflt": int(f[9])}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        k, _, v = line.partition(":")
        if k in ("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches", "VmRSS", "RssShmem"):
            st[k] = int(v.split()[0])
    return st


def get_latency(port):
    from lmcache_adp.testing.server import read_metrics
    import urllib.request
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    tot = cnt = 0.0
    for line in text.splitlines():
        if line.startswith("lmcache_adp_op_latency_seconds_sum") and 'op="get"' in line:
            tot = float(line.rsplit(" ", 1)[1])
        if line.startswith("lmcache_adp_op_latency_seconds_count") and 'op="get"' in line:
            cnt = float(line.rsplit(" ", 1)[1])
    return tot, cnt


def delta(a, b):
    return {k: b[k] - a[k] for k in b}


def thread_delta(a, b):
    out = {}
    for tid, (name, t, sw) in b.items():
        d = t - a.get(tid, (name, 0.0, 0))[1]
        dsw = sw - a.get(tid, (name, 0.0, 0))[2]
        if d > 0 or dsw > 20:
            out[f"{name}/{tid}"] = (round(d, 2), dsw)
    return dict(sorted(out.items(), key=lambda kv: -kv[1][0]))


def main() -> None:
    tier, workdir = sys.argv[1], Path(sys.argv[2])
    reps = int(sys.argv[3]) if len(sys.argv) > 3 else 4
    shm = "--shm" in sys.argv
    workdir.mkdir(parents=True, exist_ok=True)
    if tier == "mock":
        adapter = {"type": "mock", "max_size_gb": 2, "mock_bandwidth_gb": 1000}
    else:
        from lmcache_adp.testing.server import free_port
        MPORT = free_port()
        adapter = adp_adapter(card=str(workdir / "card.img"), card_size_gb=8, num_workers=4, metrics_port=MPORT)
    if tier == "adp2":
        adapter = {**adapter, "module_path": "omp_probe_plugin", "class_name": "SecondTeamConnector"}
    shm_name = f"probe-{os.getpid()}"
    extra = ["--shm-name", shm_name] if shm else []
    shape = KVShape(num_layers=32, num_heads=8, head_dim=128, block_size=16, num_blocks=8192 // 16 + 1)
    server = MPServer([adapter], workdir, l1_size_gb=3.1, chunk_size=256, name=tier, extra_args=extra)
    for kv in filter(None, os.environ.get("SERVER_ENV", "").split(",")):
        k, _, v = kv.partition("=")
        server.env[k] = v
    if tier == "adp2":
        server.env["PYTHONPATH"] = "/tmp/rs/omp_plugin:/work/wt-restore"
    server.start()
    pid = server.pid
    try:
        with VLLMClient(server.url, shape, timeout=600) as client:
            stored = store_prompt(server, client, 8192)
            for i in range(reps):
                for kind in ("l1", "l2"):
                    if kind == "l2":
                        drop_l1(server)
                    n = len(stored.tokens)
                    client.zero(stored.src_blocks)
                    rid = f"probe-{i}-{kind}"
                    th0, p0 = threads(pid), proc(pid)
                    g0 = get_latency(MPORT) if tier != "mock" else (0, 0)
                    if os.environ.get("SPYLOOKUP") and kind == "l2":
                        subprocess.Popen(f"sleep 0.3; py-spy dump --pid {pid} > {workdir}/lookup-{i}.txt 2>&1; sleep 0.2; py-spy dump --pid {pid} > {workdir}/lookup-{i}b.txt 2>&1", shell=True)
                    t0 = time.perf_counter()
                    hit = client.lookup(rid, stored.tokens)
                    t1 = time.perf_counter()
                    th1, p1 = threads(pid), proc(pid)
                    g1 = get_latency(MPORT) if tier != "mock" else (0, 0)
                    lk = thread_delta(th0, th1)
                    lk_cpu = round(sum(v[0] for v in lk.values()), 2)
                    perf = None
                    if os.environ.get("PERF"):
                        perf = subprocess.Popen(["perf", "record", "-q", "-g", "-p", str(pid), "-o",
                                                 f"{workdir}/perf-{i}-{kind}.data"], stderr=subprocess.DEVNULL)
                        time.sleep(0.3)
                    t1 = time.perf_counter()
                    if os.environ.get("PYSPY") and i == 1:
                        spy = subprocess.Popen(f"sleep 0.5; py-spy dump --native --pid {pid} > {workdir}/spy-{i}-{kind}.txt 2>&1", shell=True)
                    ok = client.retrieve(rid, stored.tokens, stored.src_blocks, hit)
                    t2 = time.perf_counter()
                    if perf is not None:
                        perf.send_signal(signal.SIGINT); perf.wait()
                    th2, p2 = threads(pid), proc(pid)
                    client.end_request(rid)
                    same = client.blocks_bytes(stored.src_blocks, n) == stored.expected
                    print(f"{tier}{'+shm' if shm else ''} {os.environ.get('SERVER_ENV', '')} {kind} lookup {t1 - t0:.3f} retrieve {t2 - t1:.3f} ok={ok and same}"
                          f" card get batches {g1[1] - g0[1]:.0f} took {g1[0] - g0[0]:.3f} s, lookup cpu {lk_cpu} minflt {p1['minflt'] - p0['minflt']} top {list(lk.items())[:6]} load {os.getloadavg()[0]:.1f} minflt {p2['minflt'] - p1['minflt']} threads {thread_delta(th1, th2)}", flush=True)
    finally:
        server.stop()
        Path(f"/dev/shm/lmcache_l1_pool_{shm_name}").unlink(missing_ok=True)


if __name__ == "__main__":
    main()
