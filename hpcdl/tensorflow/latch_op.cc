// HpcdlLatch: the one compiled piece of hpcdl.tensorflow, an asynchronous TensorFlow kernel that completes
// when a collective's engine operations have ended, holding no executor thread while others may need it.
//
// In a graph, every hpcdl collective is three ops: a Python op that submits the collective to hpcdl's
// engine without waiting and hands its engine handles to this library under a token (hpcdl_tf_watch),
// this latch on the token, and a Python op that reads the result. So every collective of a graph reaches
// the engine whatever order each rank's executor runs them in.
//
// Who waits. The engine handles are waited for by C++ threads of this library, without Python or its
// GIL, with the engine's deadline (hpcdl_wait with the runtime's timeout); a thread finishes the kernel
// as soon as the operations ended, and then also finishes every other latch whose operations have ended,
// so that one wake-up serves a fused batch. One latch at a time per process waits on the executor thread
// that runs it instead, continuing the graph on that thread without a hand-off, when that cannot keep
// any collective from being submitted: it is the last latch of its graph's execution (every submitting
// op of that execution has run), TensorFlow runs kernels on a pool of at least two threads (so another
// execution always has a thread) and not all inline. That is the common training step, one grouped
// allreduce per step, which so costs one thread wake-up, as a blocking op did.
//
// Failures. A failed or timed-out operation is handed to Python (hpcdl_tf_next_event), which words the
// error and finishes the kernel with a TensorFlow error code (hpcdl_tf_open), so a graph sees the same
// error classes as eager code. When the step is cancelled (another op of it failed), a waiting latch
// finishes at once as cancelled, so the step's error is not held back until this operation's deadline;
// when its operations end, Python is told to release them.
//
// The library knows nothing of the engine but four functions of its C ABI (c_api.h), whose addresses
// Python passes to hpcdl_tf_bind. Compiled against the installed TensorFlow on first use
// (hpcdl/tensorflow/_latch.py).
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace {

using tensorflow::AsyncOpKernel;
using tensorflow::CancellationManager;
using tensorflow::OpKernelContext;

// c_api.h: hpcdl_wait, hpcdl_poll, hpcdl_last_error and HPCDL_OK.
using WaitFn = int (*)(int64_t, double);
using PollFn = int (*)(int64_t);
using LastErrorFn = const char* (*)();
constexpr int kOk = 0;

// An event for Python: a cancelled latch's operations ended (release them); a positive value is the hpcdl
// status of a failed operation.
constexpr int kOrphan = -1;

struct Token {
  std::vector<int64_t> handles;
  int64_t graph = 0;      // identifies the graph the submitting op belongs to
  int32_t graph_ops = 0;  // how many submitting ops that graph has (0: unknown)
  bool preset = false;    // failed before its operations were submitted: finish with `status`
  absl::Status status;
  // Set while its kernel waits:
  OpKernelContext* context = nullptr;
  AsyncOpKernel::DoneCallback done;
  tensorflow::CancellationToken cancellation = CancellationManager::kInvalidToken;
  bool latched = false;    // its kernel ran
  bool cancelled = false;  // its kernel finished as cancelled while the operations ran on
  bool reported = false;   // handed to Python as failed
};

struct Event {
  int64_t token;
  int status;
  std::string message;
};

// Everything this library holds, in one object that is never destroyed: its waiter threads live until the
// process ends, and a condition variable destroyed under a waiting thread would hang the exit.
struct State {
  WaitFn wait = nullptr;  // the runtime's functions (hpcdl_tf_bind)
  PollFn poll = nullptr;
  LastErrorFn last_error = nullptr;
  std::mutex mutex;
  std::unordered_map<int64_t, Token> tokens;
  bool inline_busy = false;                            // a latch waits on its executor thread
  std::map<std::pair<int64_t, int64_t>, int32_t> seen;  // (step id, graph) -> its latches run so far
  std::deque<Event> events;                            // for Python (hpcdl_tf_next_event)
  std::condition_variable events_cv;
  std::deque<int64_t> jobs;  // tokens for the waiter threads
  std::condition_variable jobs_cv;
  int free_waiters = 0;
};
State& g = *new State;
constexpr size_t kSeenLimit = 4096;  // executions that did not run every latch are dropped

absl::Status cancelled_status() {
  return absl::CancelledError("the step was cancelled: another of its ops failed");
}

void post(int64_t key, int status, std::string message) {
  g.events.push_back(Event{key, status, std::move(message)});
  g.events_cv.notify_one();
}

// Finishes the kernel of `key` with `status` (taken from the table under the lock by the caller).
void finish(Token token, const absl::Status& status) {
  CancellationManager* manager = token.context->cancellation_manager();
  // False: the cancellation callback is running; it will not find the kernel waiting and returns.
  if (manager != nullptr && token.cancellation != CancellationManager::kInvalidToken) {
    manager->TryDeregisterCallback(token.cancellation);
  }
  token.context->SetStatus(status);
  token.done();
}

// The operations of `key` ended well: finish its kernel, or tell Python to release them when the kernel
// was cancelled. Returns false when the token is gone or handed to Python.
bool complete(int64_t key) {
  Token token;
  {
    std::lock_guard<std::mutex> lock(g.mutex);
    auto it = g.tokens.find(key);
    if (it == g.tokens.end() || it->second.reported || !it->second.latched) return false;
    if (it->second.cancelled) {
      g.tokens.erase(it);
      post(key, kOrphan, "");
      return false;
    }
    token = std::move(it->second);
    g.tokens.erase(it);
  }
  finish(std::move(token), absl::OkStatus());
  return true;
}

// Finishes the latches (other than `key`) whose operations have all ended well.
void complete_others(int64_t key) {
  std::vector<std::pair<int64_t, std::vector<int64_t>>> candidates;
  {
    std::lock_guard<std::mutex> lock(g.mutex);
    for (const auto& [other, token] : g.tokens) {
      if (other != key && token.latched && !token.cancelled && !token.reported && !token.preset)
        candidates.emplace_back(other, token.handles);
    }
  }
  for (const auto& [other, handles] : candidates) {
    if (std::all_of(handles.begin(), handles.end(), [](int64_t h) { return g.poll(h) == kOk; })) complete(other);
  }
}

// Waits for the operations of `key` with the engine's deadline, then finishes its latch (a failure goes
// to Python, which words it), and every other latch that is ready by then.
void wait_for(int64_t key) {
  std::vector<int64_t> handles;
  {
    std::lock_guard<std::mutex> lock(g.mutex);
    auto it = g.tokens.find(key);
    if (it == g.tokens.end()) return;
    handles = it->second.handles;  // Python releases them only after this latch finished
  }
  for (int64_t handle : handles) {
    const int status = g.wait(handle, -1.0);
    if (status != kOk) {
      const char* message = g.last_error();
      std::lock_guard<std::mutex> lock(g.mutex);
      auto it = g.tokens.find(key);
      if (it == g.tokens.end()) return;
      it->second.reported = true;
      post(key, status, message != nullptr ? message : "");
      return;
    }
  }
  complete(key);
  complete_others(key);
}

void serve() {
  while (true) {
    int64_t key;
    {
      std::unique_lock<std::mutex> lock(g.mutex);
      g.jobs_cv.wait(lock, [] { return !g.jobs.empty(); });
      key = g.jobs.front();
      g.jobs.pop_front();
    }
    wait_for(key);
    std::lock_guard<std::mutex> lock(g.mutex);
    ++g.free_waiters;
  }
}

// Hands `key` to a waiter thread: one per latch in flight, reused, so no latch waits behind another.
void hand_off(int64_t key) {
  std::lock_guard<std::mutex> lock(g.mutex);
  g.jobs.push_back(key);
  if (g.free_waiters > 0) {
    --g.free_waiters;
    g.jobs_cv.notify_one();
  } else {
    std::thread(serve).detach();
  }
}

// True when this is the last latch of its graph's execution (every submitting op of it has run).
bool last_of_execution(int64_t step, const Token& token) {
  if (token.graph_ops <= 0) return false;
  if (token.graph_ops == 1) return true;
  if (g.seen.size() >= kSeenLimit) g.seen.clear();
  const auto key = std::make_pair(step, token.graph);
  if (++g.seen[key] < token.graph_ops) return false;
  g.seen.erase(key);
  return true;
}

// Finishes the kernel of `key` as cancelled (its step failed elsewhere); its operations run on.
void cancel(int64_t key) {
  Token token;
  {
    std::lock_guard<std::mutex> lock(g.mutex);
    auto it = g.tokens.find(key);
    if (it == g.tokens.end() || !it->second.latched || it->second.cancelled) return;
    it->second.cancelled = true;
    token.context = it->second.context;
    token.done = std::move(it->second.done);
    it->second.context = nullptr;
  }
  token.context->SetStatus(cancelled_status());
  token.done();
}

class HpcdlLatchOp : public AsyncOpKernel {
 public:
  explicit HpcdlLatchOp(tensorflow::OpKernelConstruction* context) : AsyncOpKernel(context) {}

  void ComputeAsync(OpKernelContext* context, DoneCallback done) override {
    const tensorflow::Tensor& input = context->input(0);
    OP_REQUIRES_ASYNC(context, tensorflow::TensorShapeUtils::IsScalar(input.shape()),
                      tensorflow::errors::InvalidArgument("HpcdlLatch takes a scalar token"), done);
    context->set_output(0, input);
    const int64_t key = input.scalar<int64_t>()();
    CancellationManager* manager = context->cancellation_manager();
    enum { kWait, kWaitHere, kCancelled, kPreset, kUnknown } action = kWait;
    absl::Status preset;
    {
      std::lock_guard<std::mutex> lock(g.mutex);
      auto it = g.tokens.find(key);
      if (it == g.tokens.end()) {
        action = kUnknown;
      } else if (it->second.preset) {
        preset = it->second.status;
        g.tokens.erase(it);
        action = kPreset;
      } else {
        Token& token = it->second;
        token.latched = true;
        if (manager != nullptr) {
          token.cancellation = manager->get_cancellation_token();
          // False: the step is already cancelled; finish now, and let a waiter release the operations.
          if (!manager->RegisterCallback(token.cancellation, [key] { cancel(key); })) {
            token.cancellation = CancellationManager::kInvalidToken;
            token.cancelled = true;
            action = kCancelled;
          }
        }
        if (action == kWait) {
          token.context = context;
          token.done = std::move(done);
          if (!g.inline_busy && !context->run_all_kernels_inline() &&
              last_of_execution(context->step_id(), token)) {
            g.inline_busy = true;
            action = kWaitHere;
          }
        }
      }
    }
    switch (action) {
      case kUnknown:
        context->SetStatus(tensorflow::errors::Internal("HpcdlLatch: unknown token ", key));
        done();
        return;
      case kPreset:
        context->SetStatus(preset);
        done();
        return;
      case kCancelled:
        context->SetStatus(cancelled_status());
        done();
        hand_off(key);
        return;
      case kWaitHere:
        wait_for(key);
        {
          std::lock_guard<std::mutex> lock(g.mutex);
          g.inline_busy = false;
        }
        return;
      case kWait:
        hand_off(key);
        return;
    }
  }
};

absl::Status status_of(int code, const char* message) {
  if (code == 0) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(code), message != nullptr ? message : "hpcdl error");
}

}  // namespace

REGISTER_OP("HpcdlLatch")
    .Input("token: int64")
    .Output("ready: int64")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape);

REGISTER_KERNEL_BUILDER(Name("HpcdlLatch").Device(tensorflow::DEVICE_CPU), HpcdlLatchOp);

// The runtime's hpcdl_wait, hpcdl_poll and hpcdl_last_error (c_api.h).
extern "C" void hpcdl_tf_bind(void* wait, void* poll, void* last_error) {
  g.wait = reinterpret_cast<WaitFn>(wait);
  g.poll = reinterpret_cast<PollFn>(poll);
  g.last_error = reinterpret_cast<LastErrorFn>(last_error);
}

// Registers the engine handles of `token`, before its latch runs: the latch completes when they all
// ended. `graph` and `graph_ops` (> 0) say which graph the submitting op belongs to and how many
// submitting ops it has (0: unknown). `code` != 0 instead fails the latch with that TensorFlow error code
// and `message` (the collective could not be submitted; no handles).
extern "C" void hpcdl_tf_watch(int64_t token, const int64_t* handles, int count, int64_t graph, int graph_ops,
                               int code, const char* message) {
  Token entry;
  entry.handles.assign(handles, handles + std::max(count, 0));
  entry.graph = graph;
  entry.graph_ops = graph_ops;
  if (code != 0) {
    entry.preset = true;
    entry.status = status_of(code, message);
  }
  std::lock_guard<std::mutex> lock(g.mutex);
  g.tokens[token] = std::move(entry);
}

// The next event for Python, waiting up to `timeout_s`: 0 when none came; kOrphan (-1): the operations
// of `*token`, whose latch was cancelled, ended (release them); else the hpcdl status with which an
// operation of `*token` failed, its message in `message` (truncated to `capacity` bytes, NUL included).
// Called without the GIL (ctypes).
extern "C" int hpcdl_tf_next_event(double timeout_s, int64_t* token, char* message, int capacity) {
  Event event;
  {
    std::unique_lock<std::mutex> lock(g.mutex);
    const auto limit = std::chrono::duration<double>(timeout_s);
    if (!g.events_cv.wait_for(lock, limit, [] { return !g.events.empty(); })) return 0;
    event = std::move(g.events.front());
    g.events.pop_front();
  }
  *token = event.token;
  if (capacity > 0) {
    const size_t length = std::min(event.message.size(), static_cast<size_t>(capacity - 1));
    std::memcpy(message, event.message.data(), length);
    message[length] = '\0';
  }
  return event.status;
}

// Fails the latch of `token` (handed to Python as failed) with `code` (a TensorFlow error code) and
// `message`: 1 when its kernel finished now, -1 when it had been cancelled, 0 when the token is unknown.
// Called without the GIL (ctypes), because finishing a kernel may run the graph's next ops on this thread.
extern "C" int hpcdl_tf_open(int64_t token, int code, const char* message) {
  Token entry;
  {
    std::lock_guard<std::mutex> lock(g.mutex);
    auto it = g.tokens.find(token);
    if (it == g.tokens.end()) return 0;
    if (it->second.cancelled) {
      g.tokens.erase(it);
      return -1;
    }
    entry = std::move(it->second);
    g.tokens.erase(it);
  }
  finish(std::move(entry), status_of(code, message));
  return 1;
}
