#include "mpi/mpi_bootstrap.h"

#include <dlfcn.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <vector>

namespace hpcdl {
namespace {

std::atomic<const hpcdl_mpi_shim*> g_shim{nullptr};
std::mutex g_load;
std::string g_loaded_path;  // guarded by g_load

}  // namespace

Status mpi_load(const std::string& path) {
  std::lock_guard<std::mutex> lock(g_load);
  if (g_shim.load()) {
    if (path.empty() || path == g_loaded_path) return Status::ok();
    return Status::error(HPCDL_ERR_INVALID, "this process already uses the MPI shim " + g_loaded_path +
                                                "; one process can hold one MPI library, so " + path +
                                                " cannot be loaded too");
  }
  if (path.empty())
    return Status::error(HPCDL_ERR_UNSUPPORTED,
                         "no MPI library was loaded for this process (the init option mpi_shim is empty); "
                         "initialise through hpcdl.common, which finds the job's MPI (see hpcdl check-build)");
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* why = dlerror();
    return Status::error(HPCDL_ERR_UNSUPPORTED,
                         "cannot load the MPI shim " + path + ": " + (why ? why : "unknown error") +
                             " (its MPI_* symbols come from the job's libmpi, which must be loaded first and "
                             "be of the shim's family; see hpcdl check-build)");
  }
  auto entry = reinterpret_cast<hpcdl_mpi_shim_entry>(dlsym(handle, HPCDL_MPI_SHIM_SYMBOL));
  const hpcdl_mpi_shim* shim = entry ? entry() : nullptr;
  if (!shim || shim->version != HPCDL_MPI_SHIM_VERSION) {
    dlclose(handle);
    return Status::error(HPCDL_ERR_INTERNAL, path + " is not an MPI shim of this hpcdl version; reinstall hpcdl");
  }
  g_loaded_path = path;
  g_shim.store(shim);  // never unloaded: MPI stays in the process until it exits
  return Status::ok();
}

const hpcdl_mpi_shim* mpi_shim() { return g_shim.load(); }

Status mpi_bootstrap_init(bool* initialized_here, bool* threads_supported, int* rank, int* size) {
  const hpcdl_mpi_shim* mpi = mpi_shim();
  if (!mpi) return mpi_load("");
  if (mpi->finalized())
    return Status::error(HPCDL_ERR_INVALID, "MPI was already finalized in this process; MPI cannot start twice, "
                                            "so re-initialise hpcdl with bootstrap=tcp (a rendezvous address)");
  int multiple = 0;
  if (!mpi->initialized()) {
    if (mpi->init_thread(&multiple) != 0)
      return Status::error(HPCDL_ERR_INTERNAL, "MPI_Init_thread failed; was this process started by mpirun?");
    *initialized_here = true;
  } else {
    mpi->query_thread(&multiple);
  }
  *threads_supported = multiple != 0;
  mpi->world_rank_size(rank, size);
  return Status::ok();
}

Status mpi_broadcast_string(std::string* text, int root) {
  const hpcdl_mpi_shim* mpi = mpi_shim();
  int rank = 0, size = 0;
  mpi->world_rank_size(&rank, &size);
  int len = int(text->size());
  if (mpi->world_bcast(&len, int(sizeof(len)), root) != 0)
    return Status::error(HPCDL_ERR_INTERNAL, "MPI_Bcast of the rendezvous address failed");
  std::vector<char> buf(size_t(len) + 1, '\0');
  if (rank == root) std::memcpy(buf.data(), text->data(), size_t(len));
  if (mpi->world_bcast(buf.data(), len, root) != 0)
    return Status::error(HPCDL_ERR_INTERNAL, "MPI_Bcast of the rendezvous address failed");
  text->assign(buf.data(), size_t(len));
  return Status::ok();
}

void mpi_finalize_if_initialized_here(bool initialized_here) {
  const hpcdl_mpi_shim* mpi = mpi_shim();
  if (mpi && initialized_here && !mpi->finalized()) mpi->finalize();
}

}  // namespace hpcdl
