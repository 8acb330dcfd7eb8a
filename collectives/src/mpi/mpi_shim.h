/*
 * The seam between the runtime and an MPI library chosen at run time.
 *
 * MPI has two binary families that cannot share one compiled object: Open MPI (libmpi.so.40; handles are
 * pointers to library globals) and MPICH with its ABI-compatible derivatives (libmpi.so.12 /
 * libmpich.so.12: Intel MPI, MVAPICH, Cray MPICH; handles are integers). So the runtime itself links no
 * MPI: one small shim per family (mpi_shim.c, compiled against that family's mpi.h and linked against no
 * libmpi) translates these calls into MPI. hpcdl.common loads the job's libmpi with RTLD_GLOBAL, then the
 * runtime dlopens the matching shim, whose MPI_* references resolve against that library.
 *
 * Plain C; handles cross as opaque pointers (an MPICH integer handle is stored in the pointer's bits).
 * Every function returns an MPI error code (0 is MPI_SUCCESS in both families) unless it says otherwise.
 */
#ifndef HPCDL_MPI_SHIM_H
#define HPCDL_MPI_SHIM_H

#ifdef __cplusplus
extern "C" {
#endif

#define HPCDL_MPI_SHIM_VERSION 2
#define HPCDL_MPI_SHIM_SYMBOL "hpcdl_mpi_shim_v1"

typedef struct hpcdl_mpi_shim {
  int version;                /* HPCDL_MPI_SHIM_VERSION */
  const char* family;         /* "Open MPI" or "MPICH": whose mpi.h the shim was compiled against */
  const char* header_version; /* that mpi.h's library version, e.g. "4.1.4" */
  /* MPI_Get_library_version (callable before MPI_Init). */
  int (*library_version)(char* out, int capacity);
  int (*initialized)(void); /* returns 1 or 0 */
  int (*finalized)(void);   /* returns 1 or 0 */
  /* MPI_Init_thread(MPI_THREAD_MULTIPLE); *multiple = whether MPI granted it. */
  int (*init_thread)(int* multiple);
  int (*query_thread)(int* multiple);
  int (*finalize)(void);
  int (*world_rank_size)(int* rank, int* size);
  /* Blocking MPI_Bcast of `bytes` bytes over MPI_COMM_WORLD (the bootstrap's only use of MPI). */
  int (*world_bcast)(void* buf, int bytes, int root);
  /* A communicator over the listed world ranks (collective over MPI_COMM_WORLD), or NULL on failure. */
  int (*comm_create)(const int* world_ranks, int count, void** comm);
  int (*comm_dup)(void* comm, void** out);
  int (*comm_free)(void** comm);
  int (*comm_rank_size)(void* comm, int* rank, int* size);
  /* 1 when MPI reduces this dtype with this op itself (hpcdl enums; AVERAGE is never native). */
  int (*native)(int dtype, int op);
  /* send == recv means in place. Only for native (dtype, op). */
  int (*iallreduce)(const void* send, void* recv, int count, int dtype, int op, void* comm, void** request);
  int (*iallgather)(const void* send, int bytes, void* recv, void* comm, void** request);
  int (*iallgatherv)(const void* send, int bytes, void* recv, const int* counts, const int* displs, void* comm,
                     void** request);
  int (*ibcast)(void* buf, int bytes, int root, void* comm, void** request);
  int (*ialltoallv)(const void* send, const int* send_counts, const int* send_displs, void* recv,
                    const int* recv_counts, const int* recv_displs, void* comm, void** request);
  int (*test)(void** request, int* done);
  /* A zero-byte message to `dest` with `tag`, not waited for. */
  int (*ring)(int dest, int tag, void* comm);
  /* Receives every zero-byte message that has arrived on `comm`, whatever its tag, and hands each one's tag
   * to `taken(context, tag)` (when `taken` is not NULL). */
  int (*take_rings)(void* comm, void (*taken)(void* context, int tag), void* context);
} hpcdl_mpi_shim;

typedef const hpcdl_mpi_shim* (*hpcdl_mpi_shim_entry)(void);

#ifdef __cplusplus
}
#endif

#endif
