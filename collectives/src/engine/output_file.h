// Files the runtime writes where the user points it (the timeline, the autotune log, and any other: every
// one is opened here). On a shared cluster they are never written into another user's file nor through a
// link another user could have planted; the same rules as hpcdl/common/output_file.py, which opens the
// files hpcdl's Python writes:
//
// - The parent directories are walked one component at a time from "/" (or the working directory, for a
//   relative path), each opened with O_NOFOLLOW|O_DIRECTORY relative to the one before. A symbolic link on
//   the way is followed only when no other user could have planted or replaced it: the link belongs to the
//   user or root, in a directory that belongs to the user or root and that nobody else may write, or that
//   has the sticky bit (/tmp). A link in a shared directory is refused, not followed.
// - The file is created with O_CREAT|O_EXCL|O_NOFOLLOW, mode 0600, in the directory so opened. A regular
//   file of the user's already at the path is replaced atomically (a new file made beside it is renamed
//   over it: a rerun overwrites its own timeline, and whoever holds the old one open does not see the new
//   contents); a symbolic link there is refused (never written through), and so is another user's file.
// - A refusal is an HPCDL_ERR_INVALID status naming the file, the path, the reason and what to do.
#pragma once

#include <string>

#include "comm.h"

namespace hpcdl {

// Opens a new file at `path` for writing, as above; `what` names it in errors ("timeline").
Status open_output_file(const std::string& path, const std::string& what, int* fd);

}  // namespace hpcdl
