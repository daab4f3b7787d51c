// SPDX-License-Identifier: Apache-2.0
// MADV_POPULATE_WRITE (Linux 5.14), made in one place for its two users: a
// client segment's pages before a load copies into them
// (proto::ClientSegment::prepare) and a tmpfs card's pages before a store
// copies into its mapping (CardDevice::prepare_mapped_write). A kernel before
// 5.14 refuses the call (EINVAL) every time: the process asks the kernel once,
// logs a refusal once at WARNING, and makes no call after it.
#pragma once

#include <sys/mman.h>

#include <cstddef>

// The values of Linux 5.14's uapi, for headers older than the kernel.
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace adp {

// Allocates what is a hole in [p, p + n) and maps each of its pages writable
// in this process's page tables, in one madvise(MADV_POPULATE_WRITE): a copy
// into the range then takes no page fault per 4 KiB, and cannot meet a page
// it cannot allocate (SIGBUS on a full tmpfs). True if done. False if not,
// errno set: EFAULT (a page could not be allocated: a full tmpfs), EINVAL for
// a range this call cannot populate (p not page-aligned, a read-only
// mapping), or EINVAL because this kernel refuses the call. Whether it does is
// asked once per process (the call with length 0, which only checks the
// advice): refused, the first caller logs it at WARNING and every call after
// returns false without a system call. Thread-safe.
bool populate_write(void* p, size_t n);

// Whether this kernel refuses the MADV_POPULATE_* advice (Linux before 5.14,
// which brought MADV_POPULATE_READ and MADV_POPULATE_WRITE together): the
// question populate_write asks, asked once per process, logged as it does.
// p: any address of a mapping of this process. Thread-safe.
bool populate_refused(void* p);

// ADP_TEST_SEGMENT_POPULATE_EINVAL (a gateway's test hook): from now on this
// process takes the kernel to refuse the call (and MADV_POPULATE_READ: the
// card's prefault asks populate_refused), as one before Linux 5.14 does: its
// one question to the kernel is not made but answered EINVAL, logged at INFO
// ("MADV_POPULATE_WRITE fails as EINVAL, not made") each time it would have
// been made (once, then no call is made).
void refuse_populate_for_test();

}  // namespace adp
