// The thread-local "last error" behind hpcdl_last_error(): every C entry point reports through these.
#pragma once

#include <string>

#include "comm.h"

namespace hpcdl {

// Records the status's message (or clears it on success) and returns its code.
int set_error(const Status& status);
int set_error(int code, const std::string& message);

}  // namespace hpcdl
