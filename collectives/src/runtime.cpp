#include "runtime.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <sstream>
#include <stdexcept>

#include "bootstrap/rendezvous.h"
#include "crypto/sha256.h"
#include "engine/engine.h"
#include "net/endpoint.h"
#include "net/socket.h"
#include "transport/shm_comm.h"
#include "transport/tcp_comm.h"
#include "transport/hierarchical_comm.h"
#include "mpi/mpi_bootstrap.h"

namespace hpcdl {
namespace {

std::atomic<Runtime*> g_runtime{nullptr};
std::mutex g_lifecycle;

// The shared-memory chunk when HPCDL_SHM_CHUNK_BYTES does not set one: a quarter of a core's L2 cache, so that
// a chunk's input, its staged copies and its output stay in L2 while a rank reduces them (2 ranks, 2 MiB L2:
// 512 KiB chunks made 4-64 MiB allreduces 16-29 % faster than 2 MiB ones). Every rank of a host reads the
// same cache size, so they agree on the segment's layout.
size_t default_shm_chunk_bytes() {
  const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
  if (l2 <= 0) return size_t(512) << 10;
  return std::clamp(size_t(l2) / 4, size_t(256) << 10, size_t(2) << 20);
}

// How long a wait on TCP sockets polls them before it sleeps, when HPCDL_TCP_SPIN_US does not say (see
// SocketSpin): 30 us answered a 4-byte allreduce between two idle hosts in 9-10 us, 10 us in 16-33 us. Only
// where the host has a core to spare beyond its ranks: with as many ranks as cores (4 ranks on 2 hosts of
// the same 2 cores) polling made calls up to 64 KiB 5-15 % slower.
constexpr long long kDefaultTcpSpinUs = 30;

// The send buffer of a TCP data connection, when HPCDL_TCP_SEND_BUFFER_BYTES does not say (Linux doubles it
// for its bookkeeping). A sender that may run far ahead of its receiver fills the path with data that has
// left the caches by the time it is read: between two hosts, 256 KiB made 4-64 MiB allreduces 1.8-2.5x
// faster than 4 MiB did (and than the kernel's autotuning), and 192 KiB made 1-4 MiB ones another 2x faster
// than 256 KiB on a core with 1 MiB of L2 (1 MiB 190-210 against 420-580 us, 16-256 MiB the same or better;
// 128 KiB level with 192 KiB, 64 KiB slower: benchmarks/README.md). It bounds one connection to 384 KiB per
// round trip: 3.8 GB/s at 100 us, 19 GB/s at 20 us.
constexpr long long kDefaultTcpSendBufferBytes = 192 << 10;
// The congestion control of the job's connections. Linux's default, cubic, unless the user names another:
// where a system chose BBR, each connection is paced to its bandwidth estimate, which suits long flows
// across the internet; a job's connections carry bursts of a few megabytes between pauses, and between two
// hosts here BBR left 1 MiB allreduces at 480-570 us in five jobs of six, against 210-260 us in six of six
// with cubic, and one TCP stream at 2.5-3.3 against 5.9-6.1 GB/s (benchmarks/README.md).
constexpr const char* kDefaultTcpCongestion = "cubic";

std::string tcp_congestion_option(const Options& options) {
  return options.get("tcp_congestion", kDefaultTcpCongestion);
}

bool spare_core(int local_ranks) {
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return false;
  return CPU_COUNT(&allowed) > local_ranks;
}

// "29501,29502" -> {29501, 29502}; entries that are not ports are left out.
std::vector<int> parse_ports(const std::string& text) {
  std::vector<int> ports;
  std::istringstream in(text);
  for (std::string one; std::getline(in, one, ',');) {
    int port = std::atoi(one.c_str());
    if (port >= 0 && port < 65536 && !one.empty()) ports.push_back(port);
  }
  return ports;
}

Status random_secret(std::string* secret) {
  uint8_t raw[32];
  Status st = random_bytes(raw, sizeof(raw));
  if (!st.is_ok()) return st;
  static const char* hex = "0123456789abcdef";
  secret->clear();
  for (uint8_t b : raw) *secret += std::string{hex[b >> 4], hex[b & 15]};
  return Status::ok();
}

// Allreduces of at least this many bytes over `ranks` take the hierarchical path; 0: none (flat TCP).
// hierarchical=1 (HPCDL_HIERARCHICAL_ALLREDUCE) makes it every allreduce above the small-message size,
// hierarchical=0 none; unset (auto), those of at least kAutoHierarchicalBytes when the ranks span hosts and
// some host has several of them. On the namespace hosts of benchmarks/README.md (two hosts of two ranks on
// two cores) the two levels were 12-35 % faster than the flat ring at 1 MiB and 14-36 % at 2 MiB, level at
// 512 KiB and 64 KiB, where each of the path's shared-memory steps waits for a rank that shares
// its core; where every rank has a core of its own, hierarchical=1 is worth trying for smaller ones.
constexpr size_t kAutoHierarchicalBytes = 1 << 20;

size_t hierarchical_min_bytes(const Options& options, const std::vector<PeerInfo>& peers,
                              const std::vector<int>& ranks) {
  const std::string choice = options.get("hierarchical", "auto");
  const size_t above_small = size_t(options.get_int("small_message_bytes", 65536)) + 1;
  std::map<std::string, int> per_host;
  for (int r : ranks) ++per_host[peers[size_t(r)].host];
  if (per_host.size() < 2) return 0;
  if (choice != "auto" && !choice.empty()) return options.get_bool("hierarchical", true) ? above_small : 0;
  for (const auto& host : per_host)
    if (host.second > 1) return std::max(above_small, kAutoHierarchicalBytes);
  return 0;
}

std::vector<int> parse_ranks(const std::string& text) {
  std::vector<int> ranks;
  std::istringstream in(text);
  std::string r;
  while (std::getline(in, r, ','))
    if (!r.empty()) ranks.push_back(std::atoi(r.c_str()));
  return ranks;
}

std::vector<std::vector<int>> parse_process_sets(const std::string& text) {
  std::vector<std::vector<int>> sets;
  std::istringstream in(text);
  std::string one;
  while (std::getline(in, one, ';')) {
    std::vector<int> ranks = parse_ranks(one);
    if (!ranks.empty()) sets.push_back(ranks);
  }
  return sets;
}

// MPI_Finalize is a fence over every process of the MPI job: a rank that leaves while the others still
// compute waits in it until they finalize too, so mpirun saw a failed rank end only when the others did.
// The MPI that hpcdl started itself (bootstrap under mpirun) is therefore finalized when the process exits,
// and only when it exits with status 0: a failing process leaves at once without it, which mpirun takes as
// the job's failure, ending the other ranks. (MPI also stays up between shutdown() and a next init().) The
// exit hook is process-wide, as MPI is; it is registered once.
void finalize_mpi_at_exit() {
  static std::once_flag registered;
  std::call_once(registered, [] {
    on_exit([](int status, void*) {
      if (status == 0) mpi_finalize_if_initialized_here(true);
    }, nullptr);
  });
}

}  // namespace

Runtime* current_runtime() { return g_runtime.load(std::memory_order_acquire); }

Runtime::Runtime() = default;

Runtime::~Runtime() {
  if (engine_) engine_->stop();
  engine_.reset();
  {
    std::lock_guard<std::mutex> lock(sets_mutex_);
    sets_.clear();
  }
  world_boot_.reset();
  endpoint_.reset();
  rendezvous_.reset();
  if (mpi_initialized_here_) finalize_mpi_at_exit();
}

Deadline Runtime::deadline() const {
  return Clock::now() + std::chrono::microseconds(int64_t(timeout_s_ * 1e6));
}

Status Runtime::init(const Options& options) {
  std::lock_guard<std::mutex> lock(g_lifecycle);
  if (g_runtime.load())
    return Status::error(HPCDL_ERR_INVALID, "hpcdl is already initialised in this process; call shutdown() first");
  std::unique_ptr<Runtime> rt(new Runtime());
  Status st = rt->start(options);
  if (!st.is_ok()) return st;
  Runtime* raw = rt.release();
  g_runtime.store(raw, std::memory_order_release);
  raw->engine_.reset(new Engine(*raw));
  st = raw->engine_->start();
  if (!st.is_ok()) {
    g_runtime.store(nullptr);
    delete raw;
    return st;
  }
  return Status::ok();
}

Status Runtime::shutdown() {
  std::lock_guard<std::mutex> lock(g_lifecycle);
  Runtime* rt = g_runtime.load();
  if (!rt) return Status::ok();
  if (rt->engine_) rt->engine_->stop();
  g_runtime.store(nullptr, std::memory_order_release);
  delete rt;
  return Status::ok();
}

Status Runtime::start(const Options& options) {
  options_ = options;
  timeout_s_ = options.get_double("timeout_s", 60.0);
  if (!(timeout_s_ > 0)) return Status::error(HPCDL_ERR_INVALID, "timeout_s must be a positive number of seconds");
  transport_ = options.get("transport", "auto");
  if (transport_ != "auto" && transport_ != "shm" && transport_ != "tcp" && transport_ != "mpi")
    return Status::error(HPCDL_ERR_INVALID,
                         "transport='" + transport_ + "' is not one of auto, shm, tcp, mpi (HPCDL_TRANSPORT)");
  const std::string bootstrap = options.get("bootstrap", "tcp");
  std::string secret = options.get("secret");
  const Deadline deadline = this->deadline();

  int mpi_rank = -1, mpi_size = -1;
  if (bootstrap == "mpi" || transport_ == "mpi") {
    // The job's MPI library, chosen and loaded at run time by hpcdl.common (the init option mpi_shim).
    Status st = mpi_load(options.get("mpi_shim"));
    if (!st.is_ok())
      return Status::error(st.code, std::string(bootstrap == "mpi" ? "bootstrap" : "transport") + "=mpi: " + st.message);
    st = mpi_bootstrap_init(&mpi_initialized_here_, &mpi_threads_supported_, &mpi_rank, &mpi_size);
    if (!st.is_ok()) return st;
    mpi_enabled_ = true;
    if (bootstrap == "mpi") {
      if (options.has("rank") && (options.get_int("rank", -1) != mpi_rank || options.get_int("size", -1) != mpi_size))
        return Status::error(HPCDL_ERR_INVALID, "bootstrap=mpi: MPI says rank " + std::to_string(mpi_rank) + " of " +
                                                    std::to_string(mpi_size) + " but the environment says rank " +
                                                    options.get("rank") + " of " + options.get("size"));
      options_.set("rank", std::to_string(mpi_rank));
      options_.set("size", std::to_string(mpi_size));
    }
  }

  rank_ = int(options_.get_int("rank", -1));
  size_ = int(options_.get_int("size", -1));
  if (size_ < 1 || rank_ < 0 || rank_ >= size_)
    return Status::error(HPCDL_ERR_INVALID, "rank=" + options_.get("rank") + " size=" + options_.get("size") +
                                                " is not a valid rank/size pair (need 0 <= rank < size)");
  if (transport_ == "mpi" && (mpi_rank != rank_ || mpi_size != size_))
    return Status::error(HPCDL_ERR_INVALID,
                         "transport=mpi: MPI sees rank " + std::to_string(mpi_rank) + " of " +
                             std::to_string(mpi_size) + ", not rank " + std::to_string(rank_) + " of " +
                             std::to_string(size_) + "; the ranks must be started by the mpirun of the MPI hpcdl "
                             "loaded (see hpcdl check-build), or use transport=auto or tcp");
  std::string host = options_.get("host");
  if (host.empty()) return Status::error(HPCDL_ERR_INVALID, "the host identity (option 'host') is required");
  for (char c : host)
    if (c == '\t' || c == '\n') return Status::error(HPCDL_ERR_INVALID, "host identity may not contain tabs or newlines");

  std::string iface_addr;
  if (!options_.get("iface").empty()) {
    Status st = interface_address(options_.get("iface"), &iface_addr);
    if (!st.is_ok()) return st;
  }
  peers_.assign(size_t(size_), PeerInfo{0, host, "127.0.0.1", 0, int(getpid())});
  std::string nonce;
  if (size_ > 1) {
    Status st = meet(host, iface_addr, bootstrap, secret, deadline, &nonce);
    if (!st.is_ok()) return st;
  }

  if (options_.has("members")) {
    Status st = join_members(parse_ranks(options_.get("members")));
    if (!st.is_ok()) return st;
  }
  if (size_ > 1) {
    std::string job_ranks;
    for (const auto& peer : peers_) job_ranks += std::to_string(peer.rank) + ",";
    object_key_ = hmac_sha256(secret, "objects" + nonce + job_ranks);
  } else {
    Status st = random_bytes(object_key_.data(), object_key_.size());  // nothing travels; any key will do
    if (!st.is_ok()) return st;
  }

  // Topology: local = same host identity; cross = ranks with the same local rank. (Ranks are positions in
  // peers_; a PeerInfo's own rank field is the world rank it registered with, see join_members.)
  std::map<std::string, int> per_host;
  std::vector<int> local_rank_of(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) local_rank_of[size_t(r)] = per_host[peers_[size_t(r)].host]++;
  local_rank_ = local_rank_of[size_t(rank_)];
  local_size_ = per_host[host];
  cross_rank_ = 0;
  cross_size_ = 0;
  for (int r = 0; r < size_; ++r) {
    if (local_rank_of[size_t(r)] != local_rank_) continue;
    if (r < rank_) ++cross_rank_;
    ++cross_size_;
  }
  homogeneous_ = true;
  for (auto& entry : per_host) homogeneous_ = homogeneous_ && entry.second == local_size_;
  const bool spans = per_host.size() > 1;
  if (transport_ == "shm" && spans)
    return Status::error(HPCDL_ERR_INVALID, "transport=shm needs every rank on one host, but ranks span " +
                                                std::to_string(per_host.size()) + " hosts; use auto or tcp");
  std::vector<int> world(static_cast<size_t>(size_));
  for (int i = 0; i < size_; ++i) world[size_t(i)] = i;
  if (transport_ == "mpi") {
    local_transport_ = cross_transport_ = "mpi";
  } else {
    local_transport_ = size_ == 1 || local_size_ == 1 ? "self" : (transport_ == "tcp" || spans ? "tcp" : "shm");
    if (spans && transport_ != "tcp" && hierarchical_min_bytes(options_, peers_, world) > 0 && local_size_ > 1)
      local_transport_ = "shm";
    cross_transport_ = spans ? "tcp" : "self";
  }

  if (size_ > 1) {
    // Every communicator over TCP is a full mesh of two connections per pair: the world's boot mesh, one
    // per channel, and the leaders' of hierarchical allreduce.
    const size_t tcp_meshes = 1 + (cross_transport_ == "tcp" || local_transport_ == "tcp" ? 3 : 0);
    Status st = ensure_open_files(tcp_meshes * 2 * size_t(size_ - 1) + 6 * size_t(per_host.size()),
                                  "connections to the job's " + std::to_string(size_ - 1) + " other ranks");
    if (!st.is_ok()) return st;
    st = TcpComm::create(*endpoint_, peers_, world, rank_, "boot", TcpComm::Params{0}, deadline, &world_boot_);
    if (!st.is_ok()) return st;
  }
  Status st = build_process_set(0, world);
  if (!st.is_ok()) return st;
  for (const auto& ranks : parse_process_sets(options_.get("process_sets"))) {
    int id = 0;
    st = add_process_set(ranks, &id);
    if (!st.is_ok()) return st;
  }
  const std::string congestion = tcp_congestion_option(options_);
  if (local_rank_ == 0 && options_.has("tcp_congestion") && congestion != "system" && congestion != tcp_congestion_)
    std::fputs(("hpcdl: warning: TCP congestion control '" + congestion + "' (HPCDL_TCP_CONGESTION) is not "
                "available on " + peers_[size_t(rank_)].host + " (see /proc/sys/net/ipv4/tcp_allowed_congestion_"
                "control); its connections use '" + tcp_congestion_ + "'\n").c_str(), stderr);
  if (rank_ == 0 && spans && transport_ != "mpi" && options_.logs_info()) {  // what hpcdl run --verbose shows
    const size_t from = hierarchical_min_bytes(options_, peers_, world);
    const std::string line = "hpcdl: " + std::to_string(size_) + " ranks on " + std::to_string(per_host.size()) +
                             " hosts (" + (homogeneous_ ? std::to_string(local_size_) + " per host" : "unequal") +
                             "); allreduce across hosts: " +
                             (from > 0 ? "hierarchical from " + std::to_string(from) +
                                             " bytes (shared memory within a host, TCP between hosts), flat below"
                                       : std::string("flat (TCP between every pair of ranks)")) +
                             "; HPCDL_HIERARCHICAL_ALLREDUCE=" + options_.get("hierarchical", "auto") +
                             "; TCP congestion control " + tcp_congestion_ + "\n";
    std::fputs(line.c_str(), stderr);
  }
  return Status::ok();
}

// Meets the other ranks (size > 1): hosts the rendezvous when this is world rank 0 and was asked to (always
// under bootstrap=mpi), registers there and fills peers_. The address this rank is reached at is the one
// the rendezvous sees it connect from, unless HPCDL_IFACE pinned one (see bootstrap/rendezvous.h).
Status Runtime::meet(const std::string& host, const std::string& iface_addr, const std::string& bootstrap,
                     std::string& secret, Deadline deadline, std::string* nonce) {
  const std::string bind = iface_addr.empty() ? "0.0.0.0" : iface_addr;
  RendezvousTarget target;
  target.origin = options_.get("rendezvous_origin");
  if (!options_.get("rendezvous_addr").empty()) target.addrs.push_back(options_.get("rendezvous_addr"));
  target.ports = parse_ports(options_.get("rendezvous_ports", options_.get("rendezvous_port")));
  const std::string job = options_.get("rendezvous_job");
  if (bootstrap == "mpi") {
    target.ports = {0};
    if (secret.empty()) {
      Status st = random_secret(&secret);
      if (!st.is_ok()) return st;
    }
  }
  Status usable = check_job_secret(secret);  // before serving: every rank refuses alike
  if (!usable.is_ok()) return usable;
  if (rank_ == 0 && (options_.get_bool("rendezvous_serve", false) || bootstrap == "mpi")) {
    rendezvous_.reset(new RendezvousServer());
    Status st = rendezvous_->start(bind, target.ports, secret, size_, job, target.origin);
    if (!st.is_ok()) return Status::error(st.code, "rank 0 cannot host the rendezvous: " + st.message);
    target.ports = {rendezvous_->port()};  // rank 0 itself need not walk
    if (bootstrap == "mpi") target.addrs = iface_addr.empty() ? host_addresses() : std::vector<std::string>{iface_addr};
  }
  if (bootstrap == "mpi") {
    // Rank 0 tells the others every address of its host; each takes the first that is rank 0's rendezvous.
    std::string addrs;
    for (const auto& a : target.addrs) addrs += a + ",";
    std::string where = addrs + "\n" + std::to_string(target.ports[0]) + "\n" + secret;
    Status st = mpi_broadcast_string(&where, 0);
    if (!st.is_ok()) return st;
    std::istringstream in(where);
    std::string port_text;
    std::getline(in, addrs);
    std::getline(in, port_text);
    std::getline(in, secret);
    target.ports = parse_ports(port_text);
    std::istringstream addrs_in(addrs);
    target.addrs.clear();
    for (std::string a; std::getline(addrs_in, a, ',');) target.addrs.push_back(a);
    target.origin = "rank 0's host, announced over MPI";
  }
  if (target.addrs.empty() || target.ports.empty() || target.ports[0] <= 0)
    return Status::error(HPCDL_ERR_INVALID, "no rendezvous address: launch with 'hpcdl run', set MASTER_ADDR and "
                                            "MASTER_PORT, or use bootstrap=mpi under mpirun");
  endpoint_.reset(new Endpoint());
  const std::string congestion = tcp_congestion_option(options_);
  tcp_congestion_ = congestion_control_for(congestion);
  Status st = endpoint_->start(bind, secret, rank_, congestion);
  if (!st.is_ok()) return st;
  PeerInfo self{rank_, host, iface_addr, endpoint_->port(), int(getpid())};
  Meeting meeting;
  st = rendezvous_register(target, secret, job, size_, self, deadline, &meeting);
  if (!st.is_ok()) return st;
  peers_ = std::move(meeting.peers);
  *nonce = std::move(meeting.nonce);
  return Status::ok();
}

int64_t Runtime::next_object_sequence(int process_set, const std::string& name) {
  std::lock_guard<std::mutex> lock(object_mutex_);
  return ++object_sequences_[{process_set, name}];
}

// init(comm=[ranks]) (Horovod's hvd.init(comm=...)): after every rank the launcher started met at the
// rendezvous, this process keeps only the listed world ranks as its job, renumbered by their position in
// the list, so that the job's communicators, process sets, engine and shutdown involve them alone (the
// other ranks form jobs of their own lists). peers_ is reordered to the job's ranks; each PeerInfo keeps the
// world rank it registered with, which identifies it on data links (Endpoint).
Status Runtime::join_members(const std::vector<int>& members) {
  std::vector<int> sorted(members);
  std::sort(sorted.begin(), sorted.end());
  if (members.empty() || std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end() || sorted.front() < 0 ||
      sorted.back() >= size_)
    return Status::error(HPCDL_ERR_INVALID, "init(comm=[...]) needs distinct world ranks in [0, " +
                                                std::to_string(size_) + "), got [" + options_.get("members") + "]");
  auto me = std::find(members.begin(), members.end(), rank_);
  if (me == members.end())
    return Status::error(HPCDL_ERR_INVALID,
                         "init(comm=[" + options_.get("members") + "]): this process is world rank " +
                             std::to_string(rank_) + ", which is not in the list; every process passes the ranks "
                             "of the job it belongs to, its own included");
  if (transport_ == "mpi" && int(members.size()) != size_)
    return Status::error(HPCDL_ERR_UNSUPPORTED, "init(comm=[...]) with a subset of the ranks needs transport=auto "
                                                "or tcp, not mpi");
  std::vector<PeerInfo> job;
  for (int r : members) job.push_back(peers_[size_t(r)]);
  peers_ = std::move(job);
  rank_ = int(me - members.begin());
  size_ = int(members.size());
  return Status::ok();
}

Status Runtime::make_tcp_comm(const std::vector<int>& ranks, int my, const std::string& key, Deadline deadline,
                              std::shared_ptr<TcpComm>* out) {
  TcpComm::Params params;
  params.small_message_bytes = size_t(options_.get_int("small_message_bytes", 65536));
  const long long default_spin = spare_core(local_size_) ? kDefaultTcpSpinUs : 0;
  params.spin = std::chrono::microseconds(std::max<long long>(0, options_.get_int("tcp_spin_us", default_spin)));
  params.send_buffer_bytes = int(std::clamp<long long>(
      options_.get_int("tcp_send_buffer_bytes", kDefaultTcpSendBufferBytes), 0, std::numeric_limits<int>::max() / 2));
  return TcpComm::create(*endpoint_, peers_, ranks, my, key, params, deadline, out);
}

std::string Runtime::transport_name(bool local) const { return local ? local_transport_ : cross_transport_; }

Status Runtime::make_comm(const std::vector<int>& ranks, int set_id, Channel channel, std::shared_ptr<Comm>* out) {
  int my = int(std::find(ranks.begin(), ranks.end(), rank_) - ranks.begin());
  const Deadline deadline = this->deadline();
  const std::string key = "set" + std::to_string(set_id) + "/ch" + std::to_string(int(channel));
  if (transport_ == "mpi") return make_mpi_comm(ranks, my, out);
  bool one_host = true;
  for (int r : ranks) one_host = one_host && peers_[size_t(r)].host == peers_[size_t(rank_)].host;
  if (ranks.size() == 1 || transport_ == "tcp" || !one_host) {
    std::shared_ptr<TcpComm> tcp;
    Status st = make_tcp_comm(ranks, my, key, deadline, &tcp);
    if (!st.is_ok()) return st;
    const size_t hierarchical = hierarchical_min_bytes(options_, peers_, ranks);
    if (!one_host && transport_ != "tcp" && hierarchical > 0) {
      std::shared_ptr<Comm> hier;
      st = HierarchicalComm::create(*this, ranks, my, key, tcp, hierarchical, deadline, &hier);
      if (!st.is_ok()) return st;
      *out = hier;
      return Status::ok();
    }
    *out = tcp;
    return Status::ok();
  }
  std::shared_ptr<ShmComm> shm;
  Status st = make_shm_comm(ranks, my, key, channel, deadline, &shm);
  if (!st.is_ok()) return st;
  *out = shm;
  return Status::ok();
}

Status Runtime::make_shm_comm(const std::vector<int>& ranks, int my, const std::string& key, Channel channel,
                              Deadline deadline, std::shared_ptr<ShmComm>* out) {
  ShmParams params;
  params.small_message_bytes = size_t(options_.get_int("small_message_bytes", 65536));
  params.chunk_bytes = size_t(options_.get_int("shm_chunk_bytes", static_cast<long long>(default_shm_chunk_bytes())));
  if (!StagingStores::parse(options_.get("shm_stores", "auto").c_str(), &params.stores))
    return Status::error(HPCDL_ERR_INVALID, "shm_stores is '" + options_.get("shm_stores", "") +
                                                         "'; use auto, cached or streaming (HPCDL_SHM_STORES)");
  if (channel == Channel::kEngineControl) params.chunk_bytes = 64 << 10;
  std::vector<int> pids;
  for (int r : ranks) pids.push_back(peers_[size_t(r)].pid);
  TcpComm* boot = world_boot_.get();
  auto send = [boot, &deadline, &key](int to, const std::string& name) -> Status {
    uint32_t len = uint32_t(name.size());
    Status st = boot->sendrecv(to, &len, 4, -1, nullptr, 0, deadline, "sending shared memory name for " + key);
    if (st.is_ok()) st = boot->sendrecv(to, name.data(), len, -1, nullptr, 0, deadline, "sending shm name");
    return st;
  };
  auto recv = [boot, &deadline, &key](int from, std::string* name) -> Status {
    uint32_t len = 0;
    Status st = boot->sendrecv(-1, nullptr, 0, from, &len, 4, deadline, "receiving shared memory name for " + key);
    if (!st.is_ok()) return st;
    if (len > 255) return Status::error(HPCDL_ERR_INTERNAL, "bad shared memory name length");
    name->assign(len, '\0');
    return boot->sendrecv(-1, nullptr, 0, from, &(*name)[0], len, deadline, "receiving shm name");
  };
  return ShmComm::create(ranks, my, pids, params, key, deadline, send, recv, out);
}

Status Runtime::build_process_set(int id, const std::vector<int>& ranks) {
  ProcessSet set;
  set.id = id;
  set.ranks = ranks;
  auto it = std::find(ranks.begin(), ranks.end(), rank_);
  set.my_rank = it == ranks.end() ? -1 : int(it - ranks.begin());
  if (set.my_rank >= 0) {
    for (Channel ch : {Channel::kDirect, Channel::kEngineData, Channel::kEngineControl}) {
      Status st = make_comm(ranks, id, ch, &set.comms[int(ch)]);
      if (!st.is_ok()) return st;
    }
  }
  std::lock_guard<std::mutex> lock(sets_mutex_);
  sets_.push_back(std::move(set));
  return Status::ok();
}

Comm& Runtime::comm(int process_set, Channel channel) {
  Comm* c = find_comm(process_set, channel);
  if (!c) throw std::out_of_range("process set " + std::to_string(process_set) + " is unknown or excludes this rank");
  return *c;
}

Comm* Runtime::find_comm(int process_set, Channel channel) { return find_comm_shared(process_set, channel).get(); }

std::shared_ptr<Comm> Runtime::find_comm_shared(int process_set, Channel channel) {
  std::lock_guard<std::mutex> lock(sets_mutex_);
  for (auto& s : sets_)
    if (s.id == process_set) return s.comms[int(channel)];
  return nullptr;
}

std::vector<int> Runtime::process_set_ids() const {
  std::lock_guard<std::mutex> lock(sets_mutex_);
  std::vector<int> ids;
  for (auto& s : sets_) ids.push_back(s.id);
  return ids;
}

bool Runtime::process_set(int id, ProcessSet* out) const {
  std::lock_guard<std::mutex> lock(sets_mutex_);
  for (auto& s : sets_) {
    if (s.id != id) continue;
    out->id = s.id;
    out->ranks = s.ranks;
    out->my_rank = s.my_rank;
    for (int c = 0; c < 3; ++c) out->comms[c] = s.comms[c];
    return true;
  }
  return false;
}

Status Runtime::add_process_set(const std::vector<int>& ranks_in, int* id) {
  std::lock_guard<std::mutex> admin(admin_mutex_);
  std::vector<int> ranks(ranks_in);
  std::sort(ranks.begin(), ranks.end());
  if (ranks.empty() || std::adjacent_find(ranks.begin(), ranks.end()) != ranks.end() || ranks.front() < 0 ||
      ranks.back() >= size_)
    return Status::error(HPCDL_ERR_INVALID, "a process set needs distinct world ranks in [0, " +
                                                std::to_string(size_) + ")");
  {
    std::lock_guard<std::mutex> lock(sets_mutex_);
    for (auto& s : sets_)
      if (s.ranks == ranks)
        return Status::error(HPCDL_ERR_INVALID, "a process set with these ranks already exists (id " +
                                                    std::to_string(s.id) + ")");
  }
  // Every rank must add the same set at the same time: compare a digest of the list across the world.
  if (world_boot_) {
    std::string text;
    for (int r : ranks) text += std::to_string(r) + ",";
    Digest d = sha256(text.data(), text.size());
    int64_t mine[2];
    std::memcpy(&mine[0], d.data(), 8);
    mine[1] = next_set_id_;
    int64_t lo[2], hi[2];
    Deadline deadline = this->deadline();
    Status st = world_boot_->allreduce(mine, lo, 2, HPCDL_INT64, HPCDL_MIN, 1.0, 1.0, deadline, "add_process_set");
    if (st.is_ok()) st = world_boot_->allreduce(mine, hi, 2, HPCDL_INT64, HPCDL_MAX, 1.0, 1.0, deadline, "add_process_set");
    if (!st.is_ok()) return st;
    if (lo[0] != hi[0] || lo[1] != hi[1])
      return Status::error(HPCDL_ERR_MISMATCH, "add_process_set: ranks passed different rank lists; every rank "
                                               "must call add_process_set with the same ranks in the same order");
  }
  int new_id = next_set_id_++;
  Status st = build_process_set(new_id, ranks);
  if (!st.is_ok()) return st;
  *id = new_id;
  return Status::ok();
}

Status Runtime::remove_process_set(int id) {
  std::lock_guard<std::mutex> admin(admin_mutex_);
  if (id == 0) return Status::error(HPCDL_ERR_INVALID, "the global process set (id 0) cannot be removed");
  std::lock_guard<std::mutex> lock(sets_mutex_);
  for (auto it = sets_.begin(); it != sets_.end(); ++it) {
    if (it->id == id) {
      sets_.erase(it);
      return Status::ok();
    }
  }
  return Status::error(HPCDL_ERR_INVALID, "no process set with id " + std::to_string(id));
}

}  // namespace hpcdl
