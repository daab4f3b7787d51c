# SPDX-License-Identifier: Apache-2.0
"""Helpers that drive a real LMCache MP server the way vLLM does (used by the
quickstart, the end-to-end tests and the restore benchmark). Needs lmcache."""
