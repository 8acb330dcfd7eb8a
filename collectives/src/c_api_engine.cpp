// The engine section of the C ABI (c_api.h): asynchronous named operations, timeline and knobs.
#include <cmath>
#include <limits>
#include <string>

#include "engine/engine.h"
#include "error.h"
#include "hpcdl/c_api.h"
#include "runtime.h"

using namespace hpcdl;

namespace {

Engine* need_engine(int* code) {
  Runtime* rt = current_runtime();
  Engine* engine = rt ? rt->engine() : nullptr;
  if (!engine)
    *code = set_error(HPCDL_ERR_NOT_INITIALIZED, "hpcdl is not initialised: call hpcdl.init() (or hvd.init()) first");
  return engine;
}

}  // namespace

extern "C" {

HPCDL_API hpcdl_handle hpcdl_enqueue(const hpcdl_request* request) {
  int code = HPCDL_OK;
  Engine* engine = need_engine(&code);
  if (!engine) return -code;
  if (request == nullptr) return -set_error(HPCDL_ERR_INVALID, "hpcdl_enqueue: request is NULL");
  int64_t handle = 0;
  Status s = engine->enqueue(*request, &handle);
  if (!s.is_ok()) return -set_error(s);
  set_error(Status::ok());
  return handle;
}

HPCDL_API int hpcdl_run(const hpcdl_request* request, double timeout_s, hpcdl_handle* handle) {
  if (handle == nullptr) return set_error(HPCDL_ERR_INVALID, "hpcdl_run: handle is NULL");
  *handle = 0;
  int code = HPCDL_OK;
  Engine* engine = need_engine(&code);
  if (!engine) return code;
  if (request == nullptr) return set_error(HPCDL_ERR_INVALID, "hpcdl_run: request is NULL");
  Status s = engine->enqueue(*request, handle, /*caller_waits=*/true);
  if (!s.is_ok()) return set_error(s);
  return set_error(engine->wait(*handle, timeout_s));
}

HPCDL_API int hpcdl_poll(hpcdl_handle handle) {
  int code = HPCDL_OK;
  Engine* engine = need_engine(&code);
  if (!engine) return code;
  Status s = engine->poll(handle);
  if (s.code == HPCDL_PENDING) return HPCDL_PENDING;
  return set_error(s);
}

HPCDL_API int hpcdl_wait(hpcdl_handle handle, double timeout_s) {
  int code = HPCDL_OK;
  Engine* engine = need_engine(&code);
  if (!engine) return code;
  return set_error(engine->wait(handle, timeout_s));
}

HPCDL_API int hpcdl_output(hpcdl_handle handle, void** data, int64_t* nbytes, int64_t* shape) {
  int code = HPCDL_OK;
  Engine* engine = need_engine(&code);
  if (!engine) return code;
  return set_error(engine->output(handle, data, nbytes, shape));
}

// Returns the number of set members (>= 0), or a negative status.
HPCDL_API int hpcdl_received_splits(hpcdl_handle handle, int64_t* splits, int capacity) {
  int code = HPCDL_OK;
  Engine* engine = need_engine(&code);
  if (!engine) return -code;
  if (splits == nullptr && capacity > 0) return -set_error(HPCDL_ERR_INVALID, "hpcdl_received_splits: splits is NULL");
  int count = 0;
  Status s = engine->received_splits(handle, splits, capacity, &count);
  if (!s.is_ok()) return -set_error(s);
  set_error(Status::ok());
  return count;
}

// Returns the last rank to join (>= 0), or a negative status.
HPCDL_API int hpcdl_join_result(hpcdl_handle handle) {
  int code = HPCDL_OK;
  Engine* engine = need_engine(&code);
  if (!engine) return -code;
  int rank = -1;
  Status s = engine->join_result(handle, &rank);
  if (!s.is_ok()) return -set_error(s);
  set_error(Status::ok());
  return rank;
}

HPCDL_API int hpcdl_release(hpcdl_handle handle) {
  Runtime* rt = current_runtime();
  Engine* engine = rt ? rt->engine() : nullptr;
  if (!engine) return set_error(Status::ok());  // after shutdown every handle is already gone
  return set_error(engine->release(handle));
}

HPCDL_API int hpcdl_new_group_id(int process_set) {
  int code = HPCDL_OK;
  Engine* engine = need_engine(&code);
  if (!engine) return -code;
  set_error(Status::ok());
  return engine->new_group_id(process_set);
}

// Returns the batch's length in words (> 0), 0 when none came in time, or a negative status.
HPCDL_API int hpcdl_device_next(double timeout_s, int64_t* batch, int capacity) {
  int code = HPCDL_OK;
  Engine* engine = need_engine(&code);
  if (!engine) return -code;
  if (batch == nullptr || capacity < HPCDL_DEVICE_HEADER_WORDS)
    return -set_error(HPCDL_ERR_INVALID, "hpcdl_device_next: batch must hold at least " +
                                             std::to_string(HPCDL_DEVICE_HEADER_WORDS) + " words");
  int length = 0;
  Status s = engine->device_next(timeout_s < 0 ? 0 : timeout_s, batch, capacity, &length);
  if (!s.is_ok()) return -set_error(s);
  set_error(Status::ok());
  return length;
}

HPCDL_API int hpcdl_device_done(int64_t batch_id, int status, const char* message, const int64_t* times_ns) {
  int code = HPCDL_OK;
  Engine* engine = need_engine(&code);
  if (!engine) return code;
  return set_error(engine->device_done(batch_id, status, message ? message : "", times_ns));
}

HPCDL_API int hpcdl_device_interrupt(void) {
  int code = HPCDL_OK;
  Engine* engine = need_engine(&code);
  if (!engine) return code;
  engine->device_interrupt();
  return set_error(Status::ok());
}

HPCDL_API int hpcdl_start_timeline(const char* path, int mark_cycles) {
  int code = HPCDL_OK;
  Engine* engine = need_engine(&code);
  if (!engine) return code;
  return set_error(engine->start_timeline(path ? path : "", mark_cycles != 0));
}

HPCDL_API int hpcdl_stop_timeline(void) {
  int code = HPCDL_OK;
  Engine* engine = need_engine(&code);
  if (!engine) return code;
  return set_error(engine->stop_timeline());
}

HPCDL_API int hpcdl_flight_dump(const char* reason, const char* message) {
  int code = HPCDL_OK;
  Engine* engine = need_engine(&code);
  if (!engine) return code;
  return set_error(engine->flight_dump(reason ? reason : "request", message ? message : ""));
}

// NaN when the name is unknown or the runtime is not initialised (hpcdl_last_error says which).
HPCDL_API double hpcdl_get_knob(const char* name) {
  int code = HPCDL_OK;
  Engine* engine = need_engine(&code);
  if (!engine) return std::numeric_limits<double>::quiet_NaN();
  double value = 0;
  if (name == nullptr || !engine->knob(name, &value)) {
    set_error(HPCDL_ERR_INVALID, std::string("unknown engine knob '") + (name ? name : "") +
                                     "'; known: fusion_threshold, cycle_time_ms, small_message_bytes, cache_capacity");
    return std::numeric_limits<double>::quiet_NaN();
  }
  set_error(Status::ok());
  return value;
}

}  // extern "C"
