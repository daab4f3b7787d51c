# SPDX-License-Identifier: Apache-2.0
"""setup.py's SOURCE_FLAGS (-falign-loops=64 for crc32c.cc) go only to a compiler that accepts them: clang before 13
does not know -falign-loops (ignored with a warning, -Wignored-optimization-argument, or refused), and with
ADP_WERROR=1 the build failed. scripts/object_stamps.py's accepted_flags, which setup.py's build calls, probes each
flag once (an empty file compiled with it, -Werror and the build's other arguments: -std=c++20, the extra compile
args) and leaves out, with a line naming it, one that fails, and one whose probe timed out or could not run, the line
saying so. Driven here with fake compilers (shell scripts) that log their calls."""

from __future__ import annotations

import importlib.util
import os
import signal
import time
from pathlib import Path

import pytest

from tests.packaging.test_setup_build import build, tree  # noqa: F401 (tree: the fixture)

ROOT = Path(__file__).resolve().parents[2]
FLAG = "-falign-loops=64"


def object_stamps():
    """scripts/object_stamps.py, loaded by its path as setup.py loads it."""
    spec = importlib.util.spec_from_file_location("adp_object_stamps_flags", ROOT / "scripts" / "object_stamps.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fake_compiler(tmp_path: Path, body: str) -> Path:
    """A compiler that appends its arguments to calls.log, then runs `body` (sh) with $FLAGS set to them."""
    path = tmp_path / "fake-clang++"
    path.write_text(f'#!/bin/sh\necho "$*" >> {tmp_path}/calls.log\nFLAGS="$*"\n{body}\n')
    path.chmod(0o755)
    return path


# clang 12 as it answers -falign-loops=64: a warning, an error under -Werror.
CLANG_12 = f"""case " $FLAGS " in
  *" {FLAG} "*) echo "clang: warning: optimization flag '{FLAG}' is not supported [-Wignored-optimization-argument]" >&2
    case " $FLAGS " in *" -Werror "*) exit 1 ;; esac ;;
esac
exit 0"""


def calls(tmp_path: Path) -> list[str]:
    log = tmp_path / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


def test_a_flag_the_compiler_warns_about_is_left_out_and_logged(tmp_path):
    module = object_stamps()
    compiler = fake_compiler(tmp_path, CLANG_12)
    lines = []
    assert module.accepted_flags([str(compiler), "-fPIC"], [FLAG], log=lines.append) == []
    assert len(lines) == 1 and FLAG in lines[0] and str(compiler) in lines[0], lines
    # One probe: the compiler's own flags, -Werror and the flag, an empty .cc compiled (-c).
    (probe,) = calls(tmp_path)
    words = probe.split()
    assert words[0] == "-fPIC" and "-Werror" in words and FLAG in words and "-c" in words, probe
    assert any(w.endswith(".cc") for w in words), probe
    # Asked again in the same build (another object, another extension): not probed again, logged again.
    assert module.accepted_flags([str(compiler), "-fPIC"], [FLAG], log=lines.append) == []
    assert len(calls(tmp_path)) == 1


def test_a_flag_the_compiler_accepts_is_kept_silently(tmp_path):
    module = object_stamps()
    compiler = fake_compiler(tmp_path, "exit 0")
    lines = []
    assert module.accepted_flags([str(compiler)], [FLAG, "-O2"], log=lines.append) == [FLAG, "-O2"]
    assert lines == []
    assert len(calls(tmp_path)) == 2


def test_no_flags_probe_nothing(tmp_path):
    module = object_stamps()
    compiler = fake_compiler(tmp_path, "exit 1")
    assert module.accepted_flags([str(compiler)], [], log=print) == []
    assert calls(tmp_path) == []


def test_a_compiler_that_cannot_run_accepts_no_flag(tmp_path):
    module = object_stamps()
    lines = []
    assert module.accepted_flags([str(tmp_path / "no-such-compiler")], [FLAG], log=lines.append) == []
    assert len(lines) == 1 and FLAG in lines[0] and "could not run" in lines[0] and "built without it" in lines[0], (
        lines
    )


# A compiler that rejects the flag only beside -std=c++20 (as a flag valid for one language standard only would), or
# only without it: the probe must see the build's own arguments to judge it as the build meets it.
REJECTS_WITH_STD = f"""case " $FLAGS " in *" {FLAG} "*) case " $FLAGS " in *" -std=c++20 "*)
  echo "error: {FLAG} is not allowed with -std=c++20" >&2; exit 1 ;; esac ;; esac
exit 0"""
REJECTS_WITHOUT_STD = f"""case " $FLAGS " in *" {FLAG} "*) case " $FLAGS " in *" -std=c++20 "*) ;;
  *) echo "error: {FLAG} needs -std=c++20" >&2; exit 1 ;; esac ;; esac
exit 0"""


def test_a_flag_is_probed_with_the_builds_arguments(tmp_path):
    """Review37a of 6afff83: the probe compiled the flag alone, so a flag the compiler rejects only beside the build's
    other arguments (-std=c++20, the extra compile args every source gets) was kept, and the build then failed on
    it; one it accepts only beside them was left out."""
    module = object_stamps()
    build_args = ["-DNDEBUG", "-Isrc_cpp", "-O2", "-Wall", "-std=c++20", "-fvisibility=hidden"]
    lines = []
    compiler = fake_compiler(tmp_path, REJECTS_WITH_STD)
    assert module.accepted_flags([str(compiler), "-fPIC"], [FLAG], log=lines.append, args=build_args) == []
    assert len(lines) == 1 and f"does not accept {FLAG}" in lines[0], lines
    (probe,) = calls(tmp_path)
    words = probe.split()
    assert words[0] == "-fPIC" and words[1 : 1 + len(build_args)] == build_args, probe
    assert words.index(FLAG) > words.index("-std=c++20"), probe  # after them, as in the build's command
    # The reverse: accepted only beside -std=c++20, so kept, nothing logged.
    other = tmp_path / "other"
    other.mkdir()
    compiler = fake_compiler(other, REJECTS_WITHOUT_STD)
    lines = []
    assert module.accepted_flags([str(compiler)], [FLAG], log=lines.append, args=build_args) == [FLAG]
    assert lines == []


def test_a_probe_that_times_out_is_stopped_and_says_so(tmp_path):
    """A probe past its timeout: the flag left out with a line saying the probe timed out (until now the same as
    a rejection, and silent: a slow host lost the flag without a word), and the compiler's whole process group
    killed: a driver's child (cc1plus; here a child sh that writes its pid) that holds the probe's output was left
    running, and the probe waited for it to finish, past the timeout."""
    module = object_stamps()
    pidfile = tmp_path / "child.pid"
    compiler = fake_compiler(tmp_path, f"sh -c 'echo $$ > {pidfile}; exec sleep 60'\nexit 0")
    lines = []
    try:
        assert module.accepted_flags([str(compiler)], [FLAG], log=lines.append, timeout=1) == []
        assert len(lines) == 1, lines
        assert FLAG in lines[0] and "timed out after 1 s" in lines[0] and "built without it" in lines[0], lines
        assert "does not accept" not in lines[0], lines
        pid = int(pidfile.read_text())
        # Killed: gone (or a zombie until its new parent reaps it) at once; missed, asleep for a minute.
        for _ in range(100):
            if not alive(pid):
                break
            time.sleep(0.1)
        assert not alive(pid), "the probe's compiler's child outlived the probe"
    finally:
        if pidfile.exists() and alive(pid := int(pidfile.read_text())):
            os.kill(pid, signal.SIGKILL)


def alive(pid: int) -> bool:
    """Whether `pid` runs (not gone, not a zombie)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.parametrize("answer", ["rejects", "accepts", "rejects beside -std=c++20"])
def test_setup_builds_crc32c_without_a_flag_its_compiler_rejects(tree, answer):
    """setup.py build_ext --inplace with ADP_WERROR=1 in test_setup_build.py's tiny tree, with a crc32c.cc, the
    compiler (its wrapper, g++ behind it) answering -falign-loops=64 as clang 12 does, accepting it, or rejecting it
    only beside -std=c++20 (which the build gives every source: Pybind11Extension's cxx_std=20): the build succeeds,
    crc32c.cc compiled without the flag and the skip logged, or with it and nothing logged; no other source gets it.
    The third was probed alone until review37a's fix, judged accepted, and the build failed on it."""
    (tree / "src_cpp/util/crc32c.cc").write_text("int crc_value() { return 4; }\n")
    wrapper = tree.parent / "cc"
    accepts = answer == "accepts"
    if not accepts:
        # Before the wrapper's own script: the compiler's answer to the flag (exit 1 where it refuses it).
        refusal = (CLANG_12 if answer == "rejects" else REJECTS_WITH_STD).rsplit("exit 0", 1)[0]
        text = wrapper.read_text()
        wrapper.write_text(text.replace("#!/bin/sh\n", '#!/bin/sh\nFLAGS="$*"\n' + refusal, 1))
    args = tree.parent / "args.log"
    wrapper.write_text(wrapper.read_text().replace("#!/bin/sh\n", f'#!/bin/sh\necho "$*" >> {args}\n', 1))
    b = build(tree)
    assert b.returncode == 0, b.output[-3000:]
    compiles = [line for line in args.read_text().splitlines() if " -c " in f" {line} " and "probe.cc" not in line]
    crc = [line for line in compiles if "src_cpp/util/crc32c.cc" in line]
    assert len(crc) == 1, compiles
    assert (FLAG in crc[0].split()) == accepts, crc[0]
    assert not any(FLAG in line.split() for line in compiles if line not in crc), compiles
    skipped = [line for line in b.output.splitlines() if f"does not accept {FLAG}" in line]
    assert len(skipped) == (0 if accepts else 1), b.output[-3000:]
