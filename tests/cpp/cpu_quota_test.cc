// SPDX-License-Identifier: Apache-2.0
// util/cpu_quota: a process's CPU quota from its /proc/<pid>/cgroup and the
// cgroup files under the mount root, on trees made here: cgroup v2 (the
// smallest cpu.max of the cgroup and those above it), "max", cgroup v1 (a
// container whose mount root is its own cgroup: found by walking up), a
// hybrid, lines that are no cgroup, and a v2 path outside the namespace's
// root ("0::/../x": the kernel's way of saying so), whose files are not this
// process's quota (review r14a N5: they were read by joining the path as is).
#include "util/cpu_quota.h"

#include <filesystem>
#include <fstream>
#include <string>

#include "check.h"

namespace fs = std::filesystem;

namespace {

void put(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text;
}

// The quota for /proc/<pid>/cgroup text `cgroup` over the tree `root` (the cgroup mount root).
int quota(const fs::path& dir, const std::string& cgroup, const fs::path& root) {
  put(dir / "cgroup", cgroup);
  return adp::cgroup_quota_cpus((dir / "cgroup").string(), root.string());
}

// A v1 cgroup directory's quota files.
void cfs(const fs::path& cgroup, const char* quota_us, const char* period_us) {
  put(cgroup / "cpu.cfs_quota_us", quota_us);
  put(cgroup / "cpu.cfs_period_us", period_us);
}

}  // namespace

int main(int argc, char** argv) {
  std::string base;
  if (!adp::testing::one_argument(argc, argv, "DIR", &base)) return 2;
  int n = 0;
  auto fresh = [&] {  // a new tree: DIR/<n>/sys/fs/cgroup
    const fs::path d = fs::path(base) / std::to_string(++n);
    fs::create_directories(d / "sys/fs/cgroup");
    return d;
  };

  {  // v2: the smallest quota along the path, "max" above it
    const fs::path d = fresh(), r = d / "sys/fs/cgroup";
    put(r / "cpu.max", "max 100000\n");
    put(r / "a/cpu.max", "250000 100000\n");
    put(r / "a/b/cpu.max", "max 100000\n");
    const int q = quota(d, "0::/a/b\n", r);
    CHECK(q == 3, "v2 /a/b under a 2.5-CPU /a: %d, not 3", q);
    put(r / "a/b/cpu.max", "100000 100000\n");
    CHECK(quota(d, "0::/a/b\n", r) == 1, "v2 /a/b of 1 CPU under 2.5");
    CHECK(quota(d, "0::/\n", r) == 0, "v2 at the root (max): no quota");
  }
  {  // v2 outside the namespace's root: its files are not looked for beside the mount
    const fs::path d = fresh(), r = d / "sys/fs/cgroup";
    put(d / "sys/other/cpu.max", "100000 100000\n");  // where "/sys/fs/cgroup/../../other" would lead
    put(d / "cpu.max", "100000 100000\n");            // and "/sys/fs/cgroup/../../.."
    const int q = quota(d, "0::/../../other\n", r);
    CHECK(q == 0, "v2 path outside the namespace's root read a quota (%d) outside the mount", q);
  }
  {  // v1, a container: /proc says its host path, the mount root is its own cgroup
    const fs::path d = fresh(), r = d / "sys/fs/cgroup";
    cfs(r / "cpu,cpuacct", "200000\n", "100000\n");
    const int q = quota(d, "12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n1:name=systemd:/docker/abc\n", r);
    CHECK(q == 2, "v1 container: %d, not 2", q);
    put(r / "cpu,cpuacct/cpu.cfs_quota_us", "-1\n");
    CHECK(quota(d, "4:cpu,cpuacct:/docker/abc\n", r) == 0, "v1 quota -1: none");
  }
  {  // hybrid: v2 has no cpu controller (no cpu.max), v1's cpu is read, under its own mount name
    const fs::path d = fresh(), r = d / "sys/fs/cgroup";
    cfs(r / "cpu/x", "50000\n", "100000\n");
    const int q = quota(d, "0::/x\n2:cpu:/x\n3:cpuacct:/x\n", r);
    CHECK(q == 1, "hybrid, half a CPU: %d, not 1", q);
  }
  {  // lines that are no cgroup, and no file at all
    const fs::path d = fresh(), r = d / "sys/fs/cgroup";
    CHECK(quota(d, "garbage\n\n::\n", r) == 0, "garbage");
    CHECK(adp::cgroup_quota_cpus((d / "missing").string(), r.string()) == 0, "no /proc file");
  }
  return adp::testing::finish("cpu_quota_test");
}
