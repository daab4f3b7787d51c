// SPDX-License-Identifier: Apache-2.0
// An LD_PRELOAD library for tests on a kernel without Yama: it stands in for
// Yama's ptracer record. prctl(PR_SET_PTRACER, pid) appends "<pid>\n" to the
// file PRCTL_SHIM_LOG names and succeeds (without Yama the kernel answers
// EINVAL); every other prctl goes to libc's.
// PRCTL_SHIM_HOLD (tests/gateway/test_ptracer.py's fork test): when the file it names exists, the next
// PR_SET_PTRACER removes it, creates "<it>.held" and sleeps PRCTL_SHIM_HOLD_MS milliseconds before it records the
// pid: its caller holds its ptracer record's lock meanwhile.
#include <dlfcn.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <string>

extern "C" int prctl(int option, ...) {
  va_list ap;
  va_start(ap, option);
  unsigned long args[4];
  for (unsigned long& a : args) a = va_arg(ap, unsigned long);
  va_end(ap);
  if (option == PR_SET_PTRACER) {
    const char* hold = std::getenv("PRCTL_SHIM_HOLD");
    if (hold && ::unlink(hold) == 0) {
      FILE* h = std::fopen((std::string(hold) + ".held").c_str(), "w");
      if (h) std::fclose(h);
      const char* ms = std::getenv("PRCTL_SHIM_HOLD_MS");
      ::usleep(static_cast<useconds_t>((ms ? std::atoi(ms) : 2000)) * 1000);
    }
    const char* path = std::getenv("PRCTL_SHIM_LOG");
    FILE* f = path ? std::fopen(path, "a") : nullptr;
    if (!f) return -1;
    std::fprintf(f, "%lu\n", args[0]);
    std::fclose(f);
    return 0;
  }
  using Prctl = int (*)(int, ...);
  static const Prctl real = reinterpret_cast<Prctl>(dlsym(RTLD_NEXT, "prctl"));
  return real(option, args[0], args[1], args[2], args[3]);
}
