#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A/B of two trees: builds two revisions (or a revision and the working tree) in scratch directories and runs
one benchmark command on each, alternately, ROUNDS rounds (A,B then B,A, ...), with each tree's package first on
PYTHONPATH; takes named figures from every run and prints them per round with B/A, the median and pooled B/A,
and each side's own spread (the A/A noise) beside them. With --a and --b the same revision it is an A/A run: the
noise floor itself. Method: benchmarks/README.md, "A/B of two trees".

  python benchmarks/ab.py --a main --b WORKTREE --rounds 4 --lock /work/bench.lock \\
      --raw benchmarks/results/raw/<UTC>-<tag> --metric store=l2:ADP:store --metric load=l2:ADP:load -- \\
      python benchmarks/bench_l2.py --medium disk --sizes-kb 2048 --passes 1 --row ADP --dir /var/tmp/ab-l2

In the command, {tree} is the tree's root (also its working directory) and {out} a directory of the run's own
under --raw for its JSON (bench_connector.py --out {out}; probe_store_sync.py --out {out}/probe.json); a report
bench_l2.py writes ("wrote X.md") is copied there with its raw directory. Scratch trees are removed at the end,
on Ctrl-C too.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import ab_metrics  # (run as a script, this directory is first on sys.path)

WORKTREE = "WORKTREE"
# Interrupted, how long a running benchmark gets to end on the Ctrl-C it shares with ab.py, then after a SIGINT
# from ab.py, before SIGKILL (run_benchmark).
GRACE_S = (5.0, 60.0)
SIDES = ("A", "B")


def order(round_no: int) -> tuple[str, str]:
    """The sides of round `round_no` (from 1) in the order they run: A first in odd rounds, B first in even."""
    return SIDES if round_no % 2 else SIDES[::-1]


def git(repo: Path, *args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, **kw)


def build_tree(repo: Path, rev: str, dest: Path, build_from: Path | None, log: Path) -> str:
    """Puts revision `rev` of `repo` (or WORKTREE: its tracked and untracked, not ignored, files as they are
    now) in `dest` and builds the native module in place there, starting from a copy of `build_from`'s object
    directories (build/temp.*: objects are reused by content and command, so only what differs compiles).
    Returns what was built, in words."""
    dest.mkdir(parents=True)
    if rev == WORKTREE:
        files = git(repo, "ls-files", "-z", "--cached", "--others", "--exclude-standard").stdout.split(b"\0")
        for name in filter(None, (f.decode() for f in files)):
            src = repo / name
            if src.is_file():
                (dest / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dest / name)
        head = git(repo, "rev-parse", "--short", "HEAD", text=True).stdout.strip()
        dirty = git(repo, "status", "--porcelain", text=True).stdout.strip()
        what = f"working tree of {repo} at {head}" + (" with uncommitted changes" if dirty else "")
    else:
        commit = git(repo, "rev-parse", "--short", f"{rev}^{{commit}}", text=True).stdout.strip()
        archive = git(repo, "archive", "--format=tar", commit).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
        what = f"{rev} = {commit}"
    if build_from is not None:
        for temp in build_from.glob("temp.*"):
            shutil.copytree(temp, dest / "build" / temp.name, symlinks=True)
    env = {**os.environ, "ADP_WERROR": "1", "ADP_BUILD_JOBS": os.environ.get("ADP_BUILD_JOBS", "2")}
    with open(log, "w") as f:
        r = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=dest, env=env,
                           stdout=f, stderr=subprocess.STDOUT)  # fmt: skip
    if r.returncode:
        raise RuntimeError(f"building {what} failed (exit {r.returncode}): see {log}")
    return what


def native_digest(tree: Path) -> str:
    """sha256 (16 hex digits) of the native module(s) built in `tree`, or 'none'."""
    mods = sorted((tree / "lmcache_adp").glob("_native*.so"))
    return ", ".join(f"{m.name} {hashlib.sha256(m.read_bytes()).hexdigest()[:16]}" for m in mods) or "none"


@contextlib.contextmanager
def locked(path: str | None):
    """flock on `path` for the block (one benchmark run), or nothing without one."""
    if not path:
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def uptime() -> str:
    r = subprocess.run(["uptime"], capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else f"load average {os.getloadavg()}"


def collect_reports(output: str, tree: Path, out: Path) -> None:
    """Copies each report a run says it wrote under its tree ("wrote X.md", bench_l2.py) into `out`, with the
    raw directory beside it (results/raw/<X>/: bench_l2's rows.json), as the scratch tree goes at the end."""
    for md in re.findall(r"^wrote (\S+\.md)$", output, re.M):
        md = Path(md) if Path(md).is_absolute() else tree / md
        if md.is_file() and tree.resolve() in md.resolve().parents:
            shutil.copy2(md, out / md.name)
            raw = md.parent / "raw" / md.stem
            if raw.is_dir():
                shutil.copytree(raw, out / md.stem)


def run_benchmark(argv: list[str], tree: Path, env: dict) -> subprocess.CompletedProcess:
    """Runs the benchmark to its end. Interrupted (Ctrl-C, or SIGTERM to ab.py), it lets the benchmark clean up
    as its own Ctrl-C would (bench_l2.py removes its run directory, GiBs of images, in a finally block): a
    terminal's Ctrl-C reaches it too, so it gets 5 s before ab.py sends it SIGINT, and 60 s more before SIGKILL."""
    proc = subprocess.Popen(
        argv,
        cwd=tree,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # Ctrl-C's default back in the benchmark: started in the background (nohup ... &), ab.py and its children
        # inherit SIGINT ignored, and the SIGINT below would then leave it no way to clean up.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        out, _ = proc.communicate()
    except BaseException:
        for sig, wait_s in ((None, GRACE_S[0]), (signal.SIGINT, GRACE_S[1]), (signal.SIGKILL, None)):
            if sig is not None:
                proc.send_signal(sig)
            try:
                proc.wait(wait_s)
                break
            except subprocess.TimeoutExpired:
                continue
        raise
    return subprocess.CompletedProcess(argv, proc.returncode, out)


def run_one(command: list[str], tree: Path, out: Path, lock: str | None, metrics: dict) -> dict:
    """One run of `command` in `tree` (its package first on PYTHONPATH) under `lock`: its output, exit status,
    the lmcache_adp it imports (checked to be the tree's) and its figures, or why it failed."""
    out.mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")]))}
    argv = [a.replace("{tree}", str(tree)).replace("{out}", str(out)) for a in command]
    probe = [sys.executable, "-c", "import lmcache_adp; print(lmcache_adp.__file__)"]
    with locked(lock):
        before = uptime()
        imported = subprocess.run(probe, cwd=tree, env=env, capture_output=True, text=True).stdout.strip()
        r = run_benchmark(argv, tree, env)
        after = uptime()
    res = {"argv": argv, "rc": r.returncode, "uptime_before": before, "uptime_after": after, "imported": imported}
    collect_reports(r.stdout, tree, out)
    if r.returncode:
        res["failed"] = f"exit {r.returncode}"
    elif not imported or tree.resolve() not in Path(imported).resolve().parents:
        res["failed"] = f"imported lmcache_adp from {imported or '(nothing)'}, not from the tree {tree}"
    else:
        res["values"] = {}
        for name, spec in metrics.items():
            try:
                res["values"][name] = ab_metrics.extract(spec, out, r.stdout)
            except Exception as e:  # a figure it cannot read fails this run, not the whole A/B (reason kept)
                res["failed"] = f"metric {name} ({spec}): {e}"
                del res["values"]
                break
    header = "\n".join(f"# {k}: {v}" for k, v in res.items() if k != "values")
    (out / "output.txt").write_text(f"{header}\n# values: {res.get('values')}\n{r.stdout}")
    return res


def report(runs: list[dict], metrics: dict, trees: dict) -> tuple[str, dict]:
    """The summary text and JSON: per metric, each round's A and B (or FAILED), B/A, and ab_metrics.summarize."""
    lines = [f"{side}: {trees[side]}" for side in SIDES]
    summary = {}
    rounds = sorted({run["round"] for run in runs})
    for failed in (run for run in runs if "failed" in run):
        lines.append(f"FAILED round {failed['round']} {failed['side']}: {failed['failed']} (raw: {failed['out']})")
    for name, spec in metrics.items():
        per = [
            {run["side"]: run["values"][name] for run in runs if run["round"] == n and "values" in run} for n in rounds
        ]
        s = ab_metrics.summarize(per)
        summary[name] = {"spec": spec, "rounds": per, **s}
        lines += ["", f"{name} ({spec})", "| round | order | A | B | B/A |", "|---|---|---|---|---|"]
        for n, vals, ratio in zip(rounds, per, s["ratios"], strict=True):
            cells = [f"{vals[side]:.4g}" if side in vals else "FAILED" for side in SIDES]
            lines.append(f"| {n} | {','.join(order(n))} | {' | '.join(cells)} | {'-' if ratio is None else f'{ratio:.3f}'} |")  # fmt: skip
        fmt = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
        pct = lambda x: "-" if x is None else f"+-{x * 100:.1f}%"  # noqa: E731
        lines += [
            f"median B/A {fmt(s['median_ratio'])} over {sum(x is not None for x in s['ratios'])} rounds; pooled "
            f"(median of B's rounds / median of A's) {fmt(s['pooled_ratio'])}; A/A: A's rounds within "
            f"{pct(s['a_spread'])} of their median, B's within {pct(s['b_spread'])}",
            s["verdict"],
        ]
    return "\n".join(lines), summary


def write_summary(raw: Path, runs: list[dict], metrics: dict, trees: dict, done: bool) -> str:
    """raw/summary.md and summary.json as of the runs so far (rewritten after each run, so that an A/B stopped
    part way keeps the figures of its finished runs); returns the summary's text."""
    text, summary = report(runs, metrics, trees)
    now = datetime.datetime.now(datetime.timezone.utc)
    state = "" if done else f" (PARTIAL: {len(runs)} runs so far)"
    head = f"ab.py {' '.join(sys.argv[1:])}\n{now:%Y-%m-%d %H:%M} UTC{state}\n"
    (raw / "summary.md").write_text(head + text + "\n")
    data = {"complete": done, "trees": trees, "runs": runs, "metrics": summary}
    (raw / "summary.json").write_text(json.dumps(data, indent=1))
    return text


def run_ab(args: argparse.Namespace, make_tree=build_tree) -> int:
    """Builds the two trees (make_tree(repo, rev, dest, build_from, log), injectable), runs the rounds, writes
    raw/summary.md and summary.json; returns 0, or 1 when any run failed."""
    raw = Path(args.raw).resolve()
    raw.mkdir(parents=True, exist_ok=True)
    metrics = dict(ab_metrics.parse_metric(m) for m in args.metric)
    scratch = Path(tempfile.mkdtemp(prefix="adp-ab-", dir=args.scratch))
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM cleans up as Ctrl-C does
    try:
        trees, paths = {}, {}
        revs = {"A": args.a, "B": args.b}
        for side in SIDES:
            paths[side] = scratch / side
            what = make_tree(Path(args.repo), revs[side], paths[side], args.build_from, raw / f"build-{side}.log")
            trees[side] = f"{what}; native {native_digest(paths[side])}"
            print(f"{side}: {trees[side]}", flush=True)
        runs = []
        for n in range(1, args.rounds + 1):
            for side in order(n):
                out = raw / f"r{n}-{side}"
                run = {"round": n, "side": side, "out": str(out)}
                run.update(run_one(args.command, paths[side], out, args.lock, metrics))
                runs.append(run)
                print(f"round {n} {side}: {run.get('values') or 'FAILED: ' + run['failed']}  "
                      f"[lmcache_adp {run['imported']}; {run['uptime_before']}]", flush=True)  # fmt: skip
                text = write_summary(raw, runs, metrics, trees, done=n == args.rounds and side == order(n)[1])
        print(text)
        return 1 if any("failed" in run for run in runs) else 0
    finally:
        signal.signal(signal.SIGTERM, previous)
        shutil.rmtree(scratch, ignore_errors=True)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    here = Path(__file__).resolve().parent.parent
    p.add_argument("--repo", default=str(here), help="git repository the revisions are taken from (default: this one)")
    p.add_argument("--a", default="main", help="revision A (default main); WORKTREE: the repo's working tree")
    p.add_argument("--b", default=WORKTREE, help="revision B (default WORKTREE); the same as --a: an A/A run")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--metric", action="append", required=True, metavar="NAME=KIND:ARGS", help="see ab_metrics.py")
    p.add_argument("--raw", required=True, help="directory for every run's raw output and the summary")
    p.add_argument("--lock", help="file to flock around each single run (/work/bench.lock)")
    p.add_argument("--build-from", default=str(here / "build"), help="build/ whose objects the trees start from")
    p.add_argument(
        "--scratch",
        default="/dev/shm",
        help="where the two scratch trees go (about 50 MiB each, removed at the end; tmpfs: on this VM's ext4, "
        "mounted with discard, removing a tree took seconds)",
    )
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- the benchmark command ({tree}, {out})")
    args = p.parse_args(argv)
    args.command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not args.command:
        p.error("no benchmark command (give it after --)")
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    try:
        for m in args.metric:
            ab_metrics.parse_metric(m)
    except ValueError as e:
        p.error(str(e))
    args.build_from = Path(args.build_from) if args.build_from else None
    return args


if __name__ == "__main__":
    sys.exit(run_ab(parse_args(sys.argv[1:])))
