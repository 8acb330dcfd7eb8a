#include "engine/output_file.h"

#include <fcntl.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <vector>

#include "crypto/sha256.h"

namespace hpcdl {
namespace {

constexpr int kMaxLinks = 40;  // as the kernel: more links than this on one path is a loop
constexpr int kDirectoryFlags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;
constexpr int kCreateFlags = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;

std::string user_text(uid_t uid) {
  std::vector<char> buffer(16384);
  passwd entry{};
  passwd* found = nullptr;
  if (getpwuid_r(uid, &entry, buffer.data(), buffer.size(), &found) == 0 && found != nullptr)
    return "user " + std::string(found->pw_name) + " (uid " + std::to_string(uid) + ")";
  return "uid " + std::to_string(uid);
}

bool trusted_owner(uid_t uid) { return uid == 0 || uid == geteuid(); }

std::string mode_text(mode_t mode) {
  char text[8];
  std::snprintf(text, sizeof(text), "%o", unsigned(mode & 07777));
  return text;
}

// Why the link `name` in directory `dir` may have been planted or replaced by another user ("" : it may not).
std::string untrusted_link(int dir, const char* name) {
  struct stat link {}, parent{};
  if (fstatat(dir, name, &link, AT_SYMLINK_NOFOLLOW) != 0 || fstat(dir, &parent) != 0)
    return std::string("it cannot be examined (") + std::strerror(errno) + ")";
  if (!trusted_owner(link.st_uid)) return "it belongs to " + user_text(link.st_uid);
  if (!trusted_owner(parent.st_uid))
    return "it is in a directory another user could change: it belongs to " + user_text(parent.st_uid);
  if ((parent.st_mode & (S_IWGRP | S_IWOTH)) && !(parent.st_mode & S_ISVTX))
    return "it is in a directory another user could change: others may write it (mode " + mode_text(parent.st_mode) +
           ", without the sticky bit)";
  return "";
}

std::deque<std::string> components(const std::string& path) {
  std::deque<std::string> parts;
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    std::string part = path.substr(start, end - start);
    if (!part.empty() && part != ".") parts.push_back(part);
    start = end + 1;
  }
  return parts;
}

std::string joined(const std::string& shown, const std::string& name) {
  if (shown.empty()) return name;
  return shown.back() == '/' ? shown + name : shown + "/" + name;
}

class Walk {
 public:
  Walk(const std::string& path, const std::string& what) : path_(path), what_(what) {}

  Status refuse(const std::string& why, const std::string& fix) const {
    return Status::error(HPCDL_ERR_INVALID, "cannot write the " + what_ + " to " + path_ + ": " + why + "; " + fix);
  }

  // Opens the directory `parent` (the path's directory part) without following an untrusted link.
  Status open_parent(const std::string& parent, int* out) const {
    const bool absolute = !path_.empty() && path_[0] == '/';
    std::string shown = absolute ? "/" : "";
    int fd = ::open(absolute ? "/" : ".", kDirectoryFlags);
    if (fd < 0) return refuse(std::strerror(errno), "choose a path you may write");
    std::deque<std::string> pending = components(parent);
    int links = 0;
    while (!pending.empty()) {
      const std::string name = pending.front();
      pending.pop_front();
      int next = ::openat(fd, name.c_str(), kDirectoryFlags);
      if (next >= 0) {
        ::close(fd);
        fd = next;
        shown = joined(shown, name);
        continue;
      }
      const int err = errno;
      struct stat entry {};
      if (err == ENOENT || fstatat(fd, name.c_str(), &entry, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISLNK(entry.st_mode)) {
        ::close(fd);
        if (err == ENOENT)
          return refuse("the directory " + joined(shown, name) + " does not exist (" + std::strerror(err) + ")",
                        "create it or choose another path");
        return refuse(joined(shown, name) + " is not a usable directory (" + std::strerror(err) + ")",
                      "choose another path");
      }
      std::vector<char> target(size_t(entry.st_size) + 2);
      const ssize_t length = readlinkat(fd, name.c_str(), target.data(), target.size() - 1);
      const int read_errno = errno;
      const std::string why = length < 0 ? "" : untrusted_link(fd, name.c_str());
      if (length < 0 || !why.empty() || ++links > kMaxLinks) {
        ::close(fd);
        if (length < 0) return refuse(joined(shown, name) + ": " + std::strerror(read_errno), "choose another path");
        if (links > kMaxLinks) return refuse("too many levels of symbolic links", "choose another path");
        return refuse(joined(shown, name) + " is a symbolic link (to " + std::string(target.data(), size_t(length)) +
                          ") that another user could have planted or replaced (" + why +
                          "), which hpcdl does not follow",
                      "give a path without it (where it should lead, if you made it)");
      }
      const std::string to(target.data(), size_t(length));
      std::deque<std::string> more = components(to);
      pending.insert(pending.begin(), more.begin(), more.end());
      if (!to.empty() && to[0] == '/') {
        ::close(fd);
        fd = ::open("/", kDirectoryFlags);
        shown = "/";
        if (fd < 0) return refuse(std::strerror(errno), "choose a path you may write");
      }
    }
    *out = fd;
    return Status::ok();
  }

  // A new file `name` in `dir`: created exclusively; a regular file of the user's replaced atomically.
  Status create(int dir, const std::string& name, int* out) const {
    int fd = ::openat(dir, name.c_str(), kCreateFlags, 0600);
    if (fd >= 0) {
      *out = fd;
      return Status::ok();
    }
    if (errno != EEXIST) return refuse(std::strerror(errno), "choose a path you may write");
    struct stat there {};
    if (fstatat(dir, name.c_str(), &there, AT_SYMLINK_NOFOLLOW) != 0)
      return refuse(std::strerror(errno), "choose a path you may write");
    if (S_ISLNK(there.st_mode))
      return refuse("it is a symbolic link, which hpcdl does not write through (nor replace)",
                    "remove it or choose another path");
    if (there.st_uid != geteuid())
      return refuse("a file of " + user_text(there.st_uid) + " is there, which hpcdl neither writes into nor "
                    "replaces", "remove it (or have it removed) or choose another path");
    if (!S_ISREG(there.st_mode)) return refuse("it is not a regular file", "give the path of a file");
    uint8_t random[6];
    Status st = random_bytes(random, sizeof(random));
    if (!st.is_ok()) return st;
    std::string temporary = "." + name + ".";
    for (uint8_t byte : random) {
      const char* hex = "0123456789abcdef";
      temporary += hex[byte >> 4];
      temporary += hex[byte & 15];
    }
    fd = ::openat(dir, temporary.c_str(), kCreateFlags, 0600);
    if (fd < 0) return refuse(std::strerror(errno), "choose a path you may write");
    if (::renameat(dir, temporary.c_str(), dir, name.c_str()) != 0) {
      const int err = errno;
      ::close(fd);
      ::unlinkat(dir, temporary.c_str(), 0);
      return refuse(std::strerror(err), "choose a path you may write");
    }
    *out = fd;
    return Status::ok();
  }

 private:
  std::string path_;
  std::string what_;
};

}  // namespace

Status open_output_file(const std::string& path, const std::string& what, int* fd) {
  *fd = -1;
  Walk walk(path, what);
  const size_t slash = path.rfind('/');
  const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  if (name.empty() || name == "." || name == "..") return walk.refuse("it names a directory", "give the path of a file");
  const std::string parent = slash == std::string::npos ? "" : path.substr(0, slash);
  int dir = -1;
  Status st = walk.open_parent(parent, &dir);
  if (!st.is_ok()) return st;
  st = walk.create(dir, name, fd);
  ::close(dir);
  return st;
}

}  // namespace hpcdl
