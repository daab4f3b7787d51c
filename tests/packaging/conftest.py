# SPDX-License-Identifier: Apache-2.0
"""The image test's container logs in its failure report, whole: a failed test
gets one report section per container it ran (podman logs, taken when the
container was stopped or, for those still running, when the test failed), so the
cause is in the test command's output and not cut to a tail."""

from __future__ import annotations

import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    pm = getattr(item, "funcargs", {}).get("podman")
    if rep.failed and pm is not None and hasattr(pm, "all_logs"):
        for name, text in pm.all_logs().items():
            rep.sections.append((f"podman logs {name}", text or "(empty)\n"))
