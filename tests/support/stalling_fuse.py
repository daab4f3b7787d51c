# SPDX-License-Identifier: Apache-2.0
"""A FUSE filesystem of one file whose reads its server never answers: the hostile client's file whose pages a
gateway that maps it waits on without bound. Spoken straight over /dev/fuse (no libfuse, no package), so it
needs CAP_SYS_ADMIN (root in the test container); `StallingFuse.available()` says whether a mount works here.

The server is a child process of its own (this file run as a script), never a thread of the test: a thread
of the process that touches the file's pages while holding the GIL would wait on a server that needs the GIL.
It dies with its parent (PR_SET_PDEATHSIG), and its death aborts the mount's connection: every read held
fails then (a mapping's access gets SIGBUS), so nothing is left waiting. The mount is detached at close."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import select
import signal
import struct
import subprocess
import sys
import tempfile

# Opcodes and layouts of the FUSE protocol (include/uapi/linux/fuse.h).
LOOKUP, FORGET, GETATTR, OPEN, READ, STATFS, RELEASE, FLUSH, INIT, INTERRUPT, DESTROY, BATCH_FORGET = (
    1, 2, 3, 14, 15, 17, 18, 25, 26, 36, 38, 42,
)  # fmt: skip
CLONE_NEWNS, MS_REC, MS_PRIVATE = 0x20000, 0x4000, 1 << 18
IN_HEADER = struct.Struct("<IIQQIIIHH")  # len, opcode, unique, nodeid, uid, gid, pid, total_extlen, padding
OUT_HEADER = struct.Struct("<IiQ")  # len, error, unique
ROOT, FILE = 1, 2
NAME = b"segment"
S_IFDIR, S_IFREG = 0o040000, 0o100000
MNT_DETACH = 2


def _attr(ino: int, size: int, mode: int) -> bytes:
    # ino, size, blocks, atime, mtime, ctime, 3 x nsec, mode, nlink, uid, gid, rdev, blksize, flags
    return struct.pack("<QQQQQQIIIIIIIIII", ino, size, (size + 511) // 512, 0, 0, 0, 0, 0, 0, mode, 1, 0, 0, 0, 4096, 0)


def _reply(dev: int, unique: int, body: bytes = b"", error: int = 0) -> None:
    with contextlib.suppress(OSError):  # the request was interrupted
        os.write(dev, OUT_HEADER.pack(OUT_HEADER.size + len(body), -error, unique) + body)


def serve(size: int, mount: str, stall_getattr: bool = False, own_namespace: bool = False) -> int:
    """The child: mounts, says "R" on stdout, then serves; says "H" for each READ it holds (never answered), and
    with stall_getattr for each GETATTR of the file (whose attributes it then lets no one cache). With
    own_namespace it mounts in a mount namespace of its own (its mounts private) and holds every STATFS too."""
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    dev = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
    opts = f"fd={dev},rootmode=40000,user_id=0,group_id=0".encode()
    libc = ctypes.CDLL(None, use_errno=True)
    if own_namespace and (libc.unshare(CLONE_NEWNS) != 0 or libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None)):
        print(f"E own mount namespace: {os.strerror(ctypes.get_errno())}", flush=True)
        return 1
    if libc.mount(b"adp-stalling-fuse", mount.encode(), b"fuse.adp-stalling", 0, opts) != 0:
        print(f"E mount fuse on {mount}: {os.strerror(ctypes.get_errno())}", flush=True)
        return 1
    print("R", flush=True)
    while True:
        try:
            data = os.read(dev, 1 << 20 | 4096)
        except OSError as e:
            if e.errno in (errno.EINTR, errno.EAGAIN):
                continue
            return 0  # ENODEV: unmounted
        _, opcode, unique, nodeid, *_ = IN_HEADER.unpack_from(data)
        arg = data[IN_HEADER.size :]
        if opcode == INIT:
            minor = struct.unpack_from("<II", arg)[1]
            # major, minor, max_readahead, flags, max_background, congestion_threshold, max_write, time_gran,
            # max_pages, map_alignment, flags2, max_stack_depth, unused[6]
            _reply(dev, unique, struct.pack("<IIIIHHIIHHII24x", 7, min(minor, 31), 0, 0, 0, 0, 1 << 20, 1, 0, 0, 0, 0))
        elif opcode == LOOKUP:
            if nodeid == ROOT and arg.rstrip(b"\0") == NAME:
                valid = 0 if stall_getattr else 3600
                entry = struct.pack("<QQQQII", FILE, 0, valid, valid, 0, 0)
                _reply(dev, unique, entry + _attr(FILE, size, S_IFREG | 0o600))
            else:
                _reply(dev, unique, error=errno.ENOENT)
        elif opcode == GETATTR and nodeid == FILE and stall_getattr:
            print("H", flush=True)  # held: never answered
        elif opcode == GETATTR:
            attr = _attr(ROOT, 0, S_IFDIR | 0o755) if nodeid == ROOT else _attr(FILE, size, S_IFREG | 0o600)
            _reply(dev, unique, struct.pack("<QII", 3600, 0, 0) + attr)
        elif opcode == OPEN:
            _reply(dev, unique, struct.pack("<QII", 1, 0, 0))
        elif opcode == READ or (opcode == STATFS and own_namespace):
            print("H", flush=True)  # held: never answered
        elif opcode in (RELEASE, FLUSH):
            _reply(dev, unique)
        elif opcode in (FORGET, BATCH_FORGET, INTERRUPT):
            continue  # no reply
        elif opcode == DESTROY:
            _reply(dev, unique)
            return 0
        else:
            _reply(dev, unique, error=errno.ENOSYS)


class StallingFuse:
    """Mounts a filesystem holding one regular file of `size` bytes (`self.path`), served by a child process
    that holds every READ of it unanswered (with stall_getattr, every GETATTR of it too: an fstat of it never
    returns). `wait_for_held_read()` waits for the first request held."""

    def __init__(self, size: int, stall_getattr: bool = False, own_namespace: bool = False, parent: str = "/tmp"):
        self.mount = tempfile.mkdtemp(prefix="adp-fuse-", dir=parent)  # parent: where the mount point is made
        self.path = os.path.join(self.mount, NAME.decode())
        args = [str(size), self.mount, str(int(stall_getattr)), str(int(own_namespace))]
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), *args], stdout=subprocess.PIPE)
        if own_namespace:  # reached through the server's root: a mount the opener's namespace does not list
            self.path = f"/proc/{self.proc.pid}/root{self.path}"
        line = self.proc.stdout.readline().decode().strip()
        if line != "R":
            self.proc.kill()
            self.proc.wait()
            os.rmdir(self.mount)
            raise OSError(errno.EPERM, line[2:] or f"the FUSE server exited with {self.proc.returncode}")

    @staticmethod
    def available() -> str:
        """'' where a FUSE mount works here, else why not."""
        if not os.path.exists("/dev/fuse"):
            return "no /dev/fuse"
        try:
            StallingFuse(4096).close()
        except OSError as e:
            return str(e)
        return ""

    def wait_for_held_read(self, timeout: float) -> bool:
        while select.select([self.proc.stdout], [], [], timeout)[0]:
            line = self.proc.stdout.readline()
            if not line:
                return False
            if line.strip() == b"H":
                return True
        return False

    def close(self) -> None:
        """Kills the server (which fails every read held) and detaches the mount."""
        self.proc.kill()
        self.proc.wait()
        self.proc.stdout.close()
        ctypes.CDLL(None, use_errno=True).umount2(self.mount.encode(), MNT_DETACH)
        with contextlib.suppress(OSError):
            os.rmdir(self.mount)


if __name__ == "__main__":
    sys.exit(serve(int(sys.argv[1]), sys.argv[2], sys.argv[3] == "1", sys.argv[4] == "1"))
