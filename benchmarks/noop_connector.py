# SPDX-License-Identifier: Apache-2.0
"""A native connector that completes every request at once and moves no data.

bench_l2.py runs `lmcache bench l2 --only lookup` through it: the time per key
is what LMCache's NativeConnectorL2Adapter and the bench harness cost on their
own, the floor under any native connector's lookup.
"""

import os
import threading


class NoopConnector:
    def __init__(self, **_params):
        self._fd = os.eventfd(0, os.EFD_NONBLOCK)
        self._lock = threading.Lock()
        self._next = 0
        self._done = []

    def event_fd(self):
        return self._fd

    def _complete(self, keys):
        with self._lock:
            self._next += 1
            fid = self._next
            self._done.append((fid, True, "", [True] * len(keys)))
        os.eventfd_write(self._fd, 1)
        return fid

    def submit_batch_exists(self, keys):
        return self._complete(keys)

    def submit_batch_get(self, keys, buffers):
        return self._complete(keys)

    def submit_batch_set(self, keys, buffers):
        return self._complete(keys)

    def drain_completions(self):
        try:
            os.eventfd_read(self._fd)
        except BlockingIOError:
            pass
        with self._lock:
            done, self._done = self._done, []
        return done

    def close(self):
        os.close(self._fd)
