// SPDX-License-Identifier: Apache-2.0
// An LD_PRELOAD library for tests on a kernel without Yama: it stands in for
// Yama's ptracer record. prctl(PR_SET_PTRACER, pid) appends "<pid>\n" to the
// file PRCTL_SHIM_LOG names and succeeds (without Yama the kernel answers
// EINVAL); every other prctl goes to libc's.
#include <dlfcn.h>
#include <sys/prctl.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>

extern "C" int prctl(int option, ...) {
  va_list ap;
  va_start(ap, option);
  unsigned long args[4];
  for (unsigned long& a : args) a = va_arg(ap, unsigned long);
  va_end(ap);
  if (option == PR_SET_PTRACER) {
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
