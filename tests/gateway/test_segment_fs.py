# SPDX-License-Identifier: Apache-2.0
"""Which filesystems' files the gateway refuses as client segments (tests/cpp/segment_fs_test.cc): a FUSE file
(session 23) and a file on a network filesystem (NFS, CIFS/SMB, 9p, Ceph, AFS, Lustre, GlusterFS: debt37), by its
mount's type as /proc/self/mountinfo names it, injected (no NFS mount here), the refusal naming the type and the
path, and a hypervisor's shared folder (virtiofs, vboxsf, vmhgfs, prl_fs: debt38b); memory and local disk filesystems
taken. The refusal fits the Error frame whole, a long path cut in the middle (debt38b). A refused file's buffers go through the ring (docs/protocol.md,
"Segments"; through a live gateway: test_segments.py's test_a_segment_on_a_fuse_file_is_refused)."""

from __future__ import annotations

from tests.support import cpp


def test_segments_on_network_filesystems_are_refused(tmp_path):
    cpp.run(cpp.build("segment_fs_test", tmp_path, ("util",), ("protocol/client_segment.cc",)), timeout=120)
