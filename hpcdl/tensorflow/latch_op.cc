// HpcdlLatch: the one compiled piece of hpcdl.tensorflow, an asynchronous TensorFlow kernel that holds
// no executor thread while a collective is in flight.
//
// In a graph, every hpcdl collective is three ops: a Python op that submits the collective to hpcdl's
// engine without waiting and returns a token, this latch on the token, and a Python op that reads the
// result. The latch returns at once from ComputeAsync; TensorFlow's executor carries on with the rest of
// the graph (so every collective of the graph reaches the engine, whatever order each rank's executor
// picks), and the kernel finishes when hpcdl's waiter thread, which waits for the operation with the
// engine's deadline, calls hpcdl_tf_open(token, code, message). The latch knows nothing of the engine: a
// failed or timed-out operation opens it with the TensorFlow error code and message hpcdl chose, which
// the latch's op then fails with (so a graph sees the same error classes as eager code).
//
// When the step is cancelled (another op of it failed), a waiting latch finishes at once as cancelled, so
// the step's error is not held back until this operation's deadline; the waiter's later opening is then
// dropped.
//
// Compiled against the installed TensorFlow on first use (hpcdl/tensorflow/_latch.py).
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/common_shape_fns.h"

namespace {

using tensorflow::AsyncOpKernel;
using tensorflow::OpKernelContext;

struct Waiting {
  OpKernelContext* context;
  AsyncOpKernel::DoneCallback done;
  tensorflow::CancellationToken cancellation;
};

std::mutex g_mutex;
// Tokens whose kernel is waiting.
std::unordered_map<int64_t, Waiting> g_waiting;
// Tokens opened before their kernel ran: the status to finish with.
std::unordered_map<int64_t, absl::Status> g_open;
// Tokens whose kernel finished as cancelled before they were opened.
std::unordered_set<int64_t> g_cancelled;

// Finishes a waiting kernel as cancelled (its step failed elsewhere).
void cancel(int64_t key) {
  Waiting waiting;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = g_waiting.find(key);
    if (it == g_waiting.end()) return;  // opened meanwhile
    waiting = std::move(it->second);
    g_waiting.erase(it);
    g_cancelled.insert(key);
  }
  waiting.context->SetStatus(absl::CancelledError("the step was cancelled: another of its ops failed"));
  waiting.done();
}

absl::Status status_of(int code, const char* message) {
  if (code == 0) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(code), message != nullptr ? message : "hpcdl error");
}

class HpcdlLatchOp : public AsyncOpKernel {
 public:
  explicit HpcdlLatchOp(tensorflow::OpKernelConstruction* context) : AsyncOpKernel(context) {}

  void ComputeAsync(OpKernelContext* context, DoneCallback done) override {
    const tensorflow::Tensor& token = context->input(0);
    OP_REQUIRES_ASYNC(context, tensorflow::TensorShapeUtils::IsScalar(token.shape()),
                      tensorflow::errors::InvalidArgument("HpcdlLatch takes a scalar token"), done);
    context->set_output(0, token);
    const int64_t key = token.scalar<int64_t>()();
    tensorflow::CancellationManager* manager = context->cancellation_manager();
    absl::Status status;
    {
      std::lock_guard<std::mutex> lock(g_mutex);
      auto it = g_open.find(key);
      if (it == g_open.end()) {
        tensorflow::CancellationToken cancellation = tensorflow::CancellationManager::kInvalidToken;
        if (manager != nullptr) {
          cancellation = manager->get_cancellation_token();
          // False: the step is already cancelled; finish now (below, outside the lock).
          if (!manager->RegisterCallback(cancellation, [key] { cancel(key); })) {
            g_cancelled.insert(key);
            status = absl::CancelledError("the step was cancelled: another of its ops failed");
          }
        }
        if (status.ok()) {
          g_waiting.emplace(key, Waiting{context, std::move(done), cancellation});
          return;
        }
      } else {
        status = std::move(it->second);
        g_open.erase(it);
      }
    }
    context->SetStatus(status);
    done();
  }
};

}  // namespace

REGISTER_OP("HpcdlLatch")
    .Input("token: int64")
    .Output("ready: int64")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape);

REGISTER_KERNEL_BUILDER(Name("HpcdlLatch").Device(tensorflow::DEVICE_CPU), HpcdlLatchOp);

// Opens the latch of `token`: finishes its kernel now (returns 1), or as soon as it runs (0), with `code`
// (a TensorFlow error code, 0 for success) and `message`; -1 when its kernel was cancelled (the result
// will not be read). Called without the GIL (ctypes), because finishing a kernel
// may run the graph's next ops on this thread.
extern "C" int hpcdl_tf_open(int64_t token, int code, const char* message) {
  Waiting waiting;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (g_cancelled.erase(token) > 0) return -1;
    auto it = g_waiting.find(token);
    if (it == g_waiting.end()) {
      g_open.emplace(token, status_of(code, message));
      return 0;
    }
    waiting = std::move(it->second);
    g_waiting.erase(it);
  }
  tensorflow::CancellationManager* manager = waiting.context->cancellation_manager();
  // False: the cancellation callback is running; it will not find the token and returns.
  if (manager != nullptr && waiting.cancellation != tensorflow::CancellationManager::kInvalidToken) {
    manager->TryDeregisterCallback(waiting.cancellation);
  }
  waiting.context->SetStatus(status_of(code, message));
  waiting.done();
  return 1;
}
