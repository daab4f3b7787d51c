# SPDX-License-Identifier: Apache-2.0
"""The card store's index alone (src_cpp/store/key_index.h) at 1 M and 4 M objects.

bench_index.py measures the whole store through Python, but 4 M objects need
a 32 GiB card image (8 KiB each). This measures the index table itself in
C++: N random key hashes inserted, then memory per object (the table's own
bytes, and the process's RSS growth), and the time of a lookup of a present
and of an absent key (1 M random lookups each, averaged), beside
std::unordered_map (format 1's index) in the same run. The store adds 8 bytes
per object (the region's key list) and fixed costs.

    python benchmarks/bench_key_index.py --counts 1000000,4000000

Writes a markdown table to stdout (and --output).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
from pathlib import Path

from tools import emit_table

ROOT = Path(__file__).resolve().parents[1]

PROGRAM = r"""
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <unordered_map>
#include <vector>
#include "store/key_index.h"

static long rss() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  long pages = 0, res = 0;
  if (std::fscanf(f, "%ld %ld", &pages, &res) != 2) res = 0;
  std::fclose(f);
  return res * 4096;
}

template <typename Map, typename Find>
void run(const char* name, size_t n, Map& m, Find find) {
  std::mt19937_64 g(42);
  std::vector<uint64_t> keys(n);
  for (auto& k : keys) k = g();
  long base = rss();
  auto t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < n; i++) m.try_emplace(keys[i], adp::IndexEntry(uint32_t(i % 1000), 1, 4096, i));
  double ins = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  long grown = rss() - base;
  const size_t q = 1000000;
  std::vector<uint64_t> hit(q), miss(q);
  for (size_t i = 0; i < q; i++) hit[i] = keys[g() % n], miss[i] = g();
  uint64_t found_hit = 0, found_miss = 0;
  t0 = std::chrono::steady_clock::now();
  for (uint64_t k : hit) found_hit += find(m, k);
  double h = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / q * 1e9;
  t0 = std::chrono::steady_clock::now();
  for (uint64_t k : miss) found_miss += find(m, k);
  double ms = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / q * 1e9;
  std::printf("| %s | %zu | %.1f | %.1f | %.0f | %.0f | %llu / %llu |\n", name, n, double(grown) / n, ins, h, ms,
              (unsigned long long)found_hit, (unsigned long long)found_miss);
}

int main(int argc, char** argv) {
  size_t n = std::strtoull(argv[2], nullptr, 10);
  if (std::string(argv[1]) == "key_index") {
    adp::KeyIndex m;
    run("KeyIndex (format 2)", n, m, [](adp::KeyIndex& x, uint64_t k) { return x.find(k) ? 1 : 0; });
  } else {
    std::unordered_map<uint64_t, adp::IndexEntry> m;
    run("std::unordered_map (format 1's index)", n, m,
        [](std::unordered_map<uint64_t, adp::IndexEntry>& x, uint64_t k) { return x.count(k) ? 1 : 0; });
  }
}
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--counts", default="1000000,4000000")
    ap.add_argument("--output")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "bench.cc"
        src.write_text(PROGRAM.replace("#include <vector>", "#include <string>\n#include <vector>"))
        exe = Path(d) / "bench"
        subprocess.run(["g++", "-std=c++20", "-O2", f"-I{ROOT / 'src_cpp'}", str(src), "-o", str(exe)], check=True)
        lines = [
            "| index | objects | RSS B/object | insert s | lookup hit ns | lookup miss ns | found (of 1 M present / 1 M absent) |",
            "|---|---|---|---|---|---|---|",
        ]
        for n in args.counts.split(","):
            for impl in ("key_index", "unordered_map"):
                out = subprocess.run([str(exe), impl, n], capture_output=True, text=True, check=True)
                lines.append(out.stdout.strip())
                print(lines[-1], flush=True)
    emit_table(lines, args.output)


if __name__ == "__main__":
    os.environ.setdefault("LC_ALL", "C")
    main()
