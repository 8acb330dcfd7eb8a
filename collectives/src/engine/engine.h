// The background engine: named asynchronous operations negotiated across ranks (see c_api.h).
// Owned by the Runtime; created at the end of Runtime::init, stopped at the start of Runtime::shutdown.
#pragma once

#include "comm.h"

namespace hpcdl {

class Runtime;

class Engine {
 public:
  explicit Engine(Runtime& runtime);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  Status start();
  void stop();

 private:
  Runtime& runtime_;
};

}  // namespace hpcdl
