# SPDX-License-Identifier: Apache-2.0
"""What the tests (and benchmarks/bench_restore.py) need beyond the public
helper lmcache_adp.testing: the gateway daemon launcher, what is read from an
MP server's log (its per-lookup L1/L2 report), which no public interface offers,
and the session's check that the native module is this tree's build."""
