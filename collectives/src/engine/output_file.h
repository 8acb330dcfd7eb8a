// Files the engine writes for the user (the timeline, the autotune log): created with mode 0600 and never
// opened through a symbolic link, so that a link planted at the path in a shared directory cannot make a
// rank write (or truncate) a file it points to.
#pragma once

#include <string>

#include "comm.h"

namespace hpcdl {

// Opens `path` for writing, truncated (created 0600 when missing); `what` names the file in errors.
Status open_output_file(const std::string& path, const std::string& what, int* fd);

}  // namespace hpcdl
