// MPI as a bootstrap (ranks agree on the rendezvous through MPI_Bcast) and as an optional transport, over
// the MPI library the job has, reached through the shim of its family (see mpi_shim.h).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm.h"
#include "mpi/mpi_shim.h"

namespace hpcdl {

// Loads the MPI shim at `path` (the init option mpi_shim: hpcdl.common has already loaded the job's libmpi
// with RTLD_GLOBAL) unless one is loaded. A process holds one MPI library for its whole life (MPI cannot be
// initialised twice), so the loaded shim outlives any one runtime; loading another afterwards is refused.
Status mpi_load(const std::string& path);
// The loaded shim, or nullptr.
const hpcdl_mpi_shim* mpi_shim();

// MPI_Init_thread unless MPI is already initialised; reports the world rank and size MPI sees.
Status mpi_bootstrap_init(bool* initialized_here, bool* threads_supported, int* rank, int* size);
// Broadcasts a string from world rank `root` over MPI_COMM_WORLD.
Status mpi_broadcast_string(std::string* text, int root);
void mpi_finalize_if_initialized_here(bool initialized_here);
// A communicator over MPI for the given world ranks (collective over MPI_COMM_WORLD).
Status make_mpi_comm(const std::vector<int>& world_ranks, int my_rank, std::shared_ptr<Comm>* out);

}  // namespace hpcdl
