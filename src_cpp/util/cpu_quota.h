// SPDX-License-Identifier: Apache-2.0
// The CPUs a container's CPU quota allows this process (review r13 S2): on a
// big idle host, sched_getaffinity sees all the host's CPUs while a cgroup's
// quota lets the process use only a few; rules that count CPUs
// (PiecePool::usable_cpus: the piece helpers, the spin load rule of
// util/idle_cpus.h) count min(affinity, quota).
#pragma once

#include <string>

namespace adp {

// ceil(QUOTA / PERIOD) of a cgroup v2 cpu.max file ("QUOTA PERIOD"), at
// least 1; 0 where it sets no quota ("max PERIOD") or cannot be read.
int cpu_max_cpus(const std::string& path);

// The CPUs this process's cgroup quota allows, 0: no quota found. cgroup v2:
// the cpu.max of the process's own cgroup (/proc/self/cgroup's "0::/path",
// under /sys/fs/cgroup) and of each cgroup above it up to
// /sys/fs/cgroup/cpu.max, the smallest; else cgroup v1: cpu.cfs_quota_us /
// cpu.cfs_period_us likewise, under the cpu controller's mount. Read from
// the files each call (PiecePool::usable_cpus reads it once). A cgroup
// outside this cgroup namespace's root (a ".." in its path) has no quota
// found: its files are not under the mount. Tests name another
// /proc/self/cgroup and mount root (tests/cpp/cpu_quota_test.cc).
int cgroup_quota_cpus(const std::string& proc_cgroup = "/proc/self/cgroup", const std::string& root = "/sys/fs/cgroup");

}  // namespace adp
