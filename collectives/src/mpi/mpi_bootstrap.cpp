#include <mpi.h>

#include <cstring>
#include <vector>

#include "mpi/mpi_bootstrap.h"

namespace hpcdl {

Status mpi_bootstrap_init(bool* initialized_here, bool* threads_supported, int* rank, int* size) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (finalized)
    return Status::error(HPCDL_ERR_INVALID, "MPI was already finalized in this process; MPI cannot start twice, "
                                            "so re-initialise hpcdl with bootstrap=tcp (a rendezvous address)");
  int provided = MPI_THREAD_SINGLE;
  if (!initialized) {
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
      return Status::error(HPCDL_ERR_INTERNAL, "MPI_Init_thread failed; was this process started by mpirun?");
    *initialized_here = true;
  } else {
    MPI_Query_thread(&provided);
  }
  *threads_supported = provided == MPI_THREAD_MULTIPLE;
  MPI_Comm_rank(MPI_COMM_WORLD, rank);
  MPI_Comm_size(MPI_COMM_WORLD, size);
  return Status::ok();
}

Status mpi_broadcast_string(std::string* text, int root) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int len = int(text->size());
  if (MPI_Bcast(&len, 1, MPI_INT, root, MPI_COMM_WORLD) != MPI_SUCCESS)
    return Status::error(HPCDL_ERR_INTERNAL, "MPI_Bcast of the rendezvous address failed");
  std::vector<char> buf(size_t(len) + 1, '\0');
  if (rank == root) std::memcpy(buf.data(), text->data(), size_t(len));
  if (MPI_Bcast(buf.data(), len, MPI_CHAR, root, MPI_COMM_WORLD) != MPI_SUCCESS)
    return Status::error(HPCDL_ERR_INTERNAL, "MPI_Bcast of the rendezvous address failed");
  text->assign(buf.data(), size_t(len));
  return Status::ok();
}

void mpi_finalize_if_initialized_here(bool initialized_here) {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (initialized_here && !finalized) MPI_Finalize();
}

}  // namespace hpcdl
