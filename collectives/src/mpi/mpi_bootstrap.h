// MPI as a bootstrap (ranks agree on the rendezvous through MPI_Bcast) and as an optional transport.
// Compiled only when CMake found MPI (HPCDL_HAVE_MPI).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm.h"

namespace hpcdl {

// MPI_Init_thread unless MPI is already initialised; reports the world rank and size MPI sees.
Status mpi_bootstrap_init(bool* initialized_here, bool* threads_supported, int* rank, int* size);
// Broadcasts a string from world rank `root` over MPI_COMM_WORLD.
Status mpi_broadcast_string(std::string* text, int root);
void mpi_finalize_if_initialized_here(bool initialized_here);
// A communicator over MPI for the given world ranks (collective over MPI_COMM_WORLD).
Status make_mpi_comm(const std::vector<int>& world_ranks, int my_rank, std::shared_ptr<Comm>* out);

}  // namespace hpcdl
