#include "engine/output_file.h"

#include <fcntl.h>

#include <cerrno>
#include <cstring>

namespace hpcdl {

Status open_output_file(const std::string& path, const std::string& what, int* fd) {
  *fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (*fd >= 0) return Status::ok();
  if (errno == ELOOP)
    return Status::error(HPCDL_ERR_INVALID, "cannot write the " + what + " to " + path +
                                                ": it is a symbolic link, which hpcdl does not write through; "
                                                "remove it or choose another path");
  return Status::error(HPCDL_ERR_INVALID, "cannot write the " + what + " to " + path + ": " + std::strerror(errno) +
                                              "; choose a writable path");
}

}  // namespace hpcdl
