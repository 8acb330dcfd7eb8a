// Checks what a rank does with values another rank sent it: the engine's refusal of submissions no rank
// could run (engine/request.h wire_problem) and the session frames' refusal of altered, replayed and
// oversized frames (net/session.h). Built and run by tests/unit/test_peer_values.py; prints one "ok" or
// "FAIL ..." line per check.
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "engine/request.h"
#include "hpcdl/c_api.h"
#include "net/session.h"

using hpcdl::OpRequest;

namespace {
int failures = 0;

void check(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "ok" : "FAIL", what.c_str());
  if (!ok) ++failures;
}

OpRequest request(int op_type, std::vector<int64_t> shape) {
  OpRequest r;
  r.name = "t";
  r.op_type = op_type;
  r.dtype = HPCDL_FLOAT32;
  r.shape = std::move(shape);
  return r;
}

// The request with one change applied; wire_problem must name something (or nothing when `fine`).
template <class Change>
void expect(const std::string& what, int world, bool fine, OpRequest r, Change change) {
  change(r);
  const std::string problem = hpcdl::wire_problem(r, world);
  check(fine ? problem.empty() : !problem.empty(), what + (problem.empty() ? "" : ": " + problem));
}

void engine_submissions() {
  auto same = [](OpRequest&) {};
  expect("allreduce of a tensor", 4, true, request(HPCDL_OP_ALLREDUCE, {3, 5}), same);
  expect("alltoall with splits that fit", 4, true, request(HPCDL_OP_ALLTOALL, {6, 2}),
         [](OpRequest& r) { r.splits = {1, 2, 0, 3}; });
  expect("broadcast in a process set", 4, true, request(HPCDL_OP_BROADCAST, {2}), [](OpRequest& r) {
    r.process_set = 1;
    r.members = {1, 3};
    r.root = 3;
  });
  expect("unknown dtype", 4, false, request(HPCDL_OP_ALLREDUCE, {2}), [](OpRequest& r) { r.dtype = 77; });
  expect("unknown operation", 4, false, request(9, {2}), same);
  expect("unknown reduction", 4, false, request(HPCDL_OP_ALLREDUCE, {2}), [](OpRequest& r) { r.reduce_op = -1; });
  expect("unknown placement", 4, false, request(HPCDL_OP_ALLREDUCE, {2}), [](OpRequest& r) { r.placement = 7; });
  expect("device placement", 4, true, request(HPCDL_OP_ALLREDUCE, {2}),
         [](OpRequest& r) { r.placement = HPCDL_PLACEMENT_DEVICE; });
  expect("negative dimension", 4, false, request(HPCDL_OP_ALLGATHER, {-1, 2}), same);
  expect("shape whose size overflows", 4, false, request(HPCDL_OP_ALLGATHER, {int64_t(1) << 40, int64_t(1) << 30}),
         same);
  expect("alltoall splits shorter than the set (read past their end)", 4, false,
         request(HPCDL_OP_ALLTOALL, {6}), [](OpRequest& r) { r.splits = {6}; });
  expect("negative alltoall split", 4, false, request(HPCDL_OP_ALLTOALL, {4}),
         [](OpRequest& r) { r.splits = {5, -1, 0, 0}; });
  expect("alltoall splits that do not add up to the rows", 4, false, request(HPCDL_OP_ALLTOALL, {4}),
         [](OpRequest& r) { r.splits = {1, 1, 1, 2}; });
  expect("alltoall splits that overflow their sum", 2, false, request(HPCDL_OP_ALLTOALL, {4}),
         [](OpRequest& r) { r.splits = {INT64_MAX, INT64_MAX}; });
  expect("uneven alltoall without splits", 4, false, request(HPCDL_OP_ALLTOALL, {6}), same);
  expect("member outside the job", 4, false, request(HPCDL_OP_ALLREDUCE, {2}), [](OpRequest& r) {
    r.process_set = 2;
    r.members = {0, 9};
  });
  expect("members out of order (repeated)", 4, false, request(HPCDL_OP_ALLREDUCE, {2}), [](OpRequest& r) {
    r.process_set = 2;
    r.members = {1, 1};
  });
  expect("members for the global set", 4, false, request(HPCDL_OP_ALLREDUCE, {2}),
         [](OpRequest& r) { r.members = {0, 1}; });
  expect("broadcast root outside the set", 4, false, request(HPCDL_OP_BROADCAST, {2}), [](OpRequest& r) {
    r.process_set = 1;
    r.members = {1, 3};
    r.root = 0;
  });
  expect("allgather of a scalar", 4, false, request(HPCDL_OP_ALLGATHER, {}), same);
  expect("grouped without a group size", 4, false, request(HPCDL_OP_ALLREDUCE, {2}),
         [](OpRequest& r) { r.group_id = 3; });
}

void session_frames() {
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fds) != 0) {
    check(false, "socketpair");
    return;
  }
  hpcdl::Digest key{};
  key[0] = 7;
  hpcdl::Session client(fds[0], key, hpcdl::Session::Side::kClient);
  hpcdl::Session server(fds[1], key, hpcdl::Session::Side::kServer);
  const auto soon = [] { return hpcdl::Clock::now() + std::chrono::seconds(2); };
  std::string body;

  hpcdl::Status st = server.send("first", soon(), "client", "test");
  if (st.is_ok()) st = client.recv(&body, 64, soon(), "server", "test");
  check(st.is_ok() && body == "first", "a frame passes" + st.message);

  // What went out on the wire for the next frame, taken off and resent altered, then replayed.
  st = server.send("second", soon(), "client", "test");
  char wire[64];
  const ssize_t n = read(fds[0], wire, sizeof(wire));
  std::string frame(wire, n > 0 ? size_t(n) : 0);
  std::string altered = frame;
  altered[5] ^= 1;
  check(write(fds[1], altered.data(), altered.size()) == ssize_t(altered.size()), "resend altered frame");
  st = client.recv(&body, 64, soon(), "server", "test");
  check(st.code == HPCDL_ERR_AUTH && body.empty(), "an altered frame is refused: " + st.message);

  hpcdl::Session fresh(fds[0], key, hpcdl::Session::Side::kClient);  // expects frame 0 again
  std::string first_again;
  st = server.send("third", soon(), "client", "test");  // frame 2 of the server
  st = fresh.recv(&first_again, 64, soon(), "server", "test");
  check(st.code == HPCDL_ERR_AUTH, "a frame out of sequence (frame 2 where 0 was due) is refused");

  hpcdl::Session reply_side(fds[1], key, hpcdl::Session::Side::kClient);  // the client's label, wrong way
  st = reply_side.send("mirrored", soon(), "server", "test");
  hpcdl::Session mirror(fds[0], key, hpcdl::Session::Side::kClient);
  st = mirror.recv(&body, 64, soon(), "server", "test");
  check(st.code == HPCDL_ERR_AUTH, "a frame reflected back to its sender is refused");

  const uint8_t huge[4] = {0xff, 0xff, 0xff, 0x7f};
  check(write(fds[1], huge, 4) == 4, "send a huge length");
  hpcdl::Session bounded(fds[0], key, hpcdl::Session::Side::kClient);
  st = bounded.recv(&body, 1 << 20, soon(), "server", "test");
  check(st.code == HPCDL_ERR_INVALID && st.message.find("2147483647 bytes") != std::string::npos,
        "a frame longer than the bound is refused before reading it: " + st.message);
  close(fds[0]);
  close(fds[1]);
}
}  // namespace

int main() {
  engine_submissions();
  session_frames();
  return failures == 0 ? 0 : 1;
}
