// SPDX-License-Identifier: Apache-2.0
// Python bindings: lmcache_adp._native. Kept thin: argument conversion, GIL
// handling and Status -> exception. Validation of adapter_params lives in
// lmcache_adp/config.py; this layer trusts its caller for types.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

#include "connector/connector.h"
#include "gateway/gateway_server.h"
#include "protocol/messages.h"
#include "store/card_device.h"
#include "store/card_store.h"
#include "transport/embedded_backend.h"
#include "transport/remote_backend.h"
#include "util/crc32c.h"
#include "util/fork_owner.h"
#include "util/log.h"
#include "util/test_hooks.h"

namespace py = pybind11;

namespace adp {
// The digest of the src_cpp sources this module was built from, behind a
// marker so a tool can find it in the module's bytes without importing it:
// "adp-source-digest:<64 hex>", defined in a translation unit the build
// generates (lmcache_adp/source_digest.py digest_unit(): setup.py,
// scripts/sanitize.sh asan-python), so that only that one object changes
// with the sources.
extern const char kSourceDigestRecord[];
constexpr char kSourceDigestMarker[] = "adp-source-digest:";

namespace {

// Text from a peer or the card (an error text, a gateway's reason, a path or key in a message) as str, decoded
// with errors="replace": a malformed byte becomes U+FFFD. pybind11's own std::string -> str decodes strictly, and a
// gateway that cut an error text inside a UTF-8 character (before utf34, at byte 256) made drain_completions raise
// UnicodeDecodeError in LMCache's completion thread, which must never raise for a bad message. Every std::string
// handed to Python as str that may carry such text goes through here (the GIL held).
py::str peer_text(std::string_view text) {
  PyObject* o = PyUnicode_DecodeUTF8(text.data(), static_cast<Py_ssize_t>(text.size()), "replace");
  if (!o) throw py::error_already_set();  // out of memory only: "replace" takes every byte
  return py::reinterpret_steal<py::str>(o);
}

// "ValueError for an option outside its range (GATEWAY_OPTION_RANGES): io_contexts 1 to 64, ...": the ranges of
// kGatewayOptionRanges in GatewayServer's docstring, from the table Start checks (not a second copy of the numbers).
std::string gateway_ranges_text() {
  std::string text = "ValueError for an option outside its range (GATEWAY_OPTION_RANGES):";
  const char* sep = " ";
  for (const GatewayOptionRange& r : kGatewayOptionRanges) {
    text += sep + std::string(r.name) + " " + std::to_string(r.min) + " to " + std::to_string(r.max);
    sep = ", ";
  }
  return text + ".";
}

// Raises ValueError (InvalidArgument) or RuntimeError with the message made valid UTF-8 by peer_text (the GIL
// held): a path or a peer's text in it (a card's path, a gateway's reason) cannot turn it into a
// UnicodeDecodeError. C++ exceptions still, whose what() is the message (NativeConnector::start keeps it).
[[noreturn]] void raise(const Status& s) {
  std::string text = peer_text(s.message()).cast<std::string>();
  if (s.code() == Status::Code::kInvalidArgument) throw py::value_error(text);
  throw std::runtime_error(text);
}

// Holds Python buffer views for the life of a batch. Destroyed with the GIL held (Connector::drain / free_retired
// called from Python), or without it by a Connector::submit that refuses its batch (std::bad_alloc, the GIL
// released around it): the GIL taken for the release then.
class PyBufferOwner : public BufferOwner {
 public:
  ~PyBufferOwner() override {
    if (PyGILState_Check()) {
      release();
    } else {
      py::gil_scoped_acquire gil;
      release();
    }
  }
  void release() noexcept {
    for (auto& v : views) PyBuffer_Release(&v);
  }
  std::vector<Py_buffer> views;
};

std::vector<std::string> to_keys(const py::list& keys) {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const py::handle& k : keys) {
    if (PyUnicode_Check(k.ptr())) {
      Py_ssize_t n;
      const char* p = PyUnicode_AsUTF8AndSize(k.ptr(), &n);
      if (!p) throw py::error_already_set();
      out.emplace_back(p, static_cast<size_t>(n));
    } else if (PyBytes_Check(k.ptr())) {
      out.emplace_back(PyBytes_AS_STRING(k.ptr()), static_cast<size_t>(PyBytes_GET_SIZE(k.ptr())));
    } else {
      throw py::type_error("keys must be str or bytes, got " + std::string(Py_TYPE(k.ptr())->tp_name));
    }
  }
  return out;
}

// The class LMCache loads (subclassed in Python as lmcache_adp.ADPConnector).
//
// Built empty (cannot raise), then started: a constructor that raised would
// leave an instance with no C++ object at all (pybind11 then hands methods
// uninitialised memory), and ADPConnector's self outlives a failed start in
// its traceback's frames. Every method of an empty one raises RuntimeError
// "this connector failed to start: ..." instead (audit 12 note 3); close()
// does nothing.
class NativeConnector {
 public:
  NativeConnector() = default;
  explicit NativeConnector(const py::dict& cfg) { start(cfg); }
  // In a forked child the connector is left whole (Connector::inherited(): its destructor would wait for ever on
  // condition variables the parent's threads waited on at the fork).
  ~NativeConnector() {
    if (connector_ && connector_->inherited()) static_cast<void>(connector_.release());
  }
  NativeConnector(const NativeConnector&) = delete;
  NativeConnector& operator=(const NativeConnector&) = delete;

  void start(const py::dict& cfg) {
    if (connector_) throw std::runtime_error("this connector is started already");
    try {
      std::string gateway = cfg["gateway"].cast<std::string>();
      ConnectorOptions opts;
      opts.num_workers = cfg["num_workers"].cast<int>();
      opts.timeout_ms = cfg["timeout_ms"].cast<int>();
      std::unique_ptr<Backend> backend = gateway == "embedded" ? open_embedded(cfg) : remote(gateway, cfg);
      connector_ = std::make_unique<Connector>(std::move(backend), opts);
    } catch (const std::exception& e) {
      why_not_started_ = e.what();
      throw;
    }
  }
  // Why the start did not happen, where it failed before start() (ADPConnector's parameter checks).
  void start_failed(const std::string& why) {
    if (!connector_) why_not_started_ = why;
  }
  bool started() const { return connector_ != nullptr; }

  static std::unique_ptr<Backend> open_embedded(const py::dict& cfg) {
    CardOptions co;
    co.path = cfg["card"].cast<std::string>();
    co.create_bytes = cfg["card_size_bytes"].cast<uint64_t>();
    co.create_preallocated = cfg.contains("card_preallocate") && cfg["card_preallocate"].cast<bool>();
    co.durable = cfg["durable"].cast<bool>();
    co.io_depth = cfg["io_depth"].cast<int>();
    co.release_in_forked_child = true;  // a forked child refuses its work (Connector::inherited()): no card lock there
    std::unique_ptr<CardStore> store;
    Status s;
    {
      py::gil_scoped_release nogil;
      s = CardStore::Open(co, &store);
    }
    if (!s.ok()) raise(s);
    return std::make_unique<EmbeddedBackend>(std::move(store));
  }

  // Connects nowhere here (the first worker tries once as the connector starts, in the background:
  // BackendSession::prepare): a gateway that is not up yet is not an error.
  static std::unique_ptr<Backend> remote(const std::string& gateway, const py::dict& cfg) {
    GatewayClientOptions o;
    Status s = proto::parse_endpoint(gateway, &o.endpoint);
    if (!s.ok()) raise(s);
    o.token = cfg["token"].cast<std::string>();
    o.stall_after = std::chrono::nanoseconds(cfg["gateway_stall_ns"].cast<int64_t>());
    o.reply_spin = std::chrono::microseconds(cfg["reply_spin_us"].cast<int64_t>());
    o.connect_timeout = std::chrono::milliseconds(cfg["connect_timeout_ms"].cast<int64_t>());
    if (o.endpoint.kind == proto::Endpoint::Kind::kUnix) {
      o.ring_bytes = cfg["ring_bytes"].cast<uint64_t>();
      o.segments = cfg["direct_loads"].cast<bool>();
      o.ring_progress = cfg["ring_pieces"].cast<bool>();
      o.process_memory = cfg["process_memory"].cast<bool>();
      o.ptracer_follow = cfg["ptracer_follow"].cast<bool>();
    }
    o.client_name = "lmcache-adp connector, pid " + std::to_string(::getpid());
    return std::make_unique<RemoteBackend>(std::move(o));
  }

  int event_fd() const { return conn().event_fd(); }

  uint64_t submit_with_buffers(OpType op, const py::list& keys, const py::list& bufs) {
    Connector& c = conn();
    if (keys.size() != bufs.size())
      throw py::value_error("got " + std::to_string(keys.size()) + " keys but " + std::to_string(bufs.size()) +
                            " buffers");
    std::vector<std::string> k = to_keys(keys);
    auto owner = std::make_unique<PyBufferOwner>();
    owner->views.reserve(bufs.size());
    std::vector<Buffer> buffers;
    buffers.reserve(bufs.size());
    int flags = op == OpType::kGet ? PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS : PyBUF_C_CONTIGUOUS;
    for (const py::handle& b : bufs) {
      Py_buffer view;
      if (PyObject_GetBuffer(b.ptr(), &view, flags) != 0) throw py::error_already_set();
      owner->views.push_back(view);
      buffers.push_back({static_cast<uint8_t*>(view.buf), static_cast<size_t>(view.len)});
    }
    py::gil_scoped_release nogil;
    return c.submit(op, std::move(k), std::move(buffers), std::move(owner));
  }

  uint64_t submit_keys(OpType op, const py::list& keys) {
    Connector& c = conn();
    std::vector<std::string> k = to_keys(keys);
    py::gil_scoped_release nogil;
    return c.submit(op, std::move(k), {}, nullptr);
  }

  py::list drain_completions() {
    std::vector<Completion> done = conn().drain();
    py::list out;
    for (auto& c : done) {
      py::list per_key;
      for (uint8_t v : c.per_key) per_key.append(py::bool_(v != 0));
      out.append(py::make_tuple(c.future_id, c.ok, peer_text(c.error), per_key));
    }
    return out;
  }

  void close() {
    if (!connector_) return;  // nothing was opened
    {
      py::gil_scoped_release nogil;
      connector_->close();
    }
    connector_->free_retired();
  }

  py::dict stats() const {
    py::dict d = stats_dict(conn().stats());
    py::dict lat;
    for (int i = 0; i < kNumOpTypes; i++) {
      auto snap = conn().latency(static_cast<OpType>(i));
      py::dict h;
      h["count"] = snap.count;
      h["sum_us"] = snap.sum_us;
      h["buckets"] = std::vector<uint64_t>(snap.buckets.begin(), snap.buckets.end());
      lat[op_name(static_cast<OpType>(i))] = h;
    }
    d["latency_us_log2"] = lat;
    conn().for_each_timing(d.contains("gateway_reachable"),
                           [&d](const std::string& k, uint64_t v) { d[k.c_str()] = v; });
    return d;
  }
  py::str describe() const { return peer_text(conn().describe()); }

  static py::dict stats_dict(const StoreStats& s) {
    py::dict d;
    for_each_stat(s, [&d](const char* k, auto v) { d[k] = v; });
    if (s.on_gateway) {  // a connector on a gateway (docs/stats.md)
      d["gateway_reachable"] = s.gateway_reachable;
      d["gateway_token_refused"] = s.gateway_token_refused;
      d["gateway_reconnects"] = s.gateway_reconnects;
      d["gateway_stalled"] = s.gateway_stalled;
      d["gateway_card_healthy"] = s.gateway_card_healthy;
      d["gateway_card_error"] = peer_text(s.gateway_card_error);
      d["gateway_error"] = peer_text(s.gateway_error);
    }
    return d;
  }

 private:
  Connector& conn() const {
    if (!connector_)
      throw std::runtime_error("this connector failed to start: " +
                               (why_not_started_.empty() ? std::string("its start raised") : why_not_started_));
    return *connector_;
  }

  std::unique_ptr<Connector> connector_;
  std::string why_not_started_;
};

// Direct, synchronous access to a card: for tools (status/verify) and tests.
class PyCardStore {
 public:
  PyCardStore(const std::string& path, uint64_t create_bytes, bool durable, uint64_t region_bytes, bool format_blank,
              bool read_only, bool preallocate, bool restore_block_zero)
      : path_(path) {
    CardOptions co;
    co.path = path;
    co.create_preallocated = preallocate;
    co.format_blank = format_blank;
    co.read_only = read_only;
    co.restore_block_zero = restore_block_zero;
    co.create_bytes = create_bytes;
    co.durable = durable;
    co.region_bytes = region_bytes;
    co.release_in_forked_child = true;  // a forked child refuses its work (inherited_here()): no card lock there
    Status s;
    {
      py::gil_scoped_release nogil;
      s = CardStore::Open(co, &store_);
    }
    if (!s.ok()) raise(s);
    ctx_ = std::make_unique<IoContext>();
  }
  // In a forked child the store is left whole: its close would write to the card, and its destructor waits for ever
  // on condition variables the parent's threads waited on at the fork.
  ~PyCardStore() {
    if (owner_.inherited()) {
      static_cast<void>(store_.release());
      static_cast<void>(ctx_.release());
    }
  }
  PyCardStore(const PyCardStore&) = delete;
  PyCardStore& operator=(const PyCardStore&) = delete;

  bool put(const std::string& key, const py::buffer& data) {
    refuse_inherited();
    py::buffer_info info = data.request();
    PutItem item{key, static_cast<const uint8_t*>(info.ptr), static_cast<size_t>(info.size * info.itemsize)};
    Status st;
    {
      py::gil_scoped_release nogil;
      std::lock_guard<std::mutex> l(mu_);
      store().put(*ctx_, &item, 1, &st, [] { return true; });
    }
    if (!st.ok()) raise(st);
    return true;
  }

  py::object get(const std::string& key) {
    if (inherited_here()) return py::none();
    std::string out;
    Status s;
    {
      py::gil_scoped_release nogil;
      std::lock_guard<std::mutex> l(mu_);
      s = store().get(*ctx_, key, [&out](size_t size, const CopyFn& copy) {
        out.resize(size);
        return copy(reinterpret_cast<uint8_t*>(out.data()));
      });
    }
    if (s.is_not_found()) return py::none();
    if (!s.ok()) raise(s);
    return py::bytes(out);
  }

  bool exists(const std::string& key) {
    if (inherited_here()) return false;
    py::gil_scoped_release nogil;
    std::lock_guard<std::mutex> l(mu_);
    return store().exists(key);
  }
  bool remove(const std::string& key) {
    refuse_inherited();
    Status s;
    {
      py::gil_scoped_release nogil;
      std::lock_guard<std::mutex> l(mu_);
      s = store().remove(*ctx_, key);
    }
    if (s.is_not_found()) return false;
    if (!s.ok()) raise(s);
    return true;
  }
  py::dict stats() const {
    refuse_inherited();
    StoreStats st;
    {
      py::gil_scoped_release nogil;
      std::lock_guard<std::mutex> l(mu_);
      st = store().stats();
    }
    return NativeConnector::stats_dict(st);
  }

  // progress(done, total) is called from time to time, with the GIL.
  py::dict verify(bool repair, const py::object& progress) {
    refuse_inherited();
    VerifyReport r;
    Status s;
    {
      py::gil_scoped_release nogil;
      std::lock_guard<std::mutex> l(mu_);
      s = store().verify(
          *ctx_, repair,
          [&progress](uint64_t done, uint64_t total) {
            if (progress.is_none() || (done % 256 && done != total)) return;
            py::gil_scoped_acquire gil;
            progress(done, total);
          },
          &r);
    }
    if (!s.ok()) raise(s);
    py::dict d;
    d["checked"] = r.checked;
    d["bad"] = r.bad;
    d["repaired"] = r.repaired;
    d["bytes"] = r.bytes;
    d["no_memory"] = r.no_memory;
    d["no_memory_bytes"] = r.no_memory_bytes;
    d["gone"] = r.gone;
    d["bad_objects"] = r.bad_objects;
    d["damaged_spans"] = r.damaged_spans;
    return d;
  }
  uint64_t max_object_bytes() const {
    refuse_inherited();
    py::gil_scoped_release nogil;
    std::lock_guard<std::mutex> l(mu_);
    return store().max_object_bytes();
  }
  std::string superblock_rewrite_error() const {
    refuse_inherited();
    py::gil_scoped_release nogil;
    std::lock_guard<std::mutex> l(mu_);
    return store().superblock_rewrite_error();
  }
  // Waits for an operation in progress (on another thread) to finish first.
  void close() {
    if (inherited_here()) {  // left whole (see ~PyCardStore), closed for this process
      static_cast<void>(store_.release());
      static_cast<void>(ctx_.release());
      return;
    }
    py::gil_scoped_release nogil;
    std::lock_guard<std::mutex> l(mu_);
    ctx_.reset();
    store_.reset();
  }

 private:
  // True in a process forked from the one that opened the store (debt39): there the card, its index and frontier
  // are the parent's (two processes writing through their own views overwrite each other's records) and mu_ may
  // have been held by a parent's thread at the fork. Nothing of the store is touched there; one ERROR line.
  bool inherited_here() const {
    if (!owner_.inherited()) return false;
    const uint64_t forks = fork_count();
    if (store_ && inherited_said_.exchange(forks) != forks)
      ADP_ERROR(
          "card store %s: used in pid %d, forked from pid %d that opened it: here its puts, removes and verify "
          "fail and its gets and lookups miss, nothing written (pid %d's: two processes writing one card through "
          "their own views of it overwrite each other's records); open the card in one process only",
          path_.c_str(), static_cast<int>(::getpid()), static_cast<int>(owner_.pid()), static_cast<int>(owner_.pid()));
    return true;
  }
  void refuse_inherited() const {
    if (inherited_here())
      throw std::runtime_error("card store " + path_ + " was opened by pid " + std::to_string(owner_.pid()) +
                               "; this process (pid " + std::to_string(::getpid()) + ") was forked from pid " +
                               std::to_string(owner_.pid()) + ": nothing is written here");
  }
  const ForkOwner owner_;
  const std::string path_;
  // fork_count() of the process that said its ERROR line (0: none). A count, not a flag: a child forked from such a
  // child copies it and says its own (fork40; review39's for the connector).
  mutable std::atomic<uint64_t> inherited_said_{0};
  CardStore& store() const {
    if (!store_) throw std::runtime_error("card store is closed");
    return *store_;
  }
  // Held by every operation and by close(), always without the GIL (verify's
  // progress callback takes the GIL while holding it): close() never frees
  // the store under an operation, and the one IoContext has one user.
  mutable std::mutex mu_;
  std::unique_ptr<CardStore> store_;
  std::unique_ptr<IoContext> ctx_;
};

// The gateway daemon's core, driven by `lmcache-adp gateway` (lmcache_adp/cli.py).
class PyGatewayServer {
 public:
  explicit PyGatewayServer(const GatewayOptions& opts) {
    Status s;
    {
      py::gil_scoped_release nogil;
      s = GatewayServer::Start(opts, &server_);
    }
    if (!s.ok()) raise(s);
  }
  void stop() {
    py::gil_scoped_release nogil;
    if (server_) server_->stop();
  }
  bool wait(double timeout_s) {
    py::gil_scoped_release nogil;
    return !server_ || server_->wait(std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
  }
  uint16_t tcp_port() const {
    std::shared_lock<std::shared_mutex> l(mu_);
    return server().tcp_port();
  }
  size_t clients() const {
    std::shared_lock<std::shared_mutex> l(mu_);
    return server().clients();
  }
  py::dict stats() const {
    StoreStats st;
    {
      std::shared_lock<std::shared_mutex> l(mu_);
      st = server().stats();
    }
    return NativeConnector::stats_dict(st);
  }
  // Asked by the metrics thread: may race close() (then: RuntimeError).
  py::str stats_json() const {
    std::string json;
    {
      py::gil_scoped_release nogil;
      std::shared_lock<std::shared_mutex> l(mu_);
      json = server().stats_json();
    }
    return peer_text(json);
  }
  // Stops and closes the card now, not whenever Python collects the object;
  // waits for a stats call in progress.
  void close() {
    py::gil_scoped_release nogil;
    std::unique_lock<std::shared_mutex> l(mu_);
    server_.reset();
  }

 private:
  const GatewayServer& server() const {
    if (!server_) throw std::runtime_error("gateway server is closed");
    return *server_;
  }
  mutable std::shared_mutex mu_;  // close() against the metrics thread's stats calls
  std::unique_ptr<GatewayServer> server_;
};

}  // namespace
}  // namespace adp

PYBIND11_MODULE(_native, m) {
  using namespace adp;
  m.doc() = "lmcache-adp native core: card store and LMCache connector harness";
  m.attr("FORMAT_VERSION") = kFormatVersion;
  m.attr("SOURCE_DIGEST") = kSourceDigestRecord + sizeof kSourceDigestMarker - 1;
  m.attr("MAX_KEY_BYTES") = kMaxKeyBytes;
  m.def(
      "crc32c",
      [](const py::buffer& b, uint32_t crc) {
        py::buffer_info info = b.request();
        return crc32c_extend(crc, info.ptr, static_cast<size_t>(info.size * info.itemsize));
      },
      py::arg("data"), py::arg("crc") = 0, "CRC32C (Castagnoli) of data, continuing from crc (0 to start).");
  m.def("crc32c_implementation", &crc32c_implementation,
        "Which CRC32C code runs on this CPU (a hardware one, or \"bitwise\").");
  m.def("known_test_hooks", &known_test_hooks,
        "The names of every ADP_TEST_* test hook the gateway and the connector read (docs/testing.md); any other "
        "ADP_TEST_ name in the environment does nothing and is logged at WARNING once per process.");
  m.def(
      "format_card",
      [](const std::string& path, uint64_t create_bytes, uint64_t region_bytes, bool preallocate) {
        Status s;
        {
          py::gil_scoped_release nogil;
          s = CardStore::Format(path, create_bytes, region_bytes, preallocate);
        }
        if (!s.ok()) raise(s);
      },
      py::arg("path"), py::arg("create_bytes") = 0, py::arg("region_bytes") = 0, py::arg("preallocate") = false,
      "Writes a new superblock on path (creating an image of create_bytes if it does not exist: sparse, "
      "its blocks allocated with preallocate=True, except on tmpfs): every object on the card becomes unreadable. "
      "region_bytes "
      "0 picks the default. Raises RuntimeError on failure.");

  m.def(
      "card_image_space",
      [](const std::string& path) -> py::object {
        CardSpace s;
        bool known;
        {
          py::gil_scoped_release nogil;
          known = look_at_card_space(path, 0, &s, false);
        }
        if (!known) return py::none();
        return py::make_tuple(s.size, s.allocated, s.free);
      },
      py::arg("path"),
      "(size, allocated, free) bytes of the card image file at path: its size, what its filesystem allocated to it "
      "(st_blocks x 512; less than its size while it is sparse) and that filesystem's free bytes (f_bavail x "
      "f_frsize; a symlink is followed). None for a block device or a path that cannot be looked at.");
  m.def(
      "card_space_warning",
      [](const std::string& path) -> py::object {
        std::string w;
        {
          py::gil_scoped_release nogil;
          w = card_space_warning(path);
        }
        if (w.empty()) return py::none();
        return peer_text(w);  // names other card images of its directory: whatever bytes they have
      },
      py::arg("path"),
      "The WARNING for an existing card image whose filesystem cannot hold what it can still grow by (its size less "
      "its allocated bytes), alone or with the other card images in its directory; None when it fits, for a block "
      "device, or a path that cannot be looked at (docs/card_format.md, \"Free space\").");

  py::class_<NativeConnector>(m, "NativeConnector")
      .def(py::init<const py::dict&>(),
           "config: ConnectorConfig.to_native() (backend, card or gateway, workers, timeout_ms, ...).")
      .def(py::init<>(),
           "An empty connector (cannot raise): start(config) builds it; until then each method raises "
           "RuntimeError (\"this connector failed to start: ...\") and close() does nothing.")
      .def("_start", &NativeConnector::start, py::arg("config"),
           "Opens the card or the gateway's client from config (ConnectorConfig.to_native()); raises as the "
           "constructor does, and the methods then raise with its message.")
      .def("_start_failed", &NativeConnector::start_failed, py::arg("why"),
           "Records why an empty connector was not started (a parameter refused before _start): its methods "
           "say so.")
      .def("_started", &NativeConnector::started, "Whether the card or the gateway's client was built.")
      .def("event_fd", &NativeConnector::event_fd,
           "An eventfd that becomes readable when completions are ready to drain.")
      .def(
          "submit_batch_get",
          [](NativeConnector& c, const py::list& k, const py::list& b) {
            return c.submit_with_buffers(OpType::kGet, k, b);
          },
          "Loads each key into its writable buffer (sized to the object); returns the future id. A missed key leaves "
          "its buffer untouched.")
      .def(
          "submit_batch_set",
          [](NativeConnector& c, const py::list& k, const py::list& b) {
            return c.submit_with_buffers(OpType::kSet, k, b);
          },
          "Stores each buffer under its key; returns the future id. The buffers must stay valid and unchanged until "
          "the future completes.")
      .def(
          "submit_batch_exists",
          [](NativeConnector& c, const py::list& k) { return c.submit_keys(OpType::kExists, k); },
          "Looks the keys up; returns the future id (per-key result: present; a lookup that could not be answered "
          "fails the future).")
      .def(
          "submit_batch_delete",
          [](NativeConnector& c, const py::list& k) { return c.submit_keys(OpType::kDelete, k); },
          "Deletes the keys; returns the future id (per-key result: not on the card any more; a failed delete "
          "is false and fails the future).")
      .def("drain_completions", &NativeConnector::drain_completions,
           "Completed futures since the last call: (future id, ok, error, per-key results).")
      .def("close", &NativeConnector::close,
           "Fails what is still pending (\"connector closed\"), stops the workers, closes the backend.")
      .def("stats", &NativeConnector::stats,
           "The backend's counters (objects, bytes, hits, misses, evictions, errors, ...).")
      .def("describe", &NativeConnector::describe, "One line naming the backend (embedded card path or gateway URL).");

  // The protocol's constants (src_cpp/protocol/frame.h), the one source for
  // lmcache_adp.gateway_stats, lmcache_adp.config and tests/gateway/wire.py.
  m.attr("PROTOCOL_VERSION") = proto::kProtocolVersion;
  m.attr("FRAME_MAGIC") = proto::kFrameMagic;
  m.attr("FRAME_HEADER_BYTES") = proto::kFrameHeaderBytes;
  m.attr("FRAME_TYPES") = py::dict(py::arg("HELLO") = static_cast<int>(proto::FrameType::kHello),
                                   py::arg("HELLO_OK") = static_cast<int>(proto::FrameType::kHelloOk),
                                   py::arg("BATCH") = static_cast<int>(proto::FrameType::kBatch),
                                   py::arg("BATCH_REPLY") = static_cast<int>(proto::FrameType::kBatchReply),
                                   py::arg("ERROR") = static_cast<int>(proto::FrameType::kError),
                                   py::arg("STATS") = static_cast<int>(proto::FrameType::kStats),
                                   py::arg("STATS_REPLY") = static_cast<int>(proto::FrameType::kStatsReply),
                                   py::arg("REGISTER_SEGMENT") = static_cast<int>(proto::FrameType::kRegisterSegment),
                                   py::arg("SEGMENT_OK") = static_cast<int>(proto::FrameType::kSegmentOk),
                                   py::arg("REGISTER_PROCESS") = static_cast<int>(proto::FrameType::kRegisterProcess),
                                   py::arg("PROCESS_OK") = static_cast<int>(proto::FrameType::kProcessOk),
                                   py::arg("ALIVE") = static_cast<int>(proto::FrameType::kAlive));
  m.attr("OPS") =
      py::dict(py::arg("PUT") = static_cast<int>(proto::Op::kPut), py::arg("GET") = static_cast<int>(proto::Op::kGet),
               py::arg("EXISTS") = static_cast<int>(proto::Op::kExists),
               py::arg("DELETE") = static_cast<int>(proto::Op::kDelete));
  m.attr("FEATURE_RING") = proto::kFeatureRing;
  m.attr("FEATURE_SEGMENTS") = proto::kFeatureSegments;
  m.attr("FEATURE_RING_PROGRESS") = proto::kFeatureRingProgress;
  m.attr("FEATURE_PROCESS_LOADS") = proto::kFeatureProcessLoads;
  m.attr("FEATURE_PROCESS_STORES") = proto::kFeatureProcessStores;
  m.attr("FEATURE_STORE_LIMIT") = proto::kFeatureStoreLimit;
  m.attr("FEATURE_ALIVE") = proto::kFeatureAlive;
  m.attr("FEATURE_ERROR_CLASS") = proto::kFeatureErrorClass;
  m.attr("FEATURE_STATUS_QUERY") = proto::kFeatureStatusQuery;
  m.attr("PROCESS_SEGMENT") = proto::kProcessSegment;
  m.attr("MAX_SEGMENTS") = proto::kMaxSegments;
  m.attr("SEGMENT_RETRY_LATER") = proto::kSegmentRetryLater;  // r19: a registration refused for now
  m.attr("MAX_BATCH_KEYS") = proto::kMaxBatchKeys;
  m.attr("MAX_TOKEN_BYTES") = proto::kMaxTokenBytes;
  m.attr("MAX_NAME_BYTES") = proto::kMaxNameBytes;
  m.attr("MAX_MESSAGE_BYTES") = proto::kMaxMessageBytes;
  m.attr("MAX_STATS_BYTES") = proto::kMaxStatsBytes;
  m.attr("MAX_INLINE_PAYLOAD_BYTES") = proto::kMaxInlinePayloadBytes;
  m.attr("MIN_RING_BYTES") = proto::kMinRingBytes;
  m.attr("MAX_RING_BYTES") = proto::kMaxRingBytes;
  m.attr("MAX_FRAME_BODY_BYTES") = proto::kMaxFrameBodyBytes;
  m.attr("MAX_HELLO_BODY_BYTES") = proto::kMaxHelloBodyBytes;
  // GatewayServer's ranges (kGatewayOptionRanges): what `lmcache-adp gateway` checks and states in --help.
  py::dict ranges;
  for (const GatewayOptionRange& r : kGatewayOptionRanges) ranges[r.name] = py::make_tuple(r.min, r.max);
  m.attr("GATEWAY_OPTION_RANGES") = ranges;
  m.def(
      "_peer_text", [](const py::bytes& b) { return peer_text(std::string_view(b)); },
      "Tests only: bytes decoded as the bindings hand a peer's or the card's text to Python (UTF-8, "
      "errors=\"replace\").");
  m.def(
      "parse_frame",
      [](const py::bytes& frame) {
        std::string_view v = frame;
        Status s = proto::parse_frame({reinterpret_cast<const uint8_t*>(v.data()), v.size()});
        if (!s.ok()) raise(s);  // as every other text (peer_text: errors="replace"), not pybind's strict decode
      },
      "Checks one whole protocol frame as the gateway would; ValueError says why it is refused.");

  // Built once, with the ranges from kGatewayOptionRanges (static: pybind keeps the pointer's text).
  static const std::string gateway_init_doc =
      "Opens the card (a new image of card_size_bytes: sparse, or its blocks allocated with card_preallocate, "
      "except on tmpfs) and listens on socket_path (and listen, tcp://HOST:PORT, with token); the max_* bounds "
      "default to GatewayOptions'. process_write_threads: helpers writing process loads' pieces (-1: one per "
      "usable CPU, 0: none). max_pipelined_stores: large process stores pipelined at once (-1: io_contexts / 2, "
      "rounded down; 0: none). request_spin_us: how long a connection looks for the next request after a put or "
      "get before it sleeps, while CPUs are spare (0: never). segment_prefault: populate registered segments' "
      "written pages in the background (False: each load populates its own). max_segment_total_bytes: the client "
      "segments mapped together (address space; a registration past it is refused for now, protocol r19). " +
      gateway_ranges_text();
  py::class_<PyGatewayServer>(m, "GatewayServer")
      .def(
          py::init([](const std::string& card, uint64_t card_size_bytes, const std::string& socket_path,
                      const std::string& listen, const std::string& token, int io_contexts, bool durable,
                      int max_clients, int max_tcp_clients, int max_handshakes, int handshake_timeout_ms,
                      int idle_timeout_ms, uint64_t max_ring_bytes, uint64_t max_ring_total_bytes,
                      uint64_t max_store_buffer_bytes, int process_write_threads, uint64_t max_store_buffer_total_bytes,
                      uint32_t max_request_timeout_ms, int max_pipelined_stores, int request_spin_us,
                      bool segment_prefault, bool card_preallocate, uint64_t max_segment_total_bytes) {
            GatewayOptions o;
            o.card.path = card;
            o.card.create_bytes = card_size_bytes;
            o.card.create_preallocated = card_preallocate;
            o.card.durable = durable;
            o.socket_path = socket_path;
            o.tcp_listen = listen;
            o.token = token;
            o.io_contexts = io_contexts;
            o.card.io_depth = io_contexts;
            o.max_clients = max_clients;
            o.max_tcp_clients = max_tcp_clients;
            o.max_handshakes = max_handshakes;
            o.handshake_timeout_ms = handshake_timeout_ms;
            o.idle_timeout_ms = idle_timeout_ms;
            o.max_ring_bytes = max_ring_bytes;
            o.max_ring_total_bytes = max_ring_total_bytes;
            o.max_store_buffer_bytes = max_store_buffer_bytes;
            o.max_store_buffer_total_bytes = max_store_buffer_total_bytes;
            o.process_write_threads = process_write_threads;
            o.max_request_timeout_ms = max_request_timeout_ms;
            o.max_pipelined_stores = max_pipelined_stores;
            o.request_spin_us = request_spin_us;
            o.segment_prefault = segment_prefault;
            o.max_segment_total_bytes = max_segment_total_bytes;
            return std::make_unique<PyGatewayServer>(o);
          }),
          py::arg("card"), py::arg("card_size_bytes"), py::arg("socket_path"), py::arg("listen") = "",
          py::arg("token") = "", py::arg("io_contexts") = 4, py::arg("durable") = true,
          py::arg("max_clients") = GatewayOptions{}.max_clients,
          py::arg("max_tcp_clients") = GatewayOptions{}.max_tcp_clients,
          py::arg("max_handshakes") = GatewayOptions{}.max_handshakes,
          py::arg("handshake_timeout_ms") = GatewayOptions{}.handshake_timeout_ms,
          py::arg("idle_timeout_ms") = GatewayOptions{}.idle_timeout_ms,
          py::arg("max_ring_bytes") = GatewayOptions{}.max_ring_bytes,
          py::arg("max_ring_total_bytes") = GatewayOptions{}.max_ring_total_bytes,
          py::arg("max_store_buffer_bytes") = GatewayOptions{}.max_store_buffer_bytes,
          py::arg("process_write_threads") = GatewayOptions{}.process_write_threads,
          py::arg("max_store_buffer_total_bytes") = GatewayOptions{}.max_store_buffer_total_bytes,
          py::arg("max_request_timeout_ms") = GatewayOptions{}.max_request_timeout_ms,
          py::arg("max_pipelined_stores") = GatewayOptions{}.max_pipelined_stores,
          py::arg("request_spin_us") = GatewayOptions{}.request_spin_us,
          py::arg("segment_prefault") = GatewayOptions{}.segment_prefault, py::arg("card_preallocate") = false,
          py::arg("max_segment_total_bytes") = GatewayOptions{}.max_segment_total_bytes, gateway_init_doc.c_str())
      .def("stop", &PyGatewayServer::stop, "Stops accepting and closes every connection (returns at once).")
      .def("wait", &PyGatewayServer::wait, py::arg("timeout_s"),
           "Waits for the server to stop; True if it did within timeout_s.")
      .def("close", &PyGatewayServer::close, "Stops the server and closes the card.")
      .def("stats", &PyGatewayServer::stats, "The gateway's counters and its card's.")
      .def("stats_json", &PyGatewayServer::stats_json, "stats() as one JSON object (what a Stats frame answers).")
      .def_property_readonly("tcp_port", &PyGatewayServer::tcp_port,
                             "The TCP port listened on (0 without TCP); useful with port 0.")
      .def_property_readonly("clients", &PyGatewayServer::clients, "Connected clients now.");

  py::class_<PyCardStore>(m, "CardStore")
      .def(py::init<const std::string&, uint64_t, bool, uint64_t, bool, bool, bool, bool>(), py::arg("path"),
           py::arg("create_bytes") = 0, py::arg("durable") = true, py::arg("region_bytes") = 0,
           py::arg("format_blank") = true, py::arg("read_only") = false, py::arg("preallocate") = false,
           py::arg("restore_block_zero") = false,
           "Opens (recovers) the card at path; an image of create_bytes is created (sparse; its blocks allocated "
           "with preallocate=True, except on tmpfs) and formatted if it does not exist, "
           "and a blank card (block 0 all zeros) is formatted unless format_blank is False (then: RuntimeError, "
           "nothing written). read_only: opened O_RDONLY (still locked), nothing created, formatted or written; "
           "put, remove and verify(repair=True) raise ValueError. restore_block_zero (verify --repair only): a block 0 "
           "of readable bytes that are not a superblock, with a valid backup superblock, is rewritten from the backup "
           "(else: ValueError, nothing written). Raises RuntimeError.")
      .def("put", &PyCardStore::put, "Stores data under key (replacing an older copy); True, or RuntimeError.")
      .def("get", &PyCardStore::get, "The object's bytes, checked against its CRC; None for a miss or a failed check.")
      .def("exists", &PyCardStore::exists, "Whether key is in the index.")
      .def("remove", &PyCardStore::remove,
           "Deletes key on the card and from the index; False if it was not there, raises if the delete failed.")
      .def("stats", &PyCardStore::stats,
           "Counters and sizes (objects, used_bytes, capacity_bytes, regions, failures, ...).")
      .def("verify", &PyCardStore::verify, py::arg("repair") = false, py::arg("progress") = py::none(),
           "Reads every object and checks its CRC; repair=True drops the bad ones (ValueError on a read-only card). "
           "progress(done, total) is called now and then.")
      .def_property_readonly("max_object_bytes", &PyCardStore::max_object_bytes,
                             "The largest object this card holds (one region minus its header room).")
      .def_property_readonly("superblock_rewrite_error", &PyCardStore::superblock_rewrite_error,
                             "What failed where when this open rewrote a bad copy of the superblock (\"writing its "
                             "backup superblock (4096 bytes at offset 1044480) failed: ...\"); \"\" where none "
                             "failed.")
      .def("close", &PyCardStore::close, "Closes the card; the store is unusable afterwards.");
}
