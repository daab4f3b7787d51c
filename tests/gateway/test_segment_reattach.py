# SPDX-License-Identifier: Apache-2.0
"""A file registered again while another connection lets go of its mapping (review33d): ClientSegment::Attach
looked the mapping up under g_mu, and where it could not share it (the file's size changed, or the mapping broke)
dropped that reference under g_mu; were it the last one (the other connection let go in between), ~SegmentMapping
took g_mu on the same thread and every registration, release and stats query of the gateway waited for good.

Builds tests/cpp/segment_reattach_test.cc, which builds client_segment.cc into itself with a hook in the look-up
(weak_ptr<SegmentMapping>::lock) that lets the other connection's segment go there: deterministic, no timing. The
program fails (exit 1, one line) when the registration does not return in 20 s."""

from __future__ import annotations

from tests.support import cpp


def test_registration_of_a_resized_file_as_its_last_holder_lets_go(shm_dir, tmp_path):
    # client_segment.cc is #included by the program (its g_mu, with the hooked lock()): not linked again.
    out = cpp.run(cpp.build("segment_reattach_test", tmp_path, ("util",)), shm_dir, timeout=120)
    assert "segment_reattach_test: PASS" in out, out[-3000:]


def test_a_segment_larger_than_the_whole_cap_is_refused_for_good(shm_dir, tmp_path):
    # review33d: refused "for now" (r19), the connector registered it again every 60 s for its life, each time
    # dropping its connection; no state of the gateway ever maps it.
    out = cpp.run(cpp.build("segment_cap_test", tmp_path, ("util",), ("protocol/client_segment.cc",)), shm_dir)
    assert "segment_cap_test: PASS" in out, out[-3000:]
