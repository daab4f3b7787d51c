# SPDX-License-Identifier: Apache-2.0
"""The `lmcache-adp gateway` daemon: start, stop, stale socket, exclusive card, bad arguments."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys

import pytest

from lmcache_adp import ADPConnector, CardStore
from lmcache_adp.testing import child_env
from tests.helpers import RawConnector, eventually, payload
from tests.support.gateway import Gateway


def test_sigterm_exits_zero_and_removes_socket(gateway):
    assert os.path.exists(gateway.socket)
    log = gateway.log()
    assert "gateway: card" in log and "open" in log
    assert gateway.stop() == 0
    assert not os.path.exists(gateway.socket)
    log = gateway.logs[-1]
    assert "SIGTERM received" in log and "closed" in log and "gateway stopped" in log


def test_card_lines_give_a_small_card_in_mib(workdir):
    """Audit 13: a 0.25 GiB card was logged "open (0 objects, 0.0 of 0.2 GiB used)" beside the store's own
    "opened card ...: (0.00 of 0.25 GiB used, ...)". Audit 14 item 12: below 1 GiB those lines read "0.00 of 0.01
    GiB"; now the created, opened and open lines give MiB there (util/amount.h, the helper the several-cards
    WARNING already used)."""
    gw = Gateway(workdir, card_size_gb=0.25).start()
    try:
        lines = gw.log().splitlines()
        created = next(line for line in lines if f"created card image {gw.card} (" in line)
        assert "(256.00 MiB, sparse)" in created, created
        opened = next(line for line in lines if f"opened card {gw.card}: recovered" in line)
        assert re.search(r"\(0\.00 MiB of 2[45]\d\.\d\d MiB used, ", opened), opened
        line = next(line for line in lines if f"gateway: card {gw.card} open (" in line)
        assert re.search(r"open \(0 objects, 0\.00 MiB of 2[45]\d\.\d\d MiB used\); listening on unix://", line), line
    finally:
        assert gw.stop() == 0


def test_a_quieter_level_in_the_tests_environment_still_shows_the_ready_line(workdir, monkeypatch):
    """ADP_LOG_LEVEL=WARNING in the environment pytest runs in (bench_l2.py set it as a test imported it): the
    gateways the tests start log at INFO all the same (child_env), so each one's ready line comes; it hid, and
    every gateway test waited its 60 s and failed. A level that shows more (DEBUG) is the caller's to keep."""
    monkeypatch.setenv("ADP_LOG_LEVEL", "WARNING")
    gw = Gateway(workdir).start(timeout=30)
    try:
        assert "gateway ready" in gw.log() and "DEBUG" not in gw.log()
    finally:
        assert gw.stop() == 0
    monkeypatch.setenv("ADP_LOG_LEVEL", "debug")
    assert child_env()["ADP_LOG_LEVEL"] == "debug"
    monkeypatch.setenv("ADP_LOG_LEVEL", "ERROR")
    assert child_env()["ADP_LOG_LEVEL"] == "INFO"


def test_sigint_exits_zero(workdir):
    gw = Gateway(workdir).start()
    gw.proc.send_signal(2)
    assert gw._finish() == 0


def test_acknowledged_data_survives_restart(gateway):
    c = RawConnector(ADPConnector(gateway=gateway.unix_url))
    keys = [f"m@00000000@0@{i:x}" for i in range(6)]
    datas = [payload(k, 300_000 + i) for i, k in enumerate(keys)]
    assert c.set(keys, [memoryview(d) for d in datas])[0]
    assert gateway.stop() == 0
    gateway.start()
    outs = [bytearray(len(d)) for d in datas]
    ok, _, per_key = c.get(keys, [memoryview(o) for o in outs])
    assert ok and all(per_key)
    assert [bytes(o) for o in outs] == datas
    c.conn.close()


def test_second_gateway_on_same_card_fails_clearly(gateway, workdir):
    second = Gateway(workdir)  # same card
    other = second.socket = os.path.join(workdir, "other.sock")
    r = subprocess.run(second.args(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert "gateway not started" in r.stderr and "card" in r.stderr
    assert not os.path.exists(other)
    assert os.path.exists(gateway.socket)  # the first gateway's socket is untouched


def test_stale_socket_is_removed(workdir):
    gw = Gateway(workdir)
    s = socket.socket(socket.AF_UNIX)
    s.bind(gw.socket)  # bound, never listening, then abandoned: what a crash leaves
    s.close()
    assert os.path.exists(gw.socket)
    gw.start()
    assert "removed stale socket" in gw.log()
    assert gw.stop() == 0


def test_live_socket_is_not_taken_over(gateway, workdir):
    second = Gateway(workdir)
    second.card = os.path.join(workdir, "second.img")
    r = subprocess.run(second.args(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "already listening" in r.stderr
    assert os.path.exists(gateway.socket)
    # The image this failed start created is removed (audit 12, finding 9); the running gateway's stays.
    assert not os.path.exists(second.card) and f"removed the card image {second.card}" in r.stderr, r.stderr
    assert os.path.exists(gateway.card)


def test_a_stopping_gateway_leaves_a_socket_another_made_in_its_place(workdir):
    """Session 23 (gwreview23): a gateway removed its socket path at its stop whatever the path named by then.
    Its socket removed meanwhile (by hand, a tmpfiles cleaner) and a second gateway started on the path, the first
    one's stop removed the second's socket: every new client of the second failed to connect while it ran on.
    Now a gateway removes the path only while it names the socket that gateway made (warned otherwise)."""
    first = Gateway(workdir).start()
    second = Gateway(workdir, card=os.path.join(workdir, "second.img"))
    try:
        os.unlink(first.socket)
        second.start()
        assert first.stop() == 0
        assert os.path.exists(second.socket), "the first gateway's stop removed the second's socket"
        assert "no longer the socket this gateway made" in first.all_logs()
        c = RawConnector(ADPConnector(gateway=second.unix_url))
        assert c.set(["served"], [memoryview(b"by the second")])[0]
        c.conn.close()
        assert second.stop() == 0
        assert not os.path.exists(second.socket)  # its own: removed
    finally:
        for gw in (first, second):
            if gw.proc and gw.proc.poll() is None:
                gw.kill()


def test_a_failed_start_leaves_an_existing_card_alone(workdir):
    """Only an image the failed start itself created is removed: a card that was there stays, byte for byte."""
    gw = Gateway(workdir)
    CardStore(gw.card, 64 << 20).close()
    before = open(gw.card, "rb").read(4096)
    with open(gw.socket, "w") as f:
        f.write("not a socket")
    r = subprocess.run(gw.args(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "is not a socket" in r.stderr
    assert os.path.exists(gw.card) and open(gw.card, "rb").read(4096) == before and "removed" not in r.stderr


def test_regular_file_at_socket_path_is_left_alone(workdir):
    gw = Gateway(workdir)
    with open(gw.socket, "w") as f:
        f.write("not a socket")
    r = subprocess.run(gw.args(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "is not a socket" in r.stderr
    assert open(gw.socket).read() == "not a socket"


def test_listen_without_token_file_is_refused(workdir):
    gw = Gateway(workdir)
    r = subprocess.run(gw.args("--listen", "tcp://127.0.0.1:0"), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--token-file" in r.stderr


@pytest.mark.parametrize(
    "listen, why",
    [
        ("tcp://127.0.0.1:9500/", "expected tcp://HOST:PORT, with no '/' or space in it"),
        ("tcp://127.0.0.1", "expected tcp://HOST:PORT, as tcp://10.0.0.5:9500 (no port given)"),
        ("127.0.0.1:9500", "expected tcp://HOST:PORT"),
        ("tcp://127.0.0.1:65536", "the port must be a number in [0, 65535], got '65536'"),
    ],
)
def test_bad_listen_address_is_refused_before_the_card(workdir, listen, why):
    """A trailing '/' read "port must be 0-65535", after the card had been opened (audit 15): now the flag and the
    reason, exit 2, and no card is made."""
    gw = Gateway(workdir)
    r = subprocess.run(
        gw.args("--listen", listen, "--token-file", gw.token_file), capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2 and f"--listen {listen}: {why}" in r.stderr, r.stderr
    assert not os.path.exists(gw.card)


def test_metrics_port_in_use_names_the_flags(workdir):
    """A --metrics-port another process holds: "metrics on 127.0.0.1:P: Address already in use" named no flag
    (audit 15); now the flags, and who may hold the port. The card this start created is removed."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        gw = Gateway(workdir)
        r = subprocess.run(gw.args("--metrics-port", str(port)), capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stderr
    assert (
        f"gateway not started: --metrics-port {port} on --metrics-host 127.0.0.1: cannot serve metrics there: "
        "Address already in use (another process holds the port" in r.stderr
    ), r.stderr
    assert not os.path.exists(gw.card)


@pytest.mark.parametrize("flag", ["--metrics-port", "--listen"])
def test_a_port_taken_is_found_before_the_card_is_opened(workdir, flag):
    """review33c C3: a --metrics-port or --listen port another process holds was found only after the card was
    created or opened and recovered (4-6 INFO lines first; on a large card the whole recovery walk): the ports are
    taken (the metrics port bound, the TCP port tried) before the card, so the refusal is the start's only line.
    The card is there before the start, so that "not created" alone cannot pass for "not opened"."""
    gw = Gateway(workdir)
    gw.start()
    assert gw.stop() == 0 and os.path.exists(gw.card)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        extra = ("--metrics-port", str(port)) if flag == "--metrics-port" else ("--listen", f"tcp://127.0.0.1:{port}")
        if flag == "--listen":
            extra += ("--token-file", gw.token_file)
        r = subprocess.run(gw.args(*extra), capture_output=True, text=True, timeout=60)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1, r.stderr
    assert "ERROR: gateway not started: " in lines[0] and "Address already in use (another process holds" in lines[0]
    assert str(port) in lines[0] and flag in lines[0], lines


def test_a_socket_directory_it_creates_is_named(workdir):
    """review33c: `--socket` in a directory that did not exist made it (and its parents) without a word: a typo in
    the path (as root, /nonexistent/dir) gave a gateway on a socket nobody looks for. A packaged unit relies on the
    directory being made (/run/lmcache-adp), so it still is, with one INFO line naming it; an existing one, none."""
    made = os.path.join(workdir, "new", "dir")
    gw = Gateway(workdir, socket=os.path.join(made, "gw.sock")).start()
    try:
        said = [line for line in gw.log().splitlines() if "socket directory" in line]
        assert len(said) == 1 and f"INFO: created the socket directory {made} (it did not exist)" in said[0], said
    finally:
        assert gw.stop() == 0
    gw.start()
    try:
        assert "socket directory" not in gw.log(), gw.log()
    finally:
        assert gw.stop() == 0


def test_binary_token_file_is_one_line_not_a_traceback(workdir):
    """review33c: `--token-file` of a file that is not UTF-8 text (a token made with `head -c 32 /dev/urandom`)
    ended the gateway with a 15-line UnicodeDecodeError traceback; it is one line naming the flag and the file,
    exit 2 like an unreadable or empty token file, and no card is made."""
    gw = Gateway(workdir)
    binary = os.path.join(workdir, "binary-token")
    with open(binary, "wb") as f:
        f.write(b"\xd9\x8f\xbb" + bytes(range(29)))
    r = subprocess.run(
        gw.args("--listen", "tcp://127.0.0.1:0", "--token-file", binary), capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert f"--token-file: token file {binary!r}" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not os.path.exists(gw.card)


def test_token_file_without_listen_is_named(workdir):
    """--token-file without --listen was ignored without a word (audit 15): a gateway no TCP client reaches."""
    token = os.path.join(workdir, "token")  # the file Gateway writes
    with Gateway(workdir, extra=("--token-file", token)) as gw:
        assert f"WARNING: --token-file {token} is ignored without --listen" in gw.log()


def test_missing_card_without_size_fails_clearly(workdir):
    """README's line (`gateway --card /dev/nvme1n1 ...`) given an image path that is not there yet: the error
    ended at "card X does not exist" (audit 14); it now says how to make one."""
    gw = Gateway(workdir, card_size_gb=0)
    r = subprocess.run(gw.args(), capture_output=True, text=True, timeout=60)
    assert (
        r.returncode == 1 and f"gateway not started: card {gw.card} does not exist; give --card-size-gb N" in r.stderr
    )
    assert "lmcache-adp format --card PATH --size-gb N" in r.stderr and not os.path.exists(gw.card)
    # A card that is there but not openable keeps its own message, with no hint about sizes.
    os.mkdir(gw.card)
    r = subprocess.run(gw.args(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "neither a regular file nor a block device" in r.stderr, r.stderr
    assert "--card-size-gb N" not in r.stderr


def test_bad_card_size_is_refused_before_the_image_is_made(workdir):
    """--card-size-gb below the card's floor was made into an image the store then refused (left behind, so the
    next start with a right size found a card too small); a negative one was a TypeError traceback (audit 12)."""
    gw = Gateway(workdir, card_size_gb=0)
    for bad in ("-1", "0.001", "nan", "2e6"):
        r = subprocess.run(gw.args("--card-size-gb", bad), capture_output=True, text=True, timeout=60)
        assert r.returncode == 2, r.stderr
        assert "--card-size-gb must be 0 (the card must exist) or a number of GiB in [0.015625, 1048576]" in r.stderr
        assert "Traceback" not in r.stderr and not os.path.exists(gw.card)


def test_a_card_image_larger_than_its_filesystem_is_warned_about(workdir):
    """The gateway's side of the embedded test (tests/connector): creating such an image is refused with the
    figures and nothing is left; an existing one (made sparse here) gets a WARNING at start, the gateway serves."""
    import shutil
    import tempfile

    shm = tempfile.mkdtemp(prefix="adp-space-", dir="/dev/shm")
    try:
        too_big = shutil.disk_usage(shm).total / (1 << 30) + 1
        card = os.path.join(shm, "big.img")
        gw = Gateway(workdir, card=card, card_size_gb=too_big)
        r = subprocess.run(gw.args(), capture_output=True, text=True, timeout=60)
        assert r.returncode == 1 and f"gateway not started: cannot create card image {card} of " in r.stderr
        assert "free; give a size that fits or make room" in r.stderr and not os.path.exists(card), r.stderr
        with open(card, "wb") as f:
            f.truncate(int(too_big * (1 << 30)))
        gw = Gateway(workdir, card=card, card_size_gb=0).start()
        try:
            log = gw.log()
            assert "WARNING: card image " in log and "but its filesystem has" in log, log
        finally:
            assert gw.stop() == 0
    finally:
        shutil.rmtree(shm, ignore_errors=True)


def test_too_long_socket_path_is_refused_before_the_card_is_made(workdir):
    """It was refused by the bind, after the card image was created and opened (audit 12)."""
    gw = Gateway(workdir, card_size_gb=0.0625)
    long = os.path.join(workdir, "s" * (108 - len(workdir) - 1))  # 108 bytes
    r = subprocess.run(gw.args("--socket", long), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and f"--socket {long} is 108 bytes: a Unix socket path is at most 107" in r.stderr
    assert not os.path.exists(gw.card), r.stderr


def test_a_size_an_existing_card_ignores_is_warned_about(workdir):
    gw = Gateway(workdir, card_size_gb=0.0625).start()
    assert gw.stop() == 0 and "ignored" not in gw.log()
    gw.card_size_gb = 0.125
    gw.start()
    try:
        assert f"WARNING: --card-size-gb 0.125 ignored: card image {gw.card} exists with 64.00 MiB" in gw.log()
    finally:
        assert gw.stop() == 0
    gw.card_size_gb = 0  # must exist: nothing asked, nothing to say
    gw.start()
    assert gw.stop() == 0 and "ignored" not in gw.log()


def test_cli_help_lists_gateway():
    r = subprocess.run([sys.executable, "-m", "lmcache_adp.cli", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "gateway" in r.stdout


def test_a_probe_that_connects_and_closes_is_logged_at_debug_only(workdir, tmp_path):
    """Audit 12 finding 11: the image's healthcheck (docker/entrypoint.sh healthcheck, every 30 s) connects to the
    socket and closes. A connection closed before its handshake is logged at DEBUG only (it was `client #N gone
    after 0 batches` at INFO: 2880 lines a day); a client that completed its handshake still logs its end at
    INFO, and a malformed Hello still its WARNING."""
    gw = Gateway(workdir).start(env={"ADP_LOG_LEVEL": "DEBUG"})
    try:
        role = tmp_path / "role"
        role.write_text("gateway\n")
        env = {**os.environ, "ADP_ROLE_FILE": str(role), "ADP_SOCKET": gw.socket}
        entry = os.path.join(os.path.dirname(__file__), "..", "..", "docker", "entrypoint.sh")
        for _ in range(3):
            r = subprocess.run(["bash", entry, "healthcheck"], env=env, capture_output=True, text=True, timeout=60)
            assert r.returncode == 0, r.stderr
        assert eventually(lambda: gw.log().count("before its handshake") == 3), gw.log()
        probes = [line for line in gw.log().splitlines() if "before its handshake" in line]
        assert all(" DEBUG: " in line for line in probes), probes
        assert "gone after 0 batches" not in gw.log()

        c = RawConnector(ADPConnector(gateway=gw.unix_url, num_workers=1))
        assert c.set(["k"], [memoryview(payload("k", 4096))])[0]
        c.conn.close()
        assert eventually(lambda: "gone after 1 batches" in gw.log()), gw.log()
        ends = [line for line in gw.log().splitlines() if "gone after" in line]
        assert len(ends) == 1 and " INFO: " in ends[0], ends

        with socket.socket(socket.AF_UNIX) as s:  # not a frame: refused, at its level
            s.connect(gw.socket)
            s.sendall(b"not a frame at all, long enough for a header")
            s.settimeout(10)
            while s.recv(4096):
                pass
        assert eventually(lambda: "closing the connection" in gw.log()), gw.log()
        refused = [line for line in gw.log().splitlines() if "closing the connection" in line]
        assert len(refused) == 1 and " WARNING: " in refused[0], refused
    finally:
        assert gw.stop() == 0
