// SPDX-License-Identifier: Apache-2.0
#include "util/cpu_quota.h"

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <vector>

namespace adp {
namespace {

// ceil(quota / period), at least 1 and at most INT_MAX; 0 for quota <= 0
// (none) or period <= 0.
int quota_cpus(long long quota, long long period) {
  if (quota <= 0 || period <= 0) return 0;
  return static_cast<int>(std::min<long long>(INT_MAX, quota / period + (quota % period != 0)));
}

// A whole decimal number (a sign allowed) read from `s`, or false.
bool whole(const std::string& s, long long* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  *out = std::strtoll(s.c_str(), &end, 10);
  return end && *end == '\0';
}

long long file_number(const std::string& path) {
  std::ifstream f(path);
  std::string s;
  long long v = 0;
  return f >> s && whole(s, &v) ? v : 0;
}

int cfs_cpus(const std::string& dir) {
  return quota_cpus(file_number(dir + "/cpu.cfs_quota_us"), file_number(dir + "/cpu.cfs_period_us"));
}

// The smaller quota of two, 0 meaning none.
int tighter(int a, int b) { return a == 0 ? b : b == 0 ? a : std::min(a, b); }

// Whether the cgroup path has a ".." component: the kernel's way of naming a
// cgroup outside this cgroup namespace's root, whose files are not under the
// mount (joined as is, the path would lead out of it).
bool outside_root(const std::string& path) {
  std::stringstream parts(path);
  for (std::string part; std::getline(parts, part, '/');)
    if (part == "..") return true;
  return false;
}

// The smallest quota of `cpus(mount + dir)` over the cgroup `path` and each
// cgroup above it, the mount's root included; 0 for a path outside the
// namespace's root.
template <typename Fn>
int along(const std::string& mount, std::string path, Fn cpus) {
  if (outside_root(path)) return 0;
  if (!path.empty() && path.front() != '/') path.insert(path.begin(), '/');
  int found = 0;
  while (!path.empty() && path.back() == '/') path.pop_back();
  for (;;) {
    found = tighter(found, cpus(mount + path));
    if (path.empty()) return found;
    path.resize(path.rfind('/') == std::string::npos ? 0 : path.rfind('/'));
  }
}

}  // namespace

int cpu_max_cpus(const std::string& path) {
  std::ifstream f(path);
  std::string quota, period;
  long long q = 0, p = 0;
  if (!(f >> quota >> period) || !whole(quota, &q) || !whole(period, &p)) return 0;  // "max PERIOD": none
  return quota_cpus(q, p);
}

int cgroup_quota_cpus(const std::string& proc_cgroup, const std::string& root) {
  std::ifstream f(proc_cgroup);
  std::string line, v2_path, v1_mount, v1_path;
  bool v2 = false, v1 = false;
  while (std::getline(f, line)) {  // "ID:CONTROLLERS:PATH"
    const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string id = line.substr(0, a), controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    if (id == "0" && controllers.empty()) {
      v2 = true;
      v2_path = path;
      continue;
    }
    std::stringstream names(controllers);
    for (std::string name; std::getline(names, name, ',');)
      if (name == "cpu") {
        v1 = true;
        v1_mount = root + "/" + controllers;
        v1_path = path;
      }
  }
  int cpus = 0;
  if (v2) cpus = along(root, v2_path, [](const std::string& dir) { return cpu_max_cpus(dir + "/cpu.max"); });
  if (cpus == 0 && v1) {
    cpus = along(v1_mount, v1_path, cfs_cpus);
    if (cpus == 0 && v1_mount != root + "/cpu") cpus = along(root + "/cpu", v1_path, cfs_cpus);
  }
  return cpus;
}

}  // namespace adp
