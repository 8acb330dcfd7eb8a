// HpcdlLatch: the one compiled piece of hpcdl.tensorflow, an asynchronous TensorFlow kernel that holds
// no executor thread while a collective is in flight.
//
// In a graph, every hpcdl collective is three ops: a Python op that submits the collective to hpcdl's
// engine without waiting and returns a token, this latch on the token, and a Python op that reads the
// result. The latch returns at once from ComputeAsync; TensorFlow's executor carries on with the rest of
// the graph (so every collective of the graph reaches the engine, whatever order each rank's executor
// picks), and the kernel finishes when hpcdl's waiter thread, which waits for the operation with the
// engine's deadline, calls hpcdl_tf_open(token). The latch knows nothing of the engine: a failed or
// timed-out operation opens it too, and the reading op raises hpcdl's error.
//
// Compiled against the installed TensorFlow on first use (hpcdl/tensorflow/_latch.py).
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/common_shape_fns.h"

namespace {

using tensorflow::AsyncOpKernel;

std::mutex g_mutex;
// Tokens whose kernel is waiting, with the callback that finishes it.
std::unordered_map<int64_t, AsyncOpKernel::DoneCallback> g_waiting;
// Tokens opened before their kernel ran.
std::unordered_set<int64_t> g_open;

class HpcdlLatchOp : public AsyncOpKernel {
 public:
  explicit HpcdlLatchOp(tensorflow::OpKernelConstruction* context) : AsyncOpKernel(context) {}

  void ComputeAsync(tensorflow::OpKernelContext* context, DoneCallback done) override {
    const tensorflow::Tensor& token = context->input(0);
    OP_REQUIRES_ASYNC(context, tensorflow::TensorShapeUtils::IsScalar(token.shape()),
                      tensorflow::errors::InvalidArgument("HpcdlLatch takes a scalar token"), done);
    context->set_output(0, token);
    const int64_t key = token.scalar<int64_t>()();
    {
      std::lock_guard<std::mutex> lock(g_mutex);
      if (g_open.erase(key) == 0) {
        g_waiting.emplace(key, std::move(done));
        return;
      }
    }
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

// Opens the latch of `token`: finishes its kernel now, or as soon as it runs. Called without the GIL
// (ctypes), because finishing a kernel may run the graph's next ops on this thread.
extern "C" int hpcdl_tf_open(int64_t token) {
  AsyncOpKernel::DoneCallback done;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = g_waiting.find(token);
    if (it == g_waiting.end()) {
      g_open.insert(token);
      return 0;
    }
    done = std::move(it->second);
    g_waiting.erase(it);
  }
  done();
  return 1;
}
