// Checks what a rank joining a shared-memory segment accepts (collectives/src/transport/shm_comm.*). Built
// and run by tests/unit/test_shm_segments.py; prints one "ok", "FAIL" or "skip" line per check.
//
// Every join runs in a child process, so that a segment that would make it fault (SIGBUS past the end of a
// truncated segment) shows as a failed check instead of killing this program. The segment's name travels
// from the maker to the joiner through a pipe, as the runtime sends it through its bootstrap connection.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>

#include "forked_ranks.h"

using namespace forked_ranks;  // check, start, finish, ... (the helpers of these programs)
using hpcdl::ShmComm;
using hpcdl::ShmParams;
using hpcdl::Status;

namespace {
ShmParams params(size_t chunk_bytes) {
  ShmParams p;
  p.chunk_bytes = chunk_bytes;
  return p;
}

// Rank `rank` of `n` on this host (see make_comm).
Status join(int n, int rank, size_t chunk_bytes, int name_in, int name_out, double seconds,
            const std::function<void(const std::string&)>& before_send = nullptr) {
  std::shared_ptr<ShmComm> comm;
  Status st = make_comm(n, rank, params(chunk_bytes), name_in, name_out, seconds, &comm, before_send);
  if (!st.is_ok()) return st;
  // Prove the segment is usable: a small allreduce of (rank + 1) over two ranks gives 3.
  float x[4] = {float(rank + 1), float(rank + 1), float(rank + 1), float(rank + 1)};
  st = comm->allreduce(x, x, 4, HPCDL_FLOAT32, HPCDL_SUM, 1.0, 1.0, in_seconds(seconds), "test allreduce");
  if (st.is_ok() && x[3] != 3.0f) return Status::error(HPCDL_ERR_INTERNAL, "allreduce gave a wrong sum");
  return st;
}

// A maker and a member in two children: (maker outcome, member outcome).
// `seconds` bounds the maker's wait for a member that will not attach.
std::pair<Outcome, Outcome> pair_run(int maker_size, size_t maker_chunk, int member_size, size_t member_chunk,
                                     double seconds = 10.0,
                                     const std::function<void(const std::string&)>& before_send = nullptr) {
  int names[2];
  if (pipe(names) != 0) return {};
  Child member = start([&] { return join(member_size, 1, member_chunk, names[0], -1, 10.0); });
  Child maker = start([&] { return join(maker_size, 0, maker_chunk, -1, names[1], seconds, before_send); });
  close(names[0]);
  close(names[1]);
  Outcome maker_out = finish(maker);
  return {maker_out, finish(member)};
}

// A segment made by this program (not by a maker rank), sent to a member of a 2-rank communicator.
Outcome member_of_crafted(size_t size, mode_t mode, uid_t owner, bool genuine_looking) {
  char name[64];
  std::snprintf(name, sizeof(name), "/hpcdl-test-%d-crafted", int(getpid()));
  shm_unlink(name);
  int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return {false, std::string("cannot create a test segment: ") + std::strerror(errno), 0};
  if (ftruncate(fd, off_t(size)) != 0 || fchmod(fd, mode) != 0 ||
      (owner != geteuid() && fchown(fd, owner, owner) != 0)) {
    close(fd);
    shm_unlink(name);
    return {false, std::string("cannot prepare a test segment: ") + std::strerror(errno), 0};
  }
  if (genuine_looking && size >= 8) {  // right magic, garbage behind it
    const uint64_t magic = 0x687063646c73686dULL;
    if (pwrite(fd, &magic, 8, 0) != 8) return {false, "pwrite failed", 0};
  }
  close(fd);
  int names[2];
  if (pipe(names) != 0) return {};
  write_text(names[1], name);
  Outcome o = finish(start([&] { return join(2, 1, 1 << 16, names[0], -1, 2.0); }));
  close(names[0]);
  close(names[1]);
  shm_unlink(name);
  return o;
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

void check_chunk_mismatch(size_t maker_chunk, size_t member_chunk, const std::string& what) {
  auto [maker, member] = pair_run(2, maker_chunk, 2, member_chunk);
  const std::string both = "HPCDL_SHM_CHUNK_BYTES is " + std::to_string(member_chunk) + " on rank 1 but " +
                           std::to_string(maker_chunk) + " on rank 0";
  check(!member.ok && member.signal == 0 && has(member.message, both),
        what + ": it refuses the segment (no SIGBUS), naming both values", member.message);
  check(!maker.ok && maker.signal == 0 && has(maker.message, both),
        what + ": the maker fails at once, naming both values", maker.message);
}

}  // namespace

int main() {
  {  // the same settings: both attach and reduce
    auto [maker, member] = pair_run(2, 1 << 16, 2, 1 << 16);
    check(maker.ok && member.ok, "same settings: both attach and reduce", maker.message + member.message);
  }
  // A member staging more per chunk would read past the segment's end (SIGBUS); one staging less would
  // read the peers' buffers at the wrong offsets. Both sides must fail at once, naming both values.
  check_chunk_mismatch(1 << 16, 1 << 20, "a member with a larger chunk");
  check_chunk_mismatch(1 << 20, 1 << 16, "a member with a smaller chunk");
  {  // a segment cut short after the maker sized it (by anything that can write the file)
    auto [maker, member] = pair_run(2, 1 << 16, 2, 1 << 16, 1.0, [](const std::string& name) {
      int fd = shm_open(name.c_str(), O_RDWR, 0);
      if (fd >= 0 && ftruncate(fd, 8192) == 0) close(fd);
    });
    check(!member.ok && member.signal == 0 && has(member.message, "truncated or inconsistent: 8192 bytes"),
          "a segment truncated after it was made is refused before it is mapped", member.message);
    check(!maker.ok && maker.signal == 0, "a truncated segment: the maker gets no communicator either",
          maker.message);
  }
  {  // a member of another size than the maker's communicator
    auto [maker, member] = pair_run(3, 1 << 16, 2, 1 << 16, 1.0);
    check(!member.ok && member.signal == 0 && has(member.message, "made for 3 ranks, this communicator has 2"),
          "a segment made for another number of ranks is refused", member.message);
  }
  const size_t enough = 1 << 21;
  {
    Outcome o = member_of_crafted(enough, 0600, geteuid(), false);
    check(!o.ok && o.signal == 0 && has(o.message, "not an hpcdl segment"), "a foreign segment (no magic) is refused",
          o.message);
  }
  {
    Outcome o = member_of_crafted(100, 0600, geteuid(), true);
    check(!o.ok && o.signal == 0 && has(o.message, "truncated: 100 bytes"),
          "a segment smaller than its header is refused before it is mapped", o.message);
  }
  {
    Outcome o = member_of_crafted(8192, 0600, geteuid(), true);
    check(!o.ok && o.signal == 0 && has(o.message, "refusing"),
          "a segment with the right magic but garbage behind it is refused", o.message);
  }
  {
    Outcome o = member_of_crafted(enough, 0666, geteuid(), true);
    check(!o.ok && o.signal == 0 && has(o.message, "other users may open it (mode 0666"),
          "a segment other users may open is refused", o.message);
  }
  if (geteuid() == 0) {
    Outcome o = member_of_crafted(enough, 0600, 65534, true);
    check(!o.ok && o.signal == 0 && has(o.message, "belongs to uid 65534"), "a segment of another user is refused",
          o.message);
  } else {
    std::printf("skip a segment of another user (making one needs root)\n");
  }
  return failures == 0 ? 0 : 1;
}
