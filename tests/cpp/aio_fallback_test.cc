// SPDX-License-Identifier: Apache-2.0
// A disk card's Linux AIO writer (CardDevice::make_writer, aio37) where the kernel refuses part of it: this
// program's own seccomp filter (installed before any thread starts) makes one AIO syscall fail, then it stores and
// loads on a card image at CARD_IMAGE (a disk: O_DIRECT, AIO). Modes:
//   setup      io_setup fails (ENOSYS: seccomp, an old kernel): the synchronous writer; every store whole, loads
//              back and after a reopen; none counted overlapped (writes_overlapped 0).
//   submit     io_submit fails (EAGAIN): each write made synchronously in submit(); the same, none counted
//              overlapped (the write before it was done, not in flight, while the next store was prepared).
//   submit K   as submit, on a card of one I/O slot (io_depth 1), with the K-th allocation of the first put
//              failing (std::bad_alloc, tests/cpp/alloc_fault.h): every later store and load still completes (no
//              I/O slot kept by a failed submit: with one slot, the next I/O would wait for it for good); prints
//              "threw" where the K-th allocation came inside the put.
//   getevents  io_getevents fails (EINVAL): the first write's fate unknown, that store fails and is not on the
//              card after a reopen; the writer no longer uses its AIO context (destroyed: io_destroy waits for
//              the write the kernel may still be making), so every later store is made synchronously, whole.
//   fork       no syscall refused: stores (through AIO: io_submit called), then forks; the child stores through
//              the same IoContext (its writer's AIO context the parent's: io_submit there fails EINVAL, an AIO
//              context is a process's) and must call io_submit not once (each call counted by this program's
//              syscall()), count none overlapped and log one WARNING (its stderr read back: the fork named, no
//              "io_submit failed"); every store acknowledged. The parent, once the child passed, runs this program
//              again as `fork-verify` (its own store is not closed: its clean close would pad its frontier over
//              the child's stores): every store of both, whole after a reopen. debt38: aio37 tried io_submit on
//              each of the child's writes, then wrote it synchronously.
//
//   aio_fallback_test MODE CARD_IMAGE [K]
#include <dlfcn.h>
#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "alloc_fault.h"
#include "check.h"
#include "store/card_store.h"
#include "test_card.h"

bool adp::testing::alloc_fault_due() { return false; }

// This process's io_submit calls (the store makes them through syscall(), which this definition takes; every call
// goes on to libc's).
static std::atomic<long> io_submits{0};

extern "C" long syscall(long number, ...) {
  va_list ap;
  va_start(ap, number);
  long a[6];
  for (long& x : a) x = va_arg(ap, long);
  va_end(ap);
  if (number == SYS_io_submit) io_submits.fetch_add(1);
  static const auto real = reinterpret_cast<long (*)(long, ...)>(dlsym(RTLD_NEXT, "syscall"));
  return real(number, a[0], a[1], a[2], a[3], a[4], a[5]);
}

namespace {

using adp::IoContext;
using adp::PutItem;
using adp::Status;
using adp::testing::check;

constexpr uint64_t kRegionBytes = 4ull << 20;
constexpr uint64_t kCardBytes = adp::testing::card_bytes(8, kRegionBytes);
constexpr size_t kObject = 256u << 10;
constexpr int kItems = 4;

std::string key(int i) { return "m@0@0@aio" + std::to_string(i); }

// Makes syscall `nr` fail with `err` in this process (every thread started after it).
bool deny(long nr, int err) {
  sock_filter f[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, static_cast<uint32_t>(nr), 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | static_cast<uint32_t>(err)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  sock_fprog prog{static_cast<unsigned short>(sizeof f / sizeof f[0]), f};
  return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 && prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0;
}

// Items of each kind a disk put_each overlaps: staged (unaligned), zero-copy with a tail, filled, staged.
struct Batch {
  std::vector<std::vector<uint8_t>> values;
  std::vector<std::string> keys;
  uint8_t* mem = nullptr;
  std::vector<PutItem> items;
  Batch(int first) : mem(static_cast<uint8_t*>(std::aligned_alloc(4096, kItems * (1u << 20)))) {
    for (int i = 0; i < kItems; i++) {
      const size_t size = i == 1 ? (64u << 10) + 100 : kObject;
      values.push_back(adp::testing::pattern(size, uint8_t(first + i)));
      keys.push_back(key(first + i));
    }
    for (int i = 0; i < kItems; i++) {
      const std::vector<uint8_t>& v = values[i];
      uint8_t* at = mem + i * (1u << 20) + (i == 1 ? 0 : 8);
      std::memcpy(at, v.data(), v.size());
      if (i == 2)
        items.push_back({keys[i], nullptr, v.size(), [&v](uint8_t* dst, uint64_t off, size_t len) {
                           std::memcpy(dst, v.data() + off, len);
                           return Status::Ok();
                         }});
      else
        items.push_back({keys[i], at, v.size()});
    }
  }
  ~Batch() { std::free(mem); }
  // `out`: a std::bad_alloc out of put_each, caught (each item's result its own: CardStore::put_each's undo).
  // `k`: the allocations let through before one throws (tests/cpp/alloc_fault.h), from the put's start.
  std::vector<Status> put(adp::CardStore& s, IoContext& ctx, bool* out = nullptr, int k = -1) {
    std::vector<Status> r(items.size(), Status::IoError("never reached"));
    adp::testing::fail_after = k;
    try {
      s.put_each(ctx, items.data(), items.size(), r.data(), [](size_t) { return true; });
    } catch (const std::bad_alloc&) {
      if (!out) throw;
      *out = true;
    }
    return r;
  }
};

void check_loads(adp::CardStore& s, const std::string& what, const Batch& b, const std::vector<bool>& present) {
  for (int i = 0; i < kItems; i++) {
    Status st;
    auto got = adp::testing::read_object(s, b.keys[i], &st);
    if (present[i])
      check(got && *got == b.values[i], what + ": " + b.keys[i] + " loads back whole (" + st.message() + ")");
    else
      check(!got, what + ": " + b.keys[i] + " is not on the card");
  }
}

// A card image made afresh at co.path and opened; nullptr where the open failed (a check failed) or the card is
// memory-backed (no O_DIRECT: skipped, said).
std::unique_ptr<adp::CardStore> open_disk_card(const adp::CardOptions& co, const std::string& what) {
  std::remove(co.path.c_str());
  auto s = adp::testing::checked_card(co, what + ": open");
  if (s && s->memory_speed()) {
    std::printf("aio_fallback_test: %s is memory-backed (no O_DIRECT): skipped\n", co.path.c_str());
    s.reset();
  }
  return s;
}

// The text of file `path`.
std::string slurp(const std::string& path) {
  std::string out;
  if (FILE* f = std::fopen(path.c_str(), "r")) {
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) out.append(buf, n);
    std::fclose(f);
  }
  return out;
}

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) n++;
  return n;
}

// The fork mode's child: stores `second` through ctx (its writer made in the parent) and checks it; its exit status.
int forked_child(adp::CardStore& s, IoContext& ctx, Batch& second, const std::string& log_path) {
  const long submits = io_submits.load();
  const uint64_t overlapped = s.stats().writes_overlapped;
  // Its stderr (the store's log) into log_path while it stores, then read back.
  std::fflush(stderr);
  const int saved = ::dup(2), logged = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  check(saved >= 0 && logged >= 0 && ::dup2(logged, 2) == 2, "fork: the child's stderr goes to " + log_path);
  std::vector<Status> r = second.put(s, ctx);
  std::vector<Status> again = second.put(s, ctx);  // a second put: still one WARNING
  std::fflush(stderr);
  ::dup2(saved, 2);
  const std::string log = slurp(log_path);
  std::fprintf(stderr, "%s", log.c_str());
  for (int i = 0; i < kItems; i++)
    check(r[i].ok() && again[i].ok(),
          "fork: the child's store of item " + std::to_string(i) + ": " + r[i].message() + " / " + again[i].message());
  const long tried = io_submits.load() - submits;
  std::printf("fork: the child's io_submit calls %ld, writes_overlapped +%llu\n", tried,
              static_cast<unsigned long long>(s.stats().writes_overlapped - overlapped));
  check(tried == 0, "fork: the child calls io_submit on the parent's AIO context not once: " + std::to_string(tried));
  check(s.stats().writes_overlapped == overlapped, "fork: none of the child's writes counted overlapped");
  check(count_of(log, "was forked from") == 1,
        "fork: one WARNING naming the fork in the child: " + std::to_string(count_of(log, "was forked from")));
  check(count_of(log, "io_submit failed") == 0, "fork: no io_submit failure logged in the child");
  return adp::testing::finish("aio_fallback_test fork child");
}

// Mode fork (see the top): store, fork, the child stores; then this program again as fork-verify.
int fork_mode(const std::string& self, const std::string& path) {
  auto s = open_disk_card(adp::testing::card_options(kRegionBytes, path, kCardBytes), "fork");
  if (!s) return adp::testing::finish("aio_fallback_test");
  IoContext ctx;
  Batch first(0), second(10);
  alarm(30);
  std::vector<Status> r = first.put(*s, ctx);
  for (int i = 0; i < kItems; i++) check(r[i].ok(), "fork: the parent's store of item " + std::to_string(i));
  if (io_submits.load() == 0) {
    std::printf("aio_fallback_test: no AIO context here (io_setup refused): fork skipped\n");
    return adp::testing::finish("aio_fallback_test");
  }
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t child = ::fork();
  if (child == 0) {
    const int code = forked_child(*s, ctx, second, path + ".child.log");
    std::fflush(stdout);
    std::fflush(stderr);
    ::_exit(code);  // the store not closed: the parent's and the child's are the same card's
  }
  int status = -1;
  const bool reaped = child > 0 && ::waitpid(child, &status, 0) == child;
  check(reaped && WIFEXITED(status) && WEXITSTATUS(status) == 0,
        "fork: the child's stores and checks pass (wait status " + std::to_string(status) + ")");
  std::remove((path + ".child.log").c_str());
  if (adp::testing::check_failures) return adp::testing::finish("aio_fallback_test");
  // This store's view lacks the child's stores: not closed (its close pads its frontier's tail), the reopen in a
  // fresh process (the card's descriptor is O_CLOEXEC: its lock goes with the exec).
  (void)s.release();
  std::fflush(stdout);
  ::execl(self.c_str(), self.c_str(), "fork-verify", path.c_str(), static_cast<char*>(nullptr));
  check(false, std::string("fork: exec of fork-verify: ") + std::strerror(errno));
  return adp::testing::finish("aio_fallback_test");
}

// Mode fork-verify: every store of the fork mode's parent and child, whole after a reopen.
int fork_verify(const std::string& path) {
  Batch first(0), second(10);
  {
    auto s = adp::testing::checked_card(adp::testing::card_options(kRegionBytes, path), "fork: reopen");
    if (s) {
      check_loads(*s, "fork: the parent's stores after a reopen", first, std::vector<bool>(kItems, true));
      check_loads(*s, "fork: the child's stores after a reopen", second, std::vector<bool>(kItems, true));
    }
  }
  std::remove(path.c_str());
  return adp::testing::finish("aio_fallback_test");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: aio_fallback_test setup|submit|getevents|fork CARD_IMAGE [K]\n");
    return 2;
  }
  const std::string mode = argv[1], path = argv[2];
  if (mode == "fork") {
    ::setenv("ADP_LOG_LEVEL", "WARNING", 1);  // the child's WARNING counted (before the first log line)
    return fork_mode("/proc/self/exe", path);
  }
  if (mode == "fork-verify") return fork_verify(path);
  const int k = argc > 3 ? std::atoi(argv[3]) : -1;
  const long nr = mode == "setup" ? SYS_io_setup : mode == "submit" ? SYS_io_submit : SYS_io_getevents;
  const int err = mode == "setup" ? ENOSYS : mode == "submit" ? EAGAIN : EINVAL;
  if (!deny(nr, err)) {
    std::printf("aio_fallback_test: no seccomp filter here (%s): skipped\n", std::strerror(errno));
    return adp::testing::finish("aio_fallback_test");
  }
  const std::string what = mode + (k >= 0 ? " K=" + std::to_string(k) : "");
  adp::CardOptions co = adp::testing::card_options(kRegionBytes, path, kCardBytes);
  if (k >= 0) co.io_depth = 1;  // a slot kept by a failed submit: the next I/O waits for good
  auto s = open_disk_card(co, what);
  if (!s) return adp::testing::finish("aio_fallback_test");
  IoContext ctx;
  Batch first(0), second(10);
  // A load or store that waits for good (an I/O slot never given back) ends the program: a failure.
  alarm(30);
  bool out = false;
  std::vector<Status> r1 = first.put(*s, ctx, k >= 0 ? &out : nullptr, k);
  const bool threw = k >= 0 && adp::testing::fail_after == -1;
  adp::testing::fail_after = -1;
  if (k >= 0) {  // the first put's outcome is the allocation's: only what comes after it is judged
    std::printf("%s: %s%s\n", what.c_str(), threw ? "threw" : "no throw", out ? " (out of put_each)" : "");
    std::vector<bool> present;
    for (int i = 0; i < kItems; i++) present.push_back(r1[i].ok());
    check_loads(*s, what + ": the first put", first, present);
  } else if (mode == "getevents") {
    check(!r1[0].ok(), what + ": the store whose write's completion is unknown fails");
    for (int i = 1; i < kItems; i++)
      check(r1[i].ok(), what + ": item " + std::to_string(i) + " after it is stored: " + r1[i].message());
  } else {
    for (int i = 0; i < kItems; i++)
      check(r1[i].ok(), what + ": first put, item " + std::to_string(i) + ": " + r1[i].message());
  }
  std::vector<Status> r2 = second.put(*s, ctx);
  for (int i = 0; i < kItems; i++)
    check(r2[i].ok(), what + ": second put, item " + std::to_string(i) + ": " + r2[i].message());
  const uint64_t overlapped = s->stats().writes_overlapped;
  std::printf("%s: writes_overlapped %llu\n", what.c_str(), static_cast<unsigned long long>(overlapped));
  if (mode != "getevents")
    check(overlapped == 0, what + ": no write was in flight while a store was prepared, writes_overlapped " +
                               std::to_string(overlapped));
  else
    check(overlapped <= 1,
          what + ": only the first write was in flight, writes_overlapped " + std::to_string(overlapped));
  std::vector<bool> present(kItems, true);
  if (k < 0) {
    std::vector<bool> first_present(kItems, true);
    if (mode == "getevents") first_present[0] = false;
    check_loads(*s, what, first, first_present);
    check_loads(*s, what, second, present);
    s.reset();
    s = adp::testing::checked_card(adp::testing::card_options(kRegionBytes, path), what + ": reopen");
    if (s) {
      check_loads(*s, what + " after a reopen", first, first_present);
      check_loads(*s, what + " after a reopen", second, present);
    }
  } else {
    check_loads(*s, what, second, present);
  }
  s.reset();
  std::remove(path.c_str());
  return adp::testing::finish("aio_fallback_test");
}
