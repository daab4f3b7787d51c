// SPDX-License-Identifier: Apache-2.0
// Names the calling thread, as top -H, ps -L, perf and py-spy show it
// (/proc/<pid>/task/<tid>/comm). Linux keeps 15 bytes; a longer name is cut.
// Without names every native thread shows its process's name ("lmcache" in
// LMCache's MP server), and a profile cannot tell a plugin worker from a torch
// thread.
#pragma once

#include <pthread.h>

#include <cstdio>

namespace adp {

inline void set_thread_name(const char* base, int index = -1) {
  char name[32];
  if (index < 0)
    std::snprintf(name, sizeof name, "%s", base);
  else
    std::snprintf(name, sizeof name, "%s-%d", base, index);
  name[15] = '\0';                           // the kernel's limit: pthread_setname_np refuses longer names
  pthread_setname_np(pthread_self(), name);  // best effort: a failure only loses the label
}

}  // namespace adp
