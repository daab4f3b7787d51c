# SPDX-License-Identifier: Apache-2.0
"""tests/conftest.py stops a session whose collection changed an ADP_* variable: every gateway and server the
tests start inherits the environment, and bench_l2.py's ADP_LOG_LEVEL=WARNING, set as a test imported it, hid
each gateway's ready line for the rest of the session (every gateway test failed after 60 s; CI ran out of
time)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import adp_environment, environment_changes

ROOT = Path(__file__).resolve().parents[2]


def test_environment_changes_names_each_variable_changed_set_or_unset(monkeypatch):
    monkeypatch.setenv("ADP_LOG_LEVEL", "WARNING")
    monkeypatch.setenv("ADP_NEW", "1")
    monkeypatch.setenv("OTHER", "ignored")
    monkeypatch.delenv("ADP_GONE", raising=False)
    now = adp_environment()
    assert environment_changes(now) == ""
    before = {**now, "ADP_LOG_LEVEL": "INFO", "ADP_GONE": "2"}
    del before["ADP_NEW"]
    assert (
        environment_changes(before) == "ADP_GONE: 2 -> (unset); ADP_LOG_LEVEL: INFO -> WARNING; ADP_NEW: (unset) -> 1"
    )


def test_a_session_whose_collection_sets_an_adp_variable_stops_before_its_first_test(tmp_path):
    """A plugin sets ADP_LOG_LEVEL as pytest collects (as an imported benchmark did): the session stops with a
    usage error naming the variable and its values, and runs no test."""
    (tmp_path / "set_level_plugin.py").write_text(
        "import os\n\ndef pytest_collection_modifyitems(items):\n    os.environ['ADP_LOG_LEVEL'] = 'WARNING'\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "ADP_LOG_LEVEL"}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), *filter(None, [env.get("PYTHONPATH")])])
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "set_level_plugin"]
    r = subprocess.run(
        [*cmd, "tests/util/test_crc32c.py"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    out = r.stdout + r.stderr
    assert r.returncode == 4, out  # pytest's usage error
    assert "collecting the tests changed the environment" in out and "ADP_LOG_LEVEL: (unset) -> WARNING" in out, out
    assert " passed" not in out, out
    r = subprocess.run(
        [*cmd[:-2], "tests/util/test_crc32c.py"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0 and " passed" in r.stdout, r.stdout + r.stderr
