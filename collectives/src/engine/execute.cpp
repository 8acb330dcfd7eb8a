// The engine's execution of negotiated batches on the engine-data communicators: single operations,
// fusion buffers, and tiny allreduces reduced locally from the data that came with the negotiation.
#include <cstdint>
#include <cstring>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "engine/detail.h"
#include "engine/engine.h"
#include "kernels/reduce.h"

namespace hpcdl {

using namespace engine_detail;

namespace {

// Sizes the engine-owned result of allgather or alltoall: `rows` come from what the members announced, so
// a sum beyond 2^62 bytes or more memory than the machine gives is an error naming the operation, not an
// overflow or an abort.
Status allocate_result(ResultBytes& out, int64_t rows, int64_t row, int dsize, const std::string& what) {
  const int64_t limit = (int64_t(1) << 62) / dsize;
  const bool representable = rows >= 0 && (row == 0 || rows <= limit / row);
  const std::string size = representable ? std::to_string(rows * row * dsize) + " bytes" : "more than 2^62 bytes";
  try {
    if (representable) {
      out.resize(static_cast<size_t>(rows * row * dsize));
      return Status::ok();
    }
  } catch (const std::bad_alloc&) {
  }
  return Status::error(HPCDL_ERR_INVALID, what + ": cannot allocate the result of " + std::to_string(rows) +
                                              " rows (" + size + ") on this rank; the members' inputs are too large");
}

// The timeline's note of how an allreduce of `bytes` crossed hosts (see Comm::path), "" on one host.
std::string path_arg(const Comm& comm, int64_t bytes) {
  const std::string path = comm.path(static_cast<size_t>(bytes));
  return path.empty() ? "" : ",\"path\":\"" + path + "\"";
}

}  // namespace

int64_t Engine::entry_bytes(const NameRecord& e) const {
  const OpRequest* r = e.any();
  return r ? r->num_elements() * dtype_size(r->dtype) : 0;
}

void Engine::record_timeline(const NameRecord& e, const char* phase, Clock::time_point begin, Clock::time_point end,
                             const std::string& args) {
  if (!timeline_.active()) return;
  std::string all = args;
  if (std::strcmp(phase, "NEGOTIATE") == 0) {
    // "cached": every member's submission came as a response-cache id (a few bytes instead of the request).
    const bool cached = !e.arrived.empty() && e.from_cache == e.arrived.size();
    all = "\"ready_ranks\":" + ranks_json(e.arrived) + (e.arrived.empty() ? "" : ",\"last_ready\":" +
          std::to_string(e.arrived.back())) + (cached ? ",\"cached\":true" : "") + (args.empty() ? "" : "," + args);
  }
  timeline_.span(track_of(*e.any()), phase, begin, end, all);
}

void Engine::run_batch(const std::vector<NameRecord*>& batch, bool fused) {
  int64_t bytes = 0;
  for (const NameRecord* r : batch) bytes += entry_bytes(*r);
  NameRecord& front = *batch.front();
  const OpRequest& head = *front.any();
  const bool device = head.placement == HPCDL_PLACEMENT_DEVICE;
  if (bytes >= kWideBytes && !device) keep_to_own_core(false);  // bandwidth-bound: let the scheduler place it
  const bool member = index_of(front.members, rank_) >= 0;
  const auto start = Clock::now();
  const int64_t start_ns = steady_ns(start);
  const bool direct = !t_engine_thread;
  for (NameRecord* r : batch) {
    if (!r->local) continue;
    r->local->started_ns.store(start_ns, std::memory_order_relaxed);
    r->local->direct.store(direct, std::memory_order_relaxed);
  }
  if (timeline_.active()) {
    for (const NameRecord* r : batch) {
      const OpRequest& q = *r->any();
      record_timeline(*r, "NEGOTIATE", r->first_seen, r->decided,
                      "\"op\":\"" + std::string(op_type_name(q.op_type)) + "\"");
      if (!device) record_timeline(*r, "QUEUE", r->decided, start);  // device: when it ends
    }
  }
  if (front.what.empty()) front.what = describe(head);
  const std::string fused_what = fused ? std::string("allreduce of ") + std::to_string(batch.size()) +
                                             " fused tensors ('" + front.key.second + "', ...)"
                                       : std::string();
  const std::string& what = fused ? fused_what : front.what;
  if (device) {
    // Negotiated: the executor moves the data and reports the end (device_done), which completes the
    // operations. A rank outside the process set has nothing to run; every rank caches alike.
    burst_bytes_ += bytes;
    if (member) hand_to_device(batch, fused, what);
    for (NameRecord* r : batch) remember(*r);
    return;
  }
  std::shared_ptr<Comm> data;
  if (member) data = runtime_.find_comm_shared(front.key.first, Channel::kEngineData);
  Status s;
  if (head.op_type == HPCDL_OP_JOIN) {
    // Every rank (member or not) keeps the same joined-rank bookkeeping.
    auto it = last_joined_.find(head.process_set);
    if (front.local) front.local->join_result = it == last_joined_.end() ? -1 : it->second;
    joined_.erase(head.process_set);
  } else if (!data) {
    // Not a member of this set: nothing to run, the members do.
  } else if (!fused && front.all_inline()) {
    run_inline(front);
    if (timeline_.active()) record_timeline(front, "ALLREDUCE", start, Clock::now(), "\"inline\":true");
  } else if (fused) {
    s = run_fused(batch, *data, what);
  } else {
    s = run_one(front, *data);
    if (timeline_.active() && s.is_ok())
      record_timeline(front, op_type_upper(head.op_type), start, Clock::now(),
                      "\"bytes\":" + std::to_string(entry_bytes(front)) + path_arg(*data, entry_bytes(front)));
  }
  burst_bytes_ += bytes;
  finish(batch, s.code, s.message);
  if (!s.is_ok()) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (failed_.is_ok()) failed_ = s;
  } else {
    for (NameRecord* r : batch) remember(*r);
  }
}

// This rank's input scaled by the request's prescale factor into a buffer of its own (see
// prescale_rounds), valid until the next call.
const void* Engine::prescaled(const void* input, int64_t count, const OpRequest& r) {
  const size_t bytes = static_cast<size_t>(count * dtype_size(r.dtype));
  if (prescaled_.size() < bytes) prescaled_.resize(bytes);
  if (count > 0) reduce(prescaled_.data(), &input, 1, count, r.dtype, HPCDL_SUM, r.prescale, 1.0, 1);
  return prescaled_.data();
}

// Where an allgather's or alltoall's result of `rows` rows goes (*out): the caller's offered output (c_api.h)
// when the result has the rows it was offered for, else the engine's own buffer, a released result's when
// one is large enough (see kSpareResults).
Status Engine::place_output(EngineOp& op, int64_t rows, int64_t offered_rows, int64_t row, int dsize,
                            const std::string& what, void** out) {
  op.in_offered_output = op.output != nullptr && rows == offered_rows;
  if (op.in_offered_output) {
    *out = op.output;
    return Status::ok();
  }
  const int64_t limit = (int64_t(1) << 62) / dsize;
  if (rows >= 0 && (row == 0 || rows <= limit / row)) {
    std::lock_guard<std::mutex> lock(mutex_);
    reuse_result_buffer(op.owned_output, static_cast<size_t>(rows * row * dsize));
  }
  Status allocated = allocate_result(op.owned_output, rows, row, dsize, what);
  *out = op.owned_output.data();
  return allocated;
}

Status Engine::run_one(NameRecord& e, Comm& c) {
  const std::string& what = e.what;
  const OpRequest& any = *e.any();
  const OpRequest& req = e.local ? e.local->request : any;
  EngineOp* op = e.local.get();
  const int n = static_cast<int>(e.members.size());
  const int me = index_of(e.members, rank_);
  const int dsize = dtype_size(any.dtype);
  const int64_t row = any.row_elements();
  // The input as it enters the reduction, and the prescale factor left to the data plane.
  const bool rounds = prescale_rounds(any);
  const double prescale = rounds ? 1.0 : any.prescale;
  auto input = [&]() { return rounds ? prescaled(op->input, any.num_elements(), any) : op->input; };
  auto scratch = [&](int64_t bytes) -> uint8_t* {
    if (static_cast<int64_t>(scratch_.size()) < bytes) scratch_.resize(static_cast<size_t>(bytes));
    std::memset(scratch_.data(), 0, static_cast<size_t>(bytes));
    return scratch_.data();
  };
  switch (any.op_type) {
    case HPCDL_OP_ALLREDUCE: {
      int64_t count = any.num_elements();
      if (op != nullptr)
        return c.allreduce(input(), op->output, count, any.dtype, any.reduce_op, prescale, any.postscale,
                           deadline(), what);
      uint8_t* buf = scratch(2 * count * dsize);  // joined: contribute zeros, discard the result
      return c.allreduce(buf, buf + count * dsize, count, any.dtype, any.reduce_op, prescale, any.postscale,
                         deadline(), what);
    }
    case HPCDL_OP_ALLGATHER: {
      std::vector<int64_t> counts(n, 0);
      int64_t rows = 0;
      for (int m = 0; m < n; ++m) {
        if (!e.by_member[m]) continue;
        counts[m] = e.by_member[m]->rows() * row;
        rows = e.by_member[m]->rows() > INT64_MAX - rows ? -1 : rows + e.by_member[m]->rows();
        if (rows < 0) break;
      }
      void* out;
      if (op != nullptr) {
        op->output_shape = req.shape;
        op->output_shape[0] = rows;
        Status placed = place_output(*op, rows, n * req.rows(), row, dsize, what, &out);
        if (!placed.is_ok()) return placed;
      } else {
        Status allocated = allocate_result(scratch_, rows, row, dsize, what);
        if (!allocated.is_ok()) return allocated;
        out = scratch(rows * row * dsize);
      }
      const void* send = op != nullptr ? op->input : out;
      return c.allgatherv(send, out, counts, any.dtype, deadline(), what);
    }
    case HPCDL_OP_BROADCAST: {
      int root = index_of(e.members, any.root);
      int64_t count = any.num_elements();
      void* buf;
      if (op != nullptr) {
        if (me == root && op->output != op->input && count > 0)
          std::memcpy(op->output, op->input, static_cast<size_t>(count * dsize));
        buf = op->output;
      } else {
        buf = scratch(count * dsize);
      }
      return c.broadcast(buf, count, any.dtype, root, deadline(), what);
    }
    case HPCDL_OP_ALLTOALL: {
      std::vector<std::vector<int64_t>> splits(n);
      for (int m = 0; m < n; ++m) {
        const OpRequest& q = *e.by_member[m];
        splits[m] = q.splits.empty() ? std::vector<int64_t>(n, q.rows() / n) : q.splits;
      }
      std::vector<int64_t> send_counts(n), recv_counts(n);
      int64_t rows = 0;
      op->received_splits.assign(n, 0);
      for (int j = 0; j < n; ++j) {
        send_counts[j] = splits[me][j] * row;
        recv_counts[j] = splits[j][me] * row;
        op->received_splits[j] = splits[j][me];
        rows = rows < 0 || splits[j][me] > INT64_MAX - rows ? -1 : rows + splits[j][me];
      }
      op->output_shape = req.shape;
      op->output_shape[0] = rows;
      void* out;
      Status placed = place_output(*op, rows, req.rows(), row, dsize, what, &out);
      if (!placed.is_ok()) return placed;
      return c.alltoallv(op->input, send_counts, out, recv_counts, any.dtype, deadline(), what);
    }
    case HPCDL_OP_REDUCESCATTER: {
      std::vector<int64_t> counts(n);
      for (int j = 0; j < n; ++j) counts[j] = any.rows_of_member(j, n) * row;
      return c.reducescatter(input(), op->output, counts, any.dtype, any.reduce_op, prescale, any.postscale,
                             deadline(), what);
    }
    case HPCDL_OP_BARRIER:
      return c.barrier(deadline(), what);
    default:
      return Status::error(HPCDL_ERR_INTERNAL, "unknown operation type in " + what);
  }
}

void Engine::run_inline(NameRecord& e) {
  const OpRequest& q = *e.any();
  const bool rounds = prescale_rounds(q);
  const size_t n = e.payload.size();
  std::vector<std::vector<uint8_t>> scaled(rounds ? n : 0);
  const void* few[16];
  std::vector<const void*> many(n > 16 ? n : 0);
  const void** sources = n > 16 ? many.data() : few;
  for (size_t m = 0; m < n; ++m) {
    const void* data = e.payload[m].data();
    if (rounds) {
      scaled[m].resize(e.payload[m].size());
      reduce(scaled[m].data(), &data, 1, q.num_elements(), q.dtype, HPCDL_SUM, q.prescale, 1.0, 1);
      data = scaled[m].data();
    }
    sources[m] = data;
  }
  // Every member of an inline allreduce submitted it (all_inline), this rank included: its output is there.
  // The sources are copies that came with the negotiation, so the output may be the input.
  reduce(e.local->output, sources, static_cast<int>(n), q.num_elements(), q.dtype, q.reduce_op,
         rounds ? 1.0 : q.prescale, q.postscale, static_cast<int64_t>(n));
}

Status Engine::run_fused(const std::vector<NameRecord*>& batch, Comm& comm, const std::string& what) {
  const OpRequest& first = *batch.front()->any();
  const int dsize = dtype_size(first.dtype);
  const bool native = comm.native_segments();
  // Inputs that must be scaled before the reduction (see prescale_rounds) are scaled into the fusion buffer.
  const bool rounds = prescale_rounds(first);
  const double prescale = rounds ? 1.0 : first.prescale;
  // Which tensors go through the fusion buffer depends only on sizes and the batch's scaling, the same on
  // every rank, so every rank lists the same segments in the same order (the fusion buffer first).
  auto packed = [&](const NameRecord& e) { return !native || rounds || entry_bytes(e) <= kPackTensorMaxBytes; };
  int64_t packed_count = 0, total = 0, joined_bytes = 0;
  for (const NameRecord* r : batch) {
    const int64_t count = r->any()->num_elements();
    total += count;
    if (packed(*r)) packed_count += count;
    else if (!r->local) joined_bytes += count * dsize;
  }
  // Separate input and output halves: an out-of-place reduction lets the data plane skip a staging copy.
  if (static_cast<int64_t>(fusion_buffer_.size()) < 2 * packed_count * dsize)
    fusion_buffer_.resize(static_cast<size_t>(2 * packed_count * dsize));
  uint8_t* buf = fusion_buffer_.data();
  uint8_t* reduced = buf + packed_count * dsize;
  // Joined: a large tensor this rank never submitted contributes zeros and its result is dropped.
  if (static_cast<int64_t>(scratch_.size()) < 2 * joined_bytes) scratch_.resize(static_cast<size_t>(2 * joined_bytes));
  if (joined_bytes > 0) std::memset(scratch_.data(), 0, static_cast<size_t>(joined_bytes));
  uint8_t* zeros = scratch_.data();
  uint8_t* dropped = scratch_.data() + joined_bytes;
  std::vector<Segment> segments;
  if (packed_count > 0) segments.push_back({buf, reduced, packed_count});
  const auto t0 = Clock::now();
  int64_t off = 0;
  for (const NameRecord* r : batch) {
    const int64_t count = r->any()->num_elements();
    const size_t bytes = static_cast<size_t>(count * dsize);
    if (!packed(*r)) {
      if (r->local) {
        segments.push_back({r->local->input, r->local->output, count});
      } else {
        segments.push_back({zeros, dropped, count});
        dropped += bytes;
      }
      continue;
    }
    if (!r->local) std::memset(buf + off, 0, bytes);  // joined: contribute zeros
    else if (rounds) reduce(buf + off, &r->local->input, 1, count, first.dtype, HPCDL_SUM, first.prescale, 1.0, 1);
    else std::memcpy(buf + off, r->local->input, bytes);
    off += static_cast<int64_t>(bytes);
  }
  const auto t1 = Clock::now();
  const Segment& only = segments.front();
  Status s = segments.size() == 1
                 ? comm.allreduce(only.send, only.recv, only.count, first.dtype, first.reduce_op, prescale,
                                  first.postscale, deadline(), what)
                 : comm.allreduce_segments(segments, first.dtype, first.reduce_op, prescale, first.postscale,
                                           deadline(), what);
  if (!s.is_ok()) return s;
  const auto t2 = Clock::now();
  off = 0;
  for (const NameRecord* r : batch) {
    if (!packed(*r)) continue;
    size_t bytes = static_cast<size_t>(r->any()->num_elements() * dsize);
    if (r->local) std::memcpy(r->local->output, reduced + off, bytes);
    off += static_cast<int64_t>(bytes);
  }
  const auto t3 = Clock::now();
  if (timeline_.active()) {
    std::string args = "\"fused_tensors\":" + std::to_string(batch.size()) +
                       ",\"fused_bytes\":" + std::to_string(total * dsize) +
                       ",\"copied_bytes\":" + std::to_string(packed_count * dsize) + path_arg(comm, total * dsize);
    for (const NameRecord* r : batch) {
      if (!packed(*r)) {
        record_timeline(*r, "ALLREDUCE", t1, t2, args + ",\"in_place\":true");
        continue;
      }
      record_timeline(*r, "MEMCPY_IN_FUSION_BUFFER", t0, t1, args);
      record_timeline(*r, "ALLREDUCE", t1, t2, args);
      record_timeline(*r, "MEMCPY_OUT_FUSION_BUFFER", t2, t3, args);
    }
  }
  return Status::ok();
}

}  // namespace hpcdl
