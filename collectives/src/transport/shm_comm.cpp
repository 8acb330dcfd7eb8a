#include "transport/shm_comm.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>

#include "crypto/sha256.h"
#include "kernels/reduce.h"
#include "net/socket.h"

namespace hpcdl {

// The segment's first page. A member checks it before it uses anything else in the segment: the layout
// of everything behind it follows from nranks and chunk_bytes, so members that disagree on those would
// read each other's buffers at the wrong offsets (or past the end of the segment: SIGBUS).
struct ShmComm::Header {
  uint64_t magic;
  uint32_t layout;  // kLayout of the hpcdl that made the segment
  int32_t nranks;
  uint64_t chunk_bytes;          // staging buffer per rank and step, as the maker computed it
  uint64_t small_message_bytes;  // the maker's one-step allreduce limit (members must pick the same path)
  uint64_t total_bytes;          // the whole segment
  std::atomic<int32_t> attached;
  // A genuine segment a member cannot use: that member's comm rank + 1 and its settings, so the maker
  // fails at once with both values instead of waiting for a member that will never come.
  std::atomic<int32_t> refused_by;
  std::atomic<uint64_t> refused_chunk_bytes;
  std::atomic<uint64_t> refused_small_message_bytes;
  alignas(128) std::atomic<uint32_t> wake_seq;
  std::atomic<int32_t> sleepers;
};

struct ShmComm::RankCtl {
  alignas(128) std::atomic<uint32_t> step;
  int32_t pid;
  // The rank's time for its last full chunk (ns; 0: none since it was shared), written before it publishes
  // the next chunk's first step, in the word of that step's parity (as the staging slots): a member may
  // publish its next step while a slower one still reads this one's times, and would otherwise overwrite
  // them (the ranks then fed their StagingStores different times and chose differently under load).
  // Every rank feeds StagingStores the slowest rank's time.
  std::atomic<uint64_t> chunk_ns[2];
  // The doorbell (see Comm::wait_notify): the latest cycle a peer rang for, this rank's own pokes, and the
  // word its idle engine sleeps on, which every ring and poke changes.
  alignas(128) std::atomic<uint32_t> bell;
  std::atomic<uint32_t> pokes;
  std::atomic<uint32_t> wake;
  std::atomic<int32_t> bell_sleeping;
};

namespace {
constexpr uint64_t kMagic = 0x687063646c73686dULL;  // "hpcdlshm"
constexpr uint32_t kLayout = 4;
constexpr size_t kHeaderBytes = 4096;
// An out-of-place output at least this large (a whole allreduce's, or one segment's) receives its results
// through streaming stores. Unlike an in-place output (read moments before as the input), its lines are not
// in this core's cache, and cached stores would read each one first; an output this large does not stay in
// the cache anyway. (The engine's fusion buffer, smaller and copied out at once, keeps cached stores.)
constexpr size_t kStreamResultsFrom = 32 << 20;
size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }
inline bool reached(uint32_t value, uint32_t target) { return int32_t(value - target) >= 0; }

// Which of the settings that shape the segment differ between two ranks, with both values.
std::string mismatch(int rank_a, uint64_t chunk_a, uint64_t small_a, int rank_b, uint64_t chunk_b, uint64_t small_b) {
  std::string text;
  auto one = [&](const char* setting, uint64_t a, uint64_t b) {
    if (a == b) return;
    text += std::string(text.empty() ? "" : "; ") + setting + " is " + std::to_string(a) + " on rank " +
            std::to_string(rank_a) + " but " + std::to_string(b) + " on rank " + std::to_string(rank_b);
  };
  one("HPCDL_SHM_CHUNK_BYTES", chunk_a, chunk_b);
  one("HPCDL_SMALL_MESSAGE_BYTES", small_a, small_b);
  return text +
         "; every rank on a host must use the same value (chunk sizes are rounded up to 4 KiB): set it for the "
         "whole job, not per rank";
}
}  // namespace

ShmComm::RankCtl& ShmComm::ctl(int r) const {
  return *reinterpret_cast<RankCtl*>(static_cast<char*>(base_) + ctl_off_ + size_t(r) * sizeof(RankCtl));
}
char* ShmComm::slot(int r, uint32_t step) const {
  return static_cast<char*>(base_) + slot_off_ + (size_t(r) * 2 + (step & 1)) * params_.chunk_bytes;
}
char* ShmComm::desc_area(int r, uint32_t step) const {
  return static_cast<char*>(base_) + desc_off_ + (size_t(r) * 2 + (step & 1)) * desc_bytes_;
}

Status ShmComm::create(const std::vector<int>& world_ranks, int my_rank, const std::vector<int>& pids,
                       const ShmParams& params, const std::string& label, Deadline deadline, const SendName& send,
                       const RecvName& recv, std::shared_ptr<ShmComm>* out) {
  std::shared_ptr<ShmComm> c(new ShmComm());
  c->rank_ = my_rank;
  c->size_ = int(world_ranks.size());
  c->world_ = world_ranks;
  c->pids_ = pids;
  c->params_ = params;
  for (StagingStores& stores : c->stores_) stores = StagingStores(params.stores);
  c->params_.chunk_bytes = round_up(std::max<size_t>(params.chunk_bytes, 4096), 4096);
  c->label_ = label;
  const int n = c->size_;
  c->ctl_off_ = kHeaderBytes;
  c->desc_bytes_ = round_up(OpDesc::wire_size(n), 64);
  c->desc_off_ = round_up(c->ctl_off_ + size_t(n) * sizeof(RankCtl), 4096);
  c->slot_off_ = round_up(c->desc_off_ + size_t(n) * 2 * c->desc_bytes_, 4096);
  c->total_ = c->slot_off_ + size_t(n) * 2 * c->params_.chunk_bytes;
  Status st = my_rank == 0 ? c->make_segment(deadline, send) : c->join_segment(recv);
  if (!st.is_ok()) return st;
  *out = std::move(c);
  return Status::ok();
}

Status ShmComm::make_segment(Deadline deadline, const SendName& send) {
  static_assert(sizeof(Header) <= kHeaderBytes, "the header must fit its page");
  uint8_t rnd[8];
  Status st = random_bytes(rnd, sizeof(rnd));
  if (!st.is_ok()) return st;
  char buf[96];
  std::snprintf(buf, sizeof(buf), "/hpcdl-%d-%02x%02x%02x%02x%02x%02x", int(getpid()), rnd[0], rnd[1], rnd[2],
                rnd[3], rnd[4], rnd[5]);
  const std::string name = buf;
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0)
    return Status::error(HPCDL_ERR_INTERNAL, "cannot create shared memory " + name + ": " + errno_text(errno) +
                                                 "; is /dev/shm mounted and writable?");
  // Reserve the pages now: a full /dev/shm then fails here with a message, not later with SIGBUS.
  int err = ftruncate(fd, off_t(total_)) != 0 ? errno : posix_fallocate(fd, 0, off_t(total_));
  void* base = err == 0 ? mmap(nullptr, total_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
  if (err == 0 && base == MAP_FAILED) err = errno;
  close(fd);
  if (err != 0) {
    shm_unlink(name.c_str());
    return Status::error(HPCDL_ERR_INTERNAL,
                         "cannot reserve " + std::to_string(total_ >> 20) + " MiB of shared memory in /dev/shm (" +
                             errno_text(err) + "); enlarge /dev/shm (containers: --shm-size) or lower "
                             "HPCDL_SHM_CHUNK_BYTES (each rank stages 2 x that per communicator)");
  }
  base_ = base;
  auto* hdr = static_cast<Header*>(base_);
  hdr->magic = kMagic;
  hdr->layout = kLayout;
  hdr->nranks = size_;
  hdr->chunk_bytes = params_.chunk_bytes;
  hdr->small_message_bytes = params_.small_message_bytes;
  hdr->total_bytes = total_;
  hdr->attached.store(1);
  hdr->refused_by.store(0);
  for (int r = 0; r < size_; ++r) {
    ctl(r).step.store(0);
    ctl(r).bell.store(0);
    ctl(r).bell_sleeping.store(0);
  }
  ctl(0).pid = int(getpid());
  for (int r = 1; r < size_; ++r) {
    st = send(world_[size_t(r)], name);
    if (!st.is_ok()) {
      shm_unlink(name.c_str());
      return st;
    }
  }
  // Unlink once everybody mapped it: from then on the kernel frees it when the last rank exits.
  st = wait_until(
      [&]() -> int { return hdr->attached.load() >= size_ || hdr->refused_by.load() != 0 ? -1 : 1; }, deadline,
      "setting up shared memory for " + label_);
  shm_unlink(name.c_str());
  if (!st.is_ok()) return st;
  const int refused = hdr->refused_by.load() - 1;
  if (refused >= 0)
    return Status::error(HPCDL_ERR_INVALID,
                         "rank " + std::to_string(world_[size_t(refused)]) + " cannot use the shared memory rank " +
                             std::to_string(world_[0]) + " made for " + label_ + ": " +
                             mismatch(world_[size_t(refused)], hdr->refused_chunk_bytes.load(),
                                      hdr->refused_small_message_bytes.load(), world_[0], params_.chunk_bytes,
                                      params_.small_message_bytes));
  return Status::ok();
}

Status ShmComm::join_segment(const RecvName& recv) {
  std::string name;
  Status st = recv(world_[0], &name);
  if (!st.is_ok()) return st;
  const std::string what = "the shared memory segment " + name + " that rank " + std::to_string(world_[0]) +
                           " sent for " + label_;
  int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW, 0);
  if (fd < 0)
    return Status::error(HPCDL_ERR_INTERNAL, "cannot open " + what + ": " + errno_text(errno) +
                                                 "; ranks with the same HPCDL_HOSTNAME must share /dev/shm");
  // Owner, mode and size first: a segment of another user, or one too small for its header, is never
  // mapped, so no byte of it is read (or faults: touching pages past its end is SIGBUS).
  struct stat info {};
  if (fstat(fd, &info) != 0) {
    const int err = errno;
    close(fd);
    return Status::error(HPCDL_ERR_INTERNAL, "cannot inspect " + what + ": " + errno_text(err));
  }
  auto refuse = [&](const std::string& why) {
    close(fd);
    return Status::error(HPCDL_ERR_INVALID, "refusing " + what + ": " + why);
  };
  if (!S_ISREG(info.st_mode)) return refuse("it is not a shared memory file");
  if (info.st_uid != geteuid())
    return refuse("it belongs to uid " + std::to_string(info.st_uid) + ", not to this job's user (uid " +
                  std::to_string(geteuid()) + "); another user may be interfering with the job");
  if ((info.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", unsigned(info.st_mode & 07777));
    return refuse(std::string("other users may open it (mode ") + mode + "; hpcdl makes its segments 0600)");
  }
  if (size_t(info.st_size) < kHeaderBytes)
    return refuse("it is truncated: " + std::to_string(info.st_size) + " bytes, less than its " +
                  std::to_string(kHeaderBytes) + "-byte header");
  void* head = mmap(nullptr, kHeaderBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (head == MAP_FAILED) {
    const int err = errno;
    close(fd);
    return Status::error(HPCDL_ERR_INTERNAL, "mmap of " + what + " failed: " + errno_text(err));
  }
  auto* hdr = static_cast<Header*>(head);
  auto refuse_mapped = [&](const std::string& why) {
    munmap(head, kHeaderBytes);
    return refuse(why);
  };
  if (hdr->magic != kMagic) return refuse_mapped("it is not an hpcdl segment (its header has another magic)");
  if (hdr->layout != kLayout)
    return refuse_mapped("it was made by another version of hpcdl (segment layout " + std::to_string(hdr->layout) +
                         ", this one uses " + std::to_string(kLayout) + "); run one hpcdl on every rank");
  if (hdr->nranks != size_)
    return refuse_mapped("it was made for " + std::to_string(hdr->nranks) + " ranks, this communicator has " +
                         std::to_string(size_));
  if (hdr->chunk_bytes != params_.chunk_bytes || hdr->small_message_bytes != params_.small_message_bytes) {
    hdr->refused_chunk_bytes.store(params_.chunk_bytes);
    hdr->refused_small_message_bytes.store(params_.small_message_bytes);
    hdr->refused_by.store(rank_ + 1);
    hdr->wake_seq.fetch_add(1);
    futex_wake_shared(&hdr->wake_seq);
    return refuse_mapped(mismatch(world_[size_t(rank_)], params_.chunk_bytes, params_.small_message_bytes,
                                  world_[0], hdr->chunk_bytes, hdr->small_message_bytes));
  }
  if (hdr->total_bytes != total_ || size_t(info.st_size) < total_)
    return refuse_mapped("it is truncated or inconsistent: " + std::to_string(info.st_size) + " bytes, its header "
                         "says " + std::to_string(hdr->total_bytes) + " and this rank's layout needs " +
                         std::to_string(total_));
  munmap(head, kHeaderBytes);
  void* base = mmap(nullptr, total_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  close(fd);
  if (base == MAP_FAILED) return Status::error(HPCDL_ERR_INTERNAL, "mmap of " + what + " failed: " + errno_text(err));
  base_ = base;
  ctl(rank_).pid = int(getpid());
  static_cast<Header*>(base_)->attached.fetch_add(1);
  return Status::ok();
}

ShmComm::~ShmComm() {
  if (base_) munmap(base_, total_);
}

Status ShmComm::check_usable() const {
  if (broken_.is_ok()) return Status::ok();
  return Status::error(broken_.code, "this communicator failed earlier and cannot be used any more (" +
                                         broken_.message + "); shut hpcdl down and restart the job");
}

Status ShmComm::fail(Status status) {
  if (status.code == HPCDL_ERR_TIMEOUT || status.code == HPCDL_ERR_PEER_LOST) broken_ = status;
  return status;
}

void ShmComm::publish() {
  ++step_;
  ctl(rank_).step.store(step_, std::memory_order_seq_cst);
  auto* hdr = static_cast<Header*>(base_);
  if (hdr->sleepers.load(std::memory_order_seq_cst) > 0) {
    hdr->wake_seq.fetch_add(1);
    futex_wake_shared(&hdr->wake_seq);
  }
}

// Spins for a few microseconds (a peer in step is that close), then sleeps on the segment's futex until a
// publish wakes it: a waiter never holds a core that another rank, or another thread of the host, needs
// for longer than the spin. A sleeper looks at the peer it waits for every 50 ms: a dead one ends the wait.
template <class Missing>
Status ShmComm::wait_until(Missing missing, Deadline deadline, const std::string& what) {
  int m = missing();
  if (m < 0) {
    late_ring_.drop();
    return Status::ok();
  }
  auto* hdr = static_cast<Header*>(base_);
  const auto start = Clock::now();
  for (unsigned i = 1;; ++i) {
    cpu_relax();
    if ((m = missing()) < 0) {
      late_ring_.drop();
      return Status::ok();
    }
    if ((i & 63) == 0) {
      const auto now = Clock::now();
      late_ring_.ring_if_due(*this, now);
      if (now - start > policy_.spin) break;
    }
  }
  for (auto until = start + policy_.spin + policy_.yield, now = Clock::now(); now < until; now = Clock::now()) {
    late_ring_.ring_if_due(*this, now);
    sched_yield();
    if ((m = missing()) < 0) {
      late_ring_.drop();
      return Status::ok();
    }
  }
  late_ring_.ring_if_due(*this, Clock::time_point::max());
  auto last_check = Clock::now();
  while (true) {
    hdr->sleepers.fetch_add(1, std::memory_order_seq_cst);
    uint32_t seq = hdr->wake_seq.load(std::memory_order_seq_cst);
    m = missing();
    auto now = Clock::now();
    if (m >= 0 && now < deadline) {
      int64_t left = std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - now).count();
      futex_wait_shared(&hdr->wake_seq, seq, std::min<int64_t>(left, 10'000'000));
      m = missing();
    }
    hdr->sleepers.fetch_sub(1, std::memory_order_seq_cst);
    if (m < 0) return Status::ok();
    now = Clock::now();
    const std::string who = "rank " + std::to_string(world_[size_t(m)]) + " (pid " +
                            std::to_string(pids_.empty() ? 0 : pids_[size_t(m)]) + ")";
    if (now - last_check > std::chrono::milliseconds(50)) {
      last_check = now;
      int pid = m == 0 || pids_.empty() ? ctl(m).pid : pids_[size_t(m)];
      if (!process_alive(pid))
        return Status::error(HPCDL_ERR_PEER_LOST,
                             what + ": " + who + " died (its process is gone) before finishing this collective");
    }
    if (now >= deadline)
      return Status::error(HPCDL_ERR_TIMEOUT, what + ": timed out waiting for " + who +
                                                  " (HPCDL_TIMEOUT); it is hung, dead or not calling the same "
                                                  "collective");
  }
}

Status ShmComm::wait_all(Deadline deadline, const std::string& what) {
  const uint32_t target = step_;
  Status st = wait_until(
      [&]() -> int {
        for (int r = 0; r < size_; ++r)
          if (r != rank_ && !reached(ctl(r).step.load(std::memory_order_acquire), target)) return r;
        return -1;
      },
      deadline, what);
  return st.is_ok() ? st : fail(st);
}

Status ShmComm::wait_rank(int r, Deadline deadline, const std::string& what) {
  const uint32_t target = step_;
  Status st = wait_until(
      [&]() -> int { return reached(ctl(r).step.load(std::memory_order_acquire), target) ? -1 : r; }, deadline,
      what);
  return st.is_ok() ? st : fail(st);
}

Status ShmComm::agree(const OpDesc& desc, Deadline deadline, const std::string& what, std::vector<OpDesc>* all) {
  Status st = check_usable();
  if (!st.is_ok()) return st;
  desc.serialize(desc_area(rank_, step_ + 1), size_);
  publish();
  st = wait_all(deadline, what);
  if (!st.is_ok()) return st;
  std::vector<OpDesc> descs;
  for (int r = 0; r < size_; ++r) descs.push_back(OpDesc::deserialize(desc_area(r, step_), size_));
  st = check_descs(descs, world_, what);
  if (all) *all = std::move(descs);
  return st;
}

// ---- allreduce ---------------------------------------------------------------------------------------
namespace {
// A list of segments seen as their concatenation: visits the pieces of an element range [at, at + len).
class Concatenation {
 public:
  Concatenation(const Segment* segments, size_t n) : segments_(segments), n_(n), start_(n + 1, 0) {
    for (size_t i = 0; i < n; ++i) start_[i + 1] = start_[i] + segments[i].count;
  }
  int64_t total() const { return start_[n_]; }
  // Calls visit(segment, offset in segment, offset in the range, length) for each piece, in order.
  template <class Visit>
  void each(int64_t at, int64_t len, Visit visit) const {
    size_t i = size_t(std::upper_bound(start_.begin(), start_.end(), at) - start_.begin()) - 1;
    for (int64_t done = 0; done < len; ++i) {
      if (segments_[i].count == 0) continue;
      const int64_t in_seg = at + done - start_[i];
      const int64_t piece = std::min(len - done, segments_[i].count - in_seg);
      visit(segments_[i], in_seg, done, piece);
      done += piece;
    }
  }

 private:
  const Segment* segments_;
  size_t n_;
  std::vector<int64_t> start_;
};
}  // namespace

Status ShmComm::allreduce(const void* send, void* recv, int64_t count, int dtype, int op, double prescale,
                          double postscale, Deadline deadline, const std::string& what) {
  const Segment whole{send, recv, count};
  return reduce_segments(&whole, 1, dtype, op, prescale, postscale, deadline, what);
}

Status ShmComm::allreduce_segments(const std::vector<Segment>& segments, int dtype, int op, double prescale,
                                   double postscale, Deadline deadline, const std::string& what) {
  return reduce_segments(segments.data(), segments.size(), dtype, op, prescale, postscale, deadline, what);
}

// Stages straight from the segments' inputs and reduces straight into their outputs: a segmented
// allreduce moves exactly the bytes a single-buffer one of the same total would. Kernel calls and copies
// are split where a segment ends.
Status ShmComm::reduce_segments(const Segment* segments, size_t nseg, int dtype, int op, double prescale,
                                double postscale, Deadline deadline, const std::string& what) {
  Status st = check_usable();
  if (!st.is_ok()) return st;
  const size_t es = dtype_bytes(dtype);
  const Concatenation all(segments, nseg);
  const int64_t count = all.total();
  const size_t bytes = size_t(count) * es;
  const void* few[16];
  std::vector<const void*> many(size_ > 16 ? size_t(size_) : 0);
  const void** srcs = size_ > 16 ? many.data() : few;
  auto input = [&](const Segment& s, int64_t at) { return static_cast<const char*>(s.send) + size_t(at) * es; };
  auto output = [&](const Segment& s, int64_t at) { return static_cast<char*>(s.recv) + size_t(at) * es; };

  if (bytes <= params_.small_message_bytes && bytes <= params_.chunk_bytes) {
    // One step: everybody stages its input, then reduces all inputs in rank order (bitwise identical).
    // The descriptor is the fixed 24-byte header (no count vectors for allreduce): compare it raw.
    char* mine = desc_area(rank_, step_ + 1);
    const int32_t head[4] = {HPCDL_OP_ALLREDUCE, dtype, op, 0};
    std::memcpy(mine, head, sizeof(head));
    std::memcpy(mine + 16, &count, 8);
    char* stage = slot(rank_, step_ + 1);
    all.each(0, count, [&](const Segment& s, int64_t at, int64_t rel, int64_t len) {
      std::memcpy(stage + size_t(rel) * es, input(s, at), size_t(len) * es);
    });
    publish();
    st = wait_all(deadline, what);
    if (!st.is_ok()) return st;
    for (int r = 0; r < size_; ++r) {
      if (r != rank_ && std::memcmp(desc_area(r, step_), mine, 24) != 0) {
        std::vector<OpDesc> descs;
        for (int q = 0; q < size_; ++q) descs.push_back(OpDesc::deserialize(desc_area(q, step_), size_));
        return check_descs(descs, world_, what);
      }
    }
    all.each(0, count, [&](const Segment& s, int64_t at, int64_t rel, int64_t len) {
      for (int r = 0; r < size_; ++r)
        srcs[r] = r == rank_ ? static_cast<const void*>(input(s, at)) : slot(r, step_) + size_t(rel) * es;
      reduce(output(s, at), srcs, size_, len, dtype, op, prescale, postscale, size_);
    });
    return Status::ok();
  }
  const OpDesc desc = make_desc(HPCDL_OP_ALLREDUCE, dtype, op, count);

  st = agree(desc, deadline, what);
  if (!st.is_ok()) return st;
  // Chunks: each rank reduces its 1/n part of the chunk from everyone's staged copy, then copies the
  // other parts' results. A rank never stages its own part (only it reads that part).
  const size_t align = std::max<size_t>(1, 64 / es);
  const int64_t chunk_elems = int64_t(params_.chunk_bytes / es);
  auto streamed = [&](const Segment& s) {
    return s.recv != s.send && size_t(s.count) * es >= kStreamResultsFrom;
  };
  for (int64_t off = 0; off < count; off += chunk_elems) {
    const int64_t ce = std::min(chunk_elems, count - off);
    const Chunk timed = begin_chunk(kAllreduceChunk, ce == chunk_elems);
    int64_t part = (ce + size_ - 1) / size_;
    part = int64_t((size_t(part) + align - 1) / align * align);
    auto part_begin = [&](int p) { return std::min<int64_t>(int64_t(p) * part, ce); };
    auto part_len = [&](int p) { return part_begin(p + 1) - part_begin(p); };
    char* stage = slot(rank_, step_ + 1);
    for (int p = 0; p < size_; ++p) {
      if (p == rank_ || part_len(p) == 0) continue;
      char* to = stage + size_t(part_begin(p)) * es;
      all.each(off + part_begin(p), part_len(p), [&](const Segment& s, int64_t at, int64_t rel, int64_t len) {
        stores_[kAllreduceChunk].copy(to + size_t(rel) * es, input(s, at), size_t(len) * es);
      });
    }
    st = publish_chunk(deadline, what);
    if (!st.is_ok()) return st;
    const uint32_t staged = step_;
    const int64_t mine = part_len(rank_), mine_at = part_begin(rank_);
    if (mine > 0) {
      // Reduce straight into the output (in place, its lines are already cached from reading the
      // input), then stage the result for the peers from there. A large out-of-place result is reduced
      // into the staging buffer and streamed to the output from there (see kStreamResultsFrom).
      // Works in L1-sized blocks so that the copy to the staging buffer reads what was just written.
      char* staged_result = slot(rank_, step_ + 1) + size_t(mine_at) * es;
      const int64_t block = int64_t(16384 / es);
      for (int64_t at = 0; at < mine; at += block) {
        const int64_t len = std::min(block, mine - at);
        all.each(off + mine_at + at, len, [&](const Segment& s, int64_t seg_at, int64_t rel, int64_t n) {
          const size_t from = size_t(mine_at + at + rel) * es;
          for (int r = 0; r < size_; ++r)
            srcs[r] = r == rank_ ? static_cast<const void*>(input(s, seg_at)) : slot(r, staged) + from;
          char* staged_here = staged_result + size_t(at + rel) * es;
          if (streamed(s)) {
            reduce(staged_here, srcs, size_, n, dtype, op, prescale, postscale, size_);
            stream_copy(output(s, seg_at), staged_here, size_t(n) * es);
          } else {
            reduce(output(s, seg_at), srcs, size_, n, dtype, op, prescale, postscale, size_);
            stores_[kAllreduceChunk].copy(staged_here, output(s, seg_at), size_t(n) * es);
          }
        });
      }
    }
    publish();
    st = wait_all(deadline, what);
    if (!st.is_ok()) return st;
    for (int p = 0; p < size_; ++p) {
      if (p == rank_ || part_len(p) == 0) continue;
      const char* from = slot(p, step_) + size_t(part_begin(p)) * es;
      all.each(off + part_begin(p), part_len(p), [&](const Segment& s, int64_t at, int64_t rel, int64_t len) {
        if (streamed(s))
          stream_copy(output(s, at), from + size_t(rel) * es, size_t(len) * es);
        else
          line_copy(output(s, at), from + size_t(rel) * es, size_t(len) * es);
      });
    }
    end_chunk(timed);
  }
  return Status::ok();
}

ShmComm::Chunk ShmComm::begin_chunk(ChunkKind kind, bool full) const {
  return {kind, full, stores_[kind].streaming(), full ? Clock::now() : Clock::time_point()};
}

// The previous full chunk's time goes out with this step; once every member has published it, the members
// ran the same chunks, so either all or none of them has a time, of the same kind: all feed the same
// (slowest) one to that kind's StagingStores, which then make the same choices on every rank.
Status ShmComm::publish_chunk(Deadline deadline, const std::string& what) {
  const uint32_t parity = (step_ + 1) & 1;  // of the step published next
  ctl(rank_).chunk_ns[parity].store(last_chunk_ns_, std::memory_order_relaxed);
  publish();
  Status st = wait_all(deadline, what);
  if (!st.is_ok()) return st;
  uint64_t slowest = 0;
  for (int r = 0; r < size_; ++r)
    slowest = std::max(slowest, ctl(r).chunk_ns[parity].load(std::memory_order_relaxed));
  if (slowest > 0) stores_[last_chunk_kind_].record_chunk(double(slowest) * 1e-9, last_chunk_streamed_);
  last_chunk_ns_ = 0;
  return st;
}

void ShmComm::end_chunk(const Chunk& chunk) {
  if (!chunk.full) return;
  last_chunk_kind_ = chunk.kind;
  last_chunk_streamed_ = chunk.streamed;
  last_chunk_ns_ = uint64_t(std::max<int64_t>(
      1, std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - chunk.start).count()));
}

// ---- allgatherv --------------------------------------------------------------------------------------
Status ShmComm::allgatherv(const void* send, void* recv, const std::vector<int64_t>& counts, int dtype,
                           Deadline deadline, const std::string& what) {
  return allgatherv_over(OneArea{static_cast<char*>(const_cast<void*>(send))}, OneArea{static_cast<char*>(recv)},
                         counts, dtype, deadline, what);
}

Status ShmComm::allgatherv_areas(const Areas& in, const Areas& out, const std::vector<int64_t>& counts, int dtype,
                                 Deadline deadline, const std::string& what) {
  return allgatherv_over(in, out, counts, dtype, deadline, what);
}

template <class Input, class Output>
Status ShmComm::allgatherv_over(const Input& in, const Output& out, const std::vector<int64_t>& counts, int dtype,
                                Deadline deadline, const std::string& what) {
  std::vector<int64_t> vec(counts);
  vec.resize(size_t(2 * size_), 0);
  Status st = agree(make_desc(HPCDL_OP_ALLGATHER, dtype, 0, counts[size_t(rank_)], vec), deadline, what);
  if (!st.is_ok()) return st;
  const size_t es = dtype_bytes(dtype);
  std::vector<size_t> offset(size_t(size_) + 1, 0);
  int64_t largest = 0, smallest = counts[0];
  for (int r = 0; r < size_; ++r) {
    offset[size_t(r) + 1] = offset[size_t(r)] + size_t(counts[size_t(r)]) * es;
    largest = std::max(largest, counts[size_t(r)]);
    smallest = std::min(smallest, counts[size_t(r)]);
  }
  const size_t mine = size_t(counts[size_t(rank_)]) * es, own = offset[size_t(rank_)];
  // This rank's block is copied chunk by chunk right after staging it, while the chunk is in the cache
  // (one read of the input instead of two), unless it overlaps the output elsewhere than in place.
  bool in_place = true, apart = true;
  each_pair(out, own, in, 0, mine, [&](char* o, char* i, size_t, size_t len) {
    in_place = in_place && o == i;
    apart = apart && (o + len <= i || i + len <= o);
  });
  if (!in_place && !apart)
    each_pair(out, own, in, 0, mine, [&](char* o, char* i, size_t, size_t len) { std::memmove(o, i, len); });
  const size_t chunk = params_.chunk_bytes;
  for (size_t at = 0; at < size_t(largest) * es; at += chunk) {
    // timed when every member stages and reads a whole chunk
    const Chunk timed = begin_chunk(kAllgatherChunk, at + chunk <= size_t(smallest) * es);
    if (at < mine) {
      const size_t n = std::min(chunk, mine - at);
      char* stage = slot(rank_, step_ + 1);
      in.each(at, n, [&](char* i, size_t rel, size_t len) { stores_[kAllgatherChunk].copy(stage + rel, i, len); });
      if (!in_place && apart)
        each_pair(out, own + at, in, at, n, [&](char* o, char* i, size_t, size_t len) { line_copy(o, i, len); });
    }
    st = publish_chunk(deadline, what);
    if (!st.is_ok()) return st;
    for (int r = 0; r < size_; ++r) {
      size_t theirs = size_t(counts[size_t(r)]) * es;
      if (r == rank_ || at >= theirs) continue;
      const char* staged = slot(r, step_);
      out.each(offset[size_t(r)] + at, std::min(chunk, theirs - at),
               [&](char* o, size_t rel, size_t len) { line_copy(o, staged + rel, len); });
    }
    end_chunk(timed);
  }
  return Status::ok();
}

// One step, like a small allreduce: stage, publish, wait, read every peer's slot; the descriptor is the
// fixed 24-byte header, compared raw.
Status ShmComm::allgather_slots(const void* mine, void* all, size_t slot_bytes, Deadline deadline,
                                const std::string& what) {
  if (slot_bytes > params_.chunk_bytes) return Comm::allgather_slots(mine, all, slot_bytes, deadline, what);
  Status st = check_usable();
  if (!st.is_ok()) return st;
  char* desc = desc_area(rank_, step_ + 1);
  const int32_t head[4] = {HPCDL_OP_ALLGATHER, HPCDL_UINT8, 0, 0};
  const int64_t count = int64_t(slot_bytes);
  std::memcpy(desc, head, sizeof(head));
  std::memcpy(desc + 16, &count, 8);
  std::memcpy(slot(rank_, step_ + 1), mine, slot_bytes);
  publish();
  st = wait_all(deadline, what);
  if (!st.is_ok()) return st;
  auto* out = static_cast<char*>(all);
  for (int r = 0; r < size_; ++r) {
    if (r != rank_ && std::memcmp(desc_area(r, step_), desc, 24) != 0) {
      std::vector<OpDesc> descs;
      for (int q = 0; q < size_; ++q) descs.push_back(OpDesc::deserialize(desc_area(q, step_), size_));
      return check_descs(descs, world_, what);
    }
    std::memcpy(out + size_t(r) * slot_bytes, r == rank_ ? mine : slot(r, step_), slot_bytes);
  }
  return Status::ok();
}

// ---- broadcast ---------------------------------------------------------------------------------------
Status ShmComm::broadcast(void* buf, int64_t count, int dtype, int root, Deadline deadline,
                          const std::string& what) {
  return broadcast_over(OneArea{static_cast<char*>(buf)}, count, dtype, root, deadline, what);
}

Status ShmComm::broadcast_areas(const Areas& buf, int64_t count, int dtype, int root, Deadline deadline,
                                const std::string& what) {
  return broadcast_over(buf, count, dtype, root, deadline, what);
}

template <class Buffer>
Status ShmComm::broadcast_over(const Buffer& buf, int64_t count, int dtype, int root, Deadline deadline,
                               const std::string& what) {
  Status st = agree(make_desc(HPCDL_OP_BROADCAST, dtype, root, count), deadline, what);
  if (!st.is_ok()) return st;
  const size_t bytes = size_t(count) * dtype_bytes(dtype);
  for (size_t at = 0; at < bytes; at += params_.chunk_bytes) {
    size_t n = std::min(params_.chunk_bytes, bytes - at);
    const Chunk timed = begin_chunk(kBroadcastChunk, n == params_.chunk_bytes);
    if (rank_ == root) {
      char* stage = slot(rank_, step_ + 1);
      buf.each(at, n,
               [&](char* data, size_t rel, size_t len) { stores_[kBroadcastChunk].copy(stage + rel, data, len); });
    }
    st = publish_chunk(deadline, what);
    if (!st.is_ok()) return st;
    if (rank_ != root) {
      const char* staged = slot(root, step_);
      buf.each(at, n, [&](char* data, size_t rel, size_t len) { std::memcpy(data, staged + rel, len); });
    }
    end_chunk(timed);
  }
  return Status::ok();
}

// ---- alltoallv ---------------------------------------------------------------------------------------
Status ShmComm::alltoallv(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                          const std::vector<int64_t>& recv_counts, int dtype, Deadline deadline,
                          const std::string& what) {
  std::vector<int64_t> vec(send_counts);
  vec.insert(vec.end(), recv_counts.begin(), recv_counts.end());
  std::vector<OpDesc> all;
  Status st = agree(make_desc(HPCDL_OP_ALLTOALL, dtype, 0, 0, vec), deadline, what, &all);
  if (!st.is_ok()) return st;
  const size_t es = dtype_bytes(dtype);
  const size_t n = size_t(size_);
  std::vector<size_t> soff(n + 1, 0), roff(n + 1, 0);
  for (size_t r = 0; r < n; ++r) {
    soff[r + 1] = soff[r] + size_t(send_counts[r]) * es;
    roff[r + 1] = roff[r] + size_t(recv_counts[r]) * es;
  }
  size_t largest = 0, smallest = SIZE_MAX;
  for (size_t i = 0; i < n; ++i)
    for (size_t j = 0; j < n; ++j)
      if (i != j) {
        largest = std::max(largest, size_t(all[i].vec[j]) * es);
        smallest = std::min(smallest, size_t(all[i].vec[j]) * es);
      }
  const auto* in = static_cast<const char*>(send);
  auto* out = static_cast<char*>(recv);
  const size_t me = size_t(rank_);
  if (recv_counts[me]) std::memmove(out + roff[me], in + soff[me], size_t(recv_counts[me]) * es);
  const size_t sub = std::max<size_t>(64, params_.chunk_bytes / n / 64 * 64);
  for (size_t at = 0; at < largest; at += sub) {
    // timed when every member stages and reads a whole piece for each peer
    const Chunk timed = begin_chunk(kAlltoallChunk, at + sub <= smallest);
    char* stage = slot(rank_, step_ + 1);
    for (size_t j = 0; j < n; ++j) {
      size_t len = size_t(send_counts[j]) * es;
      if (j != me && at < len)
        stores_[kAlltoallChunk].copy(stage + j * sub, in + soff[j] + at, std::min(sub, len - at));
    }
    st = publish_chunk(deadline, what);
    if (!st.is_ok()) return st;
    for (size_t i = 0; i < n; ++i) {
      size_t len = size_t(recv_counts[i]) * es;
      if (i != me && at < len) std::memcpy(out + roff[i] + at, slot(int(i), step_) + me * sub, std::min(sub, len - at));
    }
    end_chunk(timed);
  }
  return Status::ok();
}

// ---- reducescatter -----------------------------------------------------------------------------------
Status ShmComm::reducescatter(const void* send, void* recv, const std::vector<int64_t>& recv_counts, int dtype,
                              int op, double prescale, double postscale, Deadline deadline,
                              const std::string& what) {
  return reducescatter_over(OneArea{static_cast<char*>(const_cast<void*>(send))}, OneArea{static_cast<char*>(recv)},
                            recv_counts, dtype, op, prescale, postscale, deadline, what);
}

Status ShmComm::reducescatter_areas(const Areas& in, const Areas& out, const std::vector<int64_t>& recv_counts,
                                    int dtype, int op, double prescale, double postscale, Deadline deadline,
                                    const std::string& what) {
  return reducescatter_over(in, out, recv_counts, dtype, op, prescale, postscale, deadline, what);
}

template <class Input, class Output>
Status ShmComm::reducescatter_over(const Input& in, const Output& out, const std::vector<int64_t>& recv_counts,
                                   int dtype, int op, double prescale, double postscale, Deadline deadline,
                                   const std::string& what) {
  std::vector<int64_t> vec(recv_counts);
  vec.resize(size_t(2 * size_), 0);
  int64_t total = 0;
  for (int64_t c : recv_counts) total += c;
  Status st = agree(make_desc(HPCDL_OP_REDUCESCATTER, dtype, op, total, vec), deadline, what);
  if (!st.is_ok()) return st;
  const size_t es = dtype_bytes(dtype);
  const size_t n = size_t(size_), me = size_t(rank_);
  std::vector<int64_t> seg(n + 1, 0);
  int64_t largest = 0, smallest = recv_counts[0];
  for (size_t r = 0; r < n; ++r) {
    seg[r + 1] = seg[r] + recv_counts[r];
    largest = std::max(largest, recv_counts[r]);
    smallest = std::min(smallest, recv_counts[r]);
  }
  const int64_t sub = int64_t(std::max<size_t>(64, params_.chunk_bytes / n / 64 * 64) / es);
  std::vector<const void*> srcs(n);
  for (int64_t at = 0; at < largest; at += sub) {
    const Chunk timed = begin_chunk(kReducescatterChunk, at + sub <= smallest);  // as in alltoallv
    char* stage = slot(rank_, step_ + 1);
    for (size_t j = 0; j < n; ++j) {
      if (j == me || at >= recv_counts[j]) continue;
      char* to = stage + j * size_t(sub) * es;
      in.each(size_t(seg[j] + at) * es, size_t(std::min(sub, recv_counts[j] - at)) * es,
              [&](char* data, size_t rel, size_t len) { stores_[kReducescatterChunk].copy(to + rel, data, len); });
    }
    st = publish_chunk(deadline, what);
    if (!st.is_ok()) return st;
    if (at < recv_counts[me]) {
      // This rank's part: its own input and the peers' staged parts, reduced into its output.
      each_pair(out, size_t(at) * es, in, size_t(seg[me] + at) * es, size_t(std::min(sub, recv_counts[me] - at)) * es,
                [&](char* result, char* own, size_t rel, size_t len) {
                  for (size_t r = 0; r < n; ++r)
                    srcs[r] = r == me ? static_cast<const void*>(own)
                                      : slot(int(r), step_) + me * size_t(sub) * es + rel;
                  reduce(result, srcs.data(), size_, int64_t(len / es), dtype, op, prescale, postscale, size_);
                });
    }
    end_chunk(timed);
  }
  return Status::ok();
}

Status ShmComm::barrier(Deadline deadline, const std::string& what) {
  return agree(make_desc(HPCDL_OP_BARRIER, 0, 0, 0), deadline, what);
}

// ---- doorbell ----------------------------------------------------------------------------------------
// A ring raises the peer's bell to `cycle` (never lowers it: bells only grow, modulo 2^32) and wakes it if it
// sleeps; a ring for a cycle its bell already shows woke it already.
void ShmComm::ring(int r, uint32_t cycle) {
  RankCtl& c = ctl(r);
  uint32_t seen = c.bell.load(std::memory_order_seq_cst);
  do {
    if (int32_t(seen - cycle) >= 0) return;
  } while (!c.bell.compare_exchange_weak(seen, cycle, std::memory_order_seq_cst));
  c.wake.fetch_add(1, std::memory_order_seq_cst);
  if (c.bell_sleeping.load(std::memory_order_seq_cst)) futex_wake_shared(&c.wake);
}

void ShmComm::notify_peers(uint32_t cycle) {
  for (int r = 0; r < size_; ++r)
    if (r != rank_) ring(r, cycle);
}

void ShmComm::notify_self() {
  RankCtl& me = ctl(rank_);
  me.pokes.fetch_add(1, std::memory_order_seq_cst);
  me.wake.fetch_add(1, std::memory_order_seq_cst);
  if (me.bell_sleeping.load(std::memory_order_seq_cst)) futex_wake_shared(&me.wake);
}

Comm::Bell ShmComm::wait_notify(uint32_t cycle, Deadline until) {
  RankCtl& me = ctl(rank_);
  auto look = [&]() {
    if (int32_t(me.bell.load(std::memory_order_seq_cst) - cycle) >= 0) return Bell::kRung;
    const uint32_t pokes = me.pokes.load(std::memory_order_seq_cst);
    if (pokes != pokes_seen_) {
      pokes_seen_ = pokes;
      return Bell::kPoked;
    }
    return Bell::kTimeout;
  };
  const auto start = Clock::now();
  Bell b = look();
  if (b != Bell::kTimeout || start >= until) return b;
  for (unsigned i = 1;; ++i) {
    cpu_relax();
    if ((b = look()) != Bell::kTimeout) return b;
    if ((i & 63) == 0 && Clock::now() - start > std::chrono::microseconds(5)) break;
  }
  while (true) {
    me.bell_sleeping.store(1, std::memory_order_seq_cst);
    const uint32_t w = me.wake.load(std::memory_order_seq_cst);
    b = look();
    const auto now = Clock::now();
    if (b != Bell::kTimeout || now >= until) {
      me.bell_sleeping.store(0);
      return b;
    }
    int64_t left = std::chrono::duration_cast<std::chrono::nanoseconds>(until - now).count();
    futex_wait_shared(&me.wake, w, std::min<int64_t>(left, 100'000'000));
    me.bell_sleeping.store(0);
  }
}

}  // namespace hpcdl
