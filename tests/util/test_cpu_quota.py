# SPDX-License-Identifier: Apache-2.0
"""util/cpu_quota (the CPUs a container's quota allows: PiecePool::usable_cpus, the spin load rule): cgroup v2 and
v1 trees made by the test, a hybrid, odd lines, and a v2 path outside the namespace's root (review r14a N5).

Builds tests/cpp/cpu_quota_test.cc with src_cpp/util/cpu_quota.cc and runs it."""

from __future__ import annotations

from tests.support import cpp


def test_cpu_quota(tmp_path):
    cpp.run(cpp.build("cpu_quota_test", tmp_path, (), ("util/cpu_quota.cc",)), str(tmp_path / "trees"), timeout=60)
