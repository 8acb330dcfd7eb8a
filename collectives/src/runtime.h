// The one runtime object of a process: who this rank is, its settings, its communicators (one per process
// set and channel) and the background engine. Everything the runtime holds lives here; the only global is
// the pointer returned by current_runtime().
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm.h"
#include "crypto/sha256.h"
#include "options.h"

namespace hpcdl {

class Engine;
class Endpoint;
class TcpComm;
class ShmComm;
class RendezvousServer;

// Where a world rank lives and how to reach it, learned at rendezvous.
struct PeerInfo {
  int rank = -1;
  std::string host;  // host identity: equal strings share memory
  std::string addr;  // IPv4 address of its data listener (at registration: pinned by HPCDL_IFACE, or empty)
  int port = 0;
  int pid = 0;
};

// A process set: an ordered list of world ranks and, when this rank is a member, one Comm per channel.
struct ProcessSet {
  int id = 0;
  std::vector<int> ranks;
  int my_rank = -1;  // rank within the set, -1 when not a member
  std::shared_ptr<Comm> comms[3];
};

class Runtime {
 public:
  // Creates the process's runtime from the options (see hpcdl_init in c_api.h), meets the peers, builds
  // the global communicators and starts the engine. Fails when one already exists.
  static Status init(const Options& options);
  // Stops the engine, then tears down communicators and shared memory. No-op when not initialised.
  static Status shutdown();

  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  int cross_rank() const { return cross_rank_; }
  int cross_size() const { return cross_size_; }
  bool homogeneous() const { return homogeneous_; }
  const Options& options() const { return options_; }
  double timeout_s() const { return timeout_s_; }
  Deadline deadline() const;  // now + timeout_s
  const std::vector<PeerInfo>& peers() const { return peers_; }
  // "shm", "tcp", "mpi" or "self": what reaches peers on this host (local=true) or on other hosts.
  std::string transport_name(bool local) const;
  const std::string& tcp_congestion() const { return tcp_congestion_; }
  bool mpi_enabled() const { return mpi_enabled_; }
  bool mpi_threads_supported() const { return mpi_threads_supported_; }

  // The communicator of a process set on a channel. Throws std::out_of_range when the set does not
  // exist or this rank is not a member (find_comm returns nullptr instead). Thread-safe; the returned
  // Comm stays valid until the set is removed or the runtime shuts down (find_comm_shared keeps it alive).
  Comm& comm(int process_set, Channel channel);
  Comm* find_comm(int process_set, Channel channel);
  std::shared_ptr<Comm> find_comm_shared(int process_set, Channel channel);

  // Process sets: id 0 is the world. add/remove are collective over the whole world.
  std::vector<int> process_set_ids() const;
  bool process_set(int id, ProcessSet* out) const;  // copies the set's description; false if unknown
  Status add_process_set(const std::vector<int>& ranks, int* id);
  Status remove_process_set(int id);

  Engine* engine() { return engine_.get(); }

  // Communicator factories (collective over `ranks`; my = this rank's index in them). Used for process
  // sets and by composite communicators (hierarchical allreduce).
  Status make_shm_comm(const std::vector<int>& ranks, int my, const std::string& key, Channel channel,
                       Deadline deadline, std::shared_ptr<ShmComm>* out);
  Status make_tcp_comm(const std::vector<int>& ranks, int my, const std::string& key, Deadline deadline,
                       std::shared_ptr<TcpComm>* out);
  // Serialises the direct (caller's thread) collectives of c_api.h: one at a time per process.
  std::mutex& direct_mutex() { return direct_mutex_; }

  // Object payloads (broadcast_object, allgather_object, ...) are unpickled by their receivers, so callers
  // MAC them: with this key, HMAC(secret, "objects" round-nonce job-ranks), which every rank of this job
  // derives alike and which is new with every rendezvous (a job of one rank: random). The sequence number
  // (1, 2, ... per process set and name, counted in this runtime) binds a payload to one operation, so that
  // one replayed from an earlier operation is refused like an altered one.
  const Digest& object_key() const { return object_key_; }
  int64_t next_object_sequence(int process_set, const std::string& name);

 private:
  Runtime();
  Status start(const Options& options);
  Status meet(const std::string& host, const std::string& iface_addr, const std::string& bootstrap,
              std::string& secret, Deadline deadline, std::string* nonce);
  Status join_members(const std::vector<int>& members);
  Status build_process_set(int id, const std::vector<int>& ranks);
  Status make_comm(const std::vector<int>& ranks, int set_id, Channel channel, std::shared_ptr<Comm>* out);

  Options options_;
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1, cross_rank_ = 0, cross_size_ = 1;
  bool homogeneous_ = true;
  bool mpi_enabled_ = false, mpi_threads_supported_ = false;
  double timeout_s_ = 60.0;
  std::string transport_;  // requested: auto|shm|tcp|mpi
  std::string local_transport_ = "self", cross_transport_ = "self";
  std::string tcp_congestion_;  // what the endpoint's connections use (option tcp_congestion, if offered)
  std::vector<PeerInfo> peers_;
  std::unique_ptr<Endpoint> endpoint_;    // this rank's authenticated data listener and connector
  std::shared_ptr<TcpComm> world_boot_;  // world comm used for setup (shm names, process-set agreement)

  mutable std::mutex sets_mutex_;
  std::vector<ProcessSet> sets_;
  int next_set_id_ = 1;
  std::mutex admin_mutex_;  // serialises collective set-up calls on world_boot_
  std::mutex direct_mutex_;
  std::unique_ptr<RendezvousServer> rendezvous_;  // world rank 0 with rendezvous_serve=1 or bootstrap=mpi
  Digest object_key_{};
  std::mutex object_mutex_;
  std::map<std::pair<int, std::string>, int64_t> object_sequences_;
  bool mpi_initialized_here_ = false;

  std::unique_ptr<Engine> engine_;
};

// The process's runtime, or nullptr when hpcdl_init has not run (or shutdown has).
Runtime* current_runtime();

}  // namespace hpcdl
