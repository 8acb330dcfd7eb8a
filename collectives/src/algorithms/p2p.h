// Collective algorithms over point-to-point links (TCP): one function per collective, each in its own
// file. Large messages use rings (bandwidth-optimal), small ones a single all-to-all exchange.
#pragma once

#include <string>
#include <vector>

#include "algorithms/op_desc.h"
#include "comm.h"

namespace hpcdl {

class P2P {
 public:
  virtual ~P2P() = default;
  virtual int p2p_rank() const = 0;
  virtual int p2p_size() const = 0;
  virtual const std::vector<int>& p2p_world() const = 0;
  // Sends to comm rank `to` while receiving from comm rank `from` (-1 skips either side).
  virtual Status sendrecv(int to, const void* send, size_t send_bytes, int from, void* recv, size_t recv_bytes,
                          Deadline deadline, const std::string& what) = 0;
};

// Exchanges descriptors with every rank and checks they agree (all ranks fail alike on mismatch).
Status p2p_agree(P2P& p, const OpDesc& desc, Deadline deadline, const std::string& what,
                 std::vector<OpDesc>* all = nullptr);

Status p2p_allreduce(P2P& p, const void* send, void* recv, int64_t count, int dtype, int op, double prescale,
                     double postscale, size_t small_message_bytes, Deadline deadline, const std::string& what);
Status p2p_allgatherv(P2P& p, const void* send, void* recv, const std::vector<int64_t>& counts, int dtype,
                      Deadline deadline, const std::string& what);
Status p2p_broadcast(P2P& p, void* buf, int64_t count, int dtype, int root, Deadline deadline,
                     const std::string& what);
Status p2p_alltoallv(P2P& p, const void* send, const std::vector<int64_t>& send_counts, void* recv,
                     const std::vector<int64_t>& recv_counts, int dtype, Deadline deadline, const std::string& what);
Status p2p_reducescatter(P2P& p, const void* send, void* recv, const std::vector<int64_t>& recv_counts, int dtype,
                         int op, double prescale, double postscale, Deadline deadline, const std::string& what);
Status p2p_barrier(P2P& p, Deadline deadline, const std::string& what);

// Ring building blocks shared by allreduce, allgather and reducescatter. `offsets` has size + 1 entries
// (byte offsets of each rank's segment in `work`).
Status ring_reduce_scatter(P2P& p, char* work, const std::vector<size_t>& offsets, int dtype, int op,
                           Deadline deadline, const std::string& what);  // rank r ends owning segment r
Status ring_allgather(P2P& p, char* work, const std::vector<size_t>& offsets, Deadline deadline,
                      const std::string& what);  // everyone starts owning its segment r

}  // namespace hpcdl
