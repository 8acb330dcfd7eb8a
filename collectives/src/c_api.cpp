// The C ABI of c_api.h (engine functions live in c_api_engine.cpp): argument checks, then the runtime.
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "bootstrap/rendezvous.h"
#include "error.h"
#include "hpcdl/c_api.h"
#include "kernels/reduce.h"
#include "overlap.h"
#include "runtime.h"

using namespace hpcdl;

namespace hpcdl {

namespace {
thread_local std::string t_last_error;
}

int set_error(const Status& status) {
  if (status.is_ok()) {
    if (!t_last_error.empty()) t_last_error.clear();
  } else {
    t_last_error = status.message;
  }
  return status.code;
}

int set_error(int code, const std::string& message) {
  t_last_error = message;
  return code;
}

}  // namespace hpcdl

namespace {

const char* const kNotInit = "hpcdl is not initialised: call hpcdl.init() (or hvd.init()) first";

Runtime* need_runtime(int* code) {
  Runtime* rt = current_runtime();
  if (!rt) *code = set_error(HPCDL_ERR_NOT_INITIALIZED, kNotInit);
  return rt;
}

// Looks a process set up for the hpcdl_process_set_* queries; on failure sets the error and returns false.
bool find_process_set(int process_set, ProcessSet* set) {
  int code = HPCDL_OK;
  Runtime* rt = need_runtime(&code);
  if (!rt) return false;
  if (!rt->process_set(process_set, set)) {
    set_error(HPCDL_ERR_INVALID, "no process set with id " + std::to_string(process_set));
    return false;
  }
  set_error(HPCDL_OK, "");
  return true;
}

// Resolves the direct-channel communicator of a process set, or sets the error.
Comm* direct_comm(Runtime* rt, int process_set, const char* op, int* code) {
  Comm* c = rt->find_comm(process_set, Channel::kDirect);
  if (c) return c;
  ProcessSet set;
  if (!rt->process_set(process_set, &set))
    *code = set_error(HPCDL_ERR_INVALID, std::string(op) + ": no process set with id " + std::to_string(process_set) +
                                             " (add it with add_process_set first)");
  else
    *code = set_error(HPCDL_ERR_INVALID, std::string(op) + ": rank " + std::to_string(rt->rank()) +
                                             " is not a member of process set " + std::to_string(process_set));
  return nullptr;
}

int check_dtype(int dtype, const char* op) {
  if (valid_dtype(dtype)) return HPCDL_OK;
  return set_error(HPCDL_ERR_INVALID, std::string(op) + ": unknown dtype " + std::to_string(dtype));
}

int check_reduce(int dtype, int reduce_op, const char* op) {
  if (!valid_reduce_op(reduce_op))
    return set_error(HPCDL_ERR_INVALID, std::string(op) + ": unknown reduce op " + std::to_string(reduce_op));
  if (dtype == HPCDL_BOOL && reduce_op == HPCDL_AVERAGE)
    return set_error(HPCDL_ERR_INVALID, std::string(op) + ": AVERAGE is not defined for bool; use SUM (or) or MIN (and)");
  return HPCDL_OK;
}

// "allreduce (direct, process set 0)": built once per op and set, since small collectives take microseconds.
const std::string& label(const char* op, int process_set) {
  thread_local std::map<std::pair<const char*, int>, std::string> cache;
  auto key = std::make_pair(op, process_set);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  return cache[key] = std::string(op) + " (direct, process set " + std::to_string(process_set) + ")";
}

bool counts_ok(const int64_t* counts, int n) {
  if (!counts) return false;
  for (int i = 0; i < n; ++i)
    if (counts[i] < 0) return false;
  return true;
}

}  // namespace

extern "C" {

const char* hpcdl_last_error(void) { return t_last_error.c_str(); }

int hpcdl_init(const char* options) {
  return set_error(Runtime::init(Options::parse(options)));
}

int hpcdl_shutdown(void) { return set_error(Runtime::shutdown()); }

int hpcdl_is_initialized(void) { return current_runtime() != nullptr; }

#define HPCDL_TOPOLOGY(fn, expr)   \
  int fn(void) {                   \
    Runtime* rt = current_runtime(); \
    if (!rt) {                     \
      set_error(HPCDL_ERR_NOT_INITIALIZED, kNotInit); \
      return -1;                   \
    }                              \
    return expr;                   \
  }
HPCDL_TOPOLOGY(hpcdl_rank, rt->rank())
HPCDL_TOPOLOGY(hpcdl_size, rt->size())
HPCDL_TOPOLOGY(hpcdl_local_rank, rt->local_rank())
HPCDL_TOPOLOGY(hpcdl_local_size, rt->local_size())
HPCDL_TOPOLOGY(hpcdl_cross_rank, rt->cross_rank())
HPCDL_TOPOLOGY(hpcdl_cross_size, rt->cross_size())
HPCDL_TOPOLOGY(hpcdl_is_homogeneous, rt->homogeneous() ? 1 : 0)
HPCDL_TOPOLOGY(hpcdl_mpi_threads_supported, rt->mpi_threads_supported() ? 1 : 0)

int hpcdl_mpi_enabled(void) {
  Runtime* rt = current_runtime();
  if (rt) return rt->mpi_enabled() ? 1 : 0;
  return HPCDL_MPI_SHIMS[0] != '\0' ? 1 : 0;  // before init: whether this build can use an MPI at all
}

const char* hpcdl_transport_name(int local) {
  static thread_local std::string name;
  Runtime* rt = current_runtime();
  if (!rt) {
    set_error(HPCDL_ERR_NOT_INITIALIZED, kNotInit);
    return "";
  }
  name = rt->transport_name(local != 0);
  return name.c_str();
}

const char* hpcdl_tcp_congestion(void) {
  static thread_local std::string name;
  Runtime* rt = current_runtime();
  if (!rt) {
    set_error(HPCDL_ERR_NOT_INITIALIZED, kNotInit);
    return "";
  }
  name = rt->tcp_congestion();
  return name.c_str();
}

// ---- rendezvous server ---------------------------------------------------------------------------
// A server's handle is its address: the caller owns the server from start to stop, as with a FILE*, so
// the library keeps no registry of servers.
namespace {
RendezvousServer* server_of(int64_t handle) {
  if (handle <= 0) {
    set_error(HPCDL_ERR_INVALID, "not a rendezvous server handle: " + std::to_string(handle));
    return nullptr;
  }
  return reinterpret_cast<RendezvousServer*>(static_cast<intptr_t>(handle));
}
}  // namespace

int64_t hpcdl_rendezvous_server_start(const char* host, int port, const char* secret, int size) {
  std::unique_ptr<RendezvousServer> server(new RendezvousServer());
  Status st = server->start(host ? host : "0.0.0.0", {port}, secret ? secret : "", size);
  if (!st.is_ok()) return -int64_t(set_error(st));
  return static_cast<int64_t>(reinterpret_cast<intptr_t>(server.release()));
}

int hpcdl_rendezvous_server_port(int64_t handle) {
  RendezvousServer* server = server_of(handle);
  return server ? server->port() : -HPCDL_ERR_INVALID;
}

int hpcdl_rendezvous_server_arrived(int64_t handle, int32_t* ranks, int capacity) {
  RendezvousServer* server = server_of(handle);
  if (!server) return -HPCDL_ERR_INVALID;
  std::vector<int> arrived = server->arrived();
  int n = 0;
  for (int r : arrived) {
    if (n >= capacity) break;
    ranks[n++] = r;
  }
  return int(arrived.size()) < capacity ? int(arrived.size()) : n;
}

int hpcdl_rendezvous_server_stop(int64_t handle) {
  std::unique_ptr<RendezvousServer> server(server_of(handle));
  if (!server) return HPCDL_ERR_INVALID;
  server->stop();
  return HPCDL_OK;
}

// ---- object payloads ----------------------------------------------------------------------------------
int hpcdl_object_key(uint8_t* key) {
  int code = HPCDL_OK;
  Runtime* rt = need_runtime(&code);
  if (!rt) return code;
  if (!key) return set_error(HPCDL_ERR_INVALID, "object_key: no buffer for the key");
  std::memcpy(key, rt->object_key().data(), rt->object_key().size());
  return set_error(HPCDL_OK, "");
}

int64_t hpcdl_object_sequence(int process_set, const char* name) {
  int code = HPCDL_OK;
  Runtime* rt = need_runtime(&code);
  if (!rt) return -int64_t(code);
  set_error(HPCDL_OK, "");
  return rt->next_object_sequence(process_set, name ? name : "");
}

// ---- direct collectives -------------------------------------------------------------------------
int hpcdl_allreduce(const void* send, void* recv, int64_t count, int dtype, int op, double prescale,
                    double postscale, int process_set) {
  int code = HPCDL_OK;
  Runtime* rt = need_runtime(&code);
  if (!rt) return code;
  if ((code = check_dtype(dtype, "allreduce")) || (code = check_reduce(dtype, op, "allreduce"))) return code;
  if (count < 0 || (count > 0 && (!send || !recv)))
    return set_error(HPCDL_ERR_INVALID, "allreduce: count must be >= 0 with non-null buffers");
  const size_t bytes = size_t(count) * dtype_bytes(dtype);
  Status apart = check_overlap("allreduce", send, bytes, recv, bytes, recv);
  if (!apart.is_ok()) return set_error(apart);
  Comm* c = direct_comm(rt, process_set, "allreduce", &code);
  if (!c) return code;
  std::lock_guard<std::mutex> lock(rt->direct_mutex());
  return set_error(c->allreduce(send, recv, count, dtype, op, prescale, postscale, rt->deadline(),
                                label("allreduce", process_set)));
}

int hpcdl_allgather(const void* send, int64_t count, void* recv, const int64_t* recv_counts, int dtype,
                    int process_set) {
  int code = HPCDL_OK;
  Runtime* rt = need_runtime(&code);
  if (!rt) return code;
  if ((code = check_dtype(dtype, "allgather"))) return code;
  Comm* c = direct_comm(rt, process_set, "allgather", &code);
  if (!c) return code;
  std::vector<int64_t> counts(size_t(c->size()), count);
  if (recv_counts) counts.assign(recv_counts, recv_counts + c->size());
  if (count < 0 || !counts_ok(counts.data(), c->size()) || counts[size_t(c->rank())] != count)
    return set_error(HPCDL_ERR_INVALID, "allgather: counts must be >= 0 and recv_counts[my rank] must equal count");
  const size_t es = dtype_bytes(dtype);
  size_t before = 0, total = 0;
  for (int q = 0; q < c->size(); ++q) {
    if (q < c->rank()) before += size_t(counts[size_t(q)]) * es;
    total += size_t(counts[size_t(q)]) * es;
  }
  Status apart = check_overlap("allgather", send, size_t(count) * es, recv, total, static_cast<char*>(recv) + before);
  if (!apart.is_ok()) return set_error(apart);
  std::lock_guard<std::mutex> lock(rt->direct_mutex());
  return set_error(c->allgatherv(send, recv, counts, dtype, rt->deadline(), label("allgather", process_set)));
}

int hpcdl_broadcast(void* buf, int64_t count, int dtype, int root, int process_set) {
  int code = HPCDL_OK;
  Runtime* rt = need_runtime(&code);
  if (!rt) return code;
  if ((code = check_dtype(dtype, "broadcast"))) return code;
  Comm* c = direct_comm(rt, process_set, "broadcast", &code);
  if (!c) return code;
  if (root < 0 || root >= c->size())
    return set_error(HPCDL_ERR_INVALID, "broadcast: root " + std::to_string(root) + " is not a rank of process set " +
                                            std::to_string(process_set) + " (size " + std::to_string(c->size()) + ")");
  if (count < 0) return set_error(HPCDL_ERR_INVALID, "broadcast: count must be >= 0");
  std::lock_guard<std::mutex> lock(rt->direct_mutex());
  return set_error(c->broadcast(buf, count, dtype, root, rt->deadline(), label("broadcast", process_set)));
}

int hpcdl_alltoall(const void* send, const int64_t* send_counts, void* recv, const int64_t* recv_counts, int dtype,
                   int process_set) {
  int code = HPCDL_OK;
  Runtime* rt = need_runtime(&code);
  if (!rt) return code;
  if ((code = check_dtype(dtype, "alltoall"))) return code;
  Comm* c = direct_comm(rt, process_set, "alltoall", &code);
  if (!c) return code;
  if (!counts_ok(send_counts, c->size()) || !counts_ok(recv_counts, c->size()))
    return set_error(HPCDL_ERR_INVALID, "alltoall: send_counts and recv_counts need one count >= 0 per rank");
  std::vector<int64_t> sc(send_counts, send_counts + c->size()), rc(recv_counts, recv_counts + c->size());
  int64_t sent = 0, received = 0;
  for (int q = 0; q < c->size(); ++q) sent += sc[size_t(q)], received += rc[size_t(q)];
  const size_t es = dtype_bytes(dtype);
  Status apart = check_overlap("alltoall", send, size_t(sent) * es, recv, size_t(received) * es, nullptr);
  if (!apart.is_ok()) return set_error(apart);
  std::lock_guard<std::mutex> lock(rt->direct_mutex());
  return set_error(c->alltoallv(send, sc, recv, rc, dtype, rt->deadline(), label("alltoall", process_set)));
}

int hpcdl_reducescatter(const void* send, void* recv, const int64_t* recv_counts, int dtype, int op,
                        double prescale, double postscale, int process_set) {
  int code = HPCDL_OK;
  Runtime* rt = need_runtime(&code);
  if (!rt) return code;
  if ((code = check_dtype(dtype, "reducescatter")) || (code = check_reduce(dtype, op, "reducescatter"))) return code;
  Comm* c = direct_comm(rt, process_set, "reducescatter", &code);
  if (!c) return code;
  if (!counts_ok(recv_counts, c->size()))
    return set_error(HPCDL_ERR_INVALID, "reducescatter: recv_counts needs one count >= 0 per rank");
  std::vector<int64_t> rc(recv_counts, recv_counts + c->size());
  int64_t total = 0;
  for (int64_t n : rc) total += n;
  const size_t es = dtype_bytes(dtype);
  const size_t mine = size_t(rc[size_t(c->rank())]) * es;
  Status apart = check_overlap("reducescatter", send, size_t(total) * es, recv, mine, recv);
  if (!apart.is_ok()) return set_error(apart);
  std::lock_guard<std::mutex> lock(rt->direct_mutex());
  return set_error(c->reducescatter(send, recv, rc, dtype, op, prescale, postscale, rt->deadline(),
                                    label("reducescatter", process_set)));
}

int hpcdl_barrier(int process_set) {
  int code = HPCDL_OK;
  Runtime* rt = need_runtime(&code);
  if (!rt) return code;
  Comm* c = direct_comm(rt, process_set, "barrier", &code);
  if (!c) return code;
  std::lock_guard<std::mutex> lock(rt->direct_mutex());
  return set_error(c->barrier(rt->deadline(), label("barrier", process_set)));
}

// ---- process sets --------------------------------------------------------------------------------
int hpcdl_add_process_set(const int32_t* ranks, int n) {
  int code = HPCDL_OK;
  Runtime* rt = need_runtime(&code);
  if (!rt) return -code;
  if (!ranks || n <= 0) return -set_error(HPCDL_ERR_INVALID, "add_process_set: give at least one rank");
  int id = 0;
  Status st = rt->add_process_set(std::vector<int>(ranks, ranks + n), &id);
  if (!st.is_ok()) return -set_error(st);
  return id;
}

int hpcdl_remove_process_set(int process_set) {
  int code = HPCDL_OK;
  Runtime* rt = need_runtime(&code);
  if (!rt) return code;
  return set_error(rt->remove_process_set(process_set));
}

int hpcdl_process_set_rank(int process_set) {
  ProcessSet set;
  if (!find_process_set(process_set, &set)) return -1;
  return set.my_rank;
}

int hpcdl_process_set_size(int process_set) {
  ProcessSet set;
  if (!find_process_set(process_set, &set)) return -1;
  return int(set.ranks.size());
}

int hpcdl_process_set_ranks(int process_set, int32_t* ranks, int capacity) {
  ProcessSet set;
  if (!find_process_set(process_set, &set)) return -1;
  for (int i = 0; i < capacity && i < int(set.ranks.size()); ++i) ranks[i] = set.ranks[size_t(i)];
  return int(set.ranks.size());
}

int hpcdl_process_set_ids(int32_t* ids, int capacity) {
  int code = HPCDL_OK;
  Runtime* rt = need_runtime(&code);
  if (!rt) return -1;
  std::vector<int> all = rt->process_set_ids();
  for (int i = 0; i < capacity && i < int(all.size()); ++i) ids[i] = all[size_t(i)];
  return int(all.size());
}

}  // extern "C"
