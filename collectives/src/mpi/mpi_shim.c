/*
 * One MPI family's side of mpi_shim.h. Compiled once per family against that family's mpi.h (CMake:
 * _mpi_openmpi.so, _mpi_mpich.so) and linked against no libmpi: its MPI_* references are resolved when it
 * is loaded, against the libmpi that hpcdl.common loaded into the process with RTLD_GLOBAL.
 */
#include <mpi.h>
#include <string.h>

#include "hpcdl/c_api.h"
#include "mpi/mpi_shim.h"

#define SHIM_STR2(x) #x
#define SHIM_STR(x) SHIM_STR2(x)

#if defined(OPEN_MPI)
#define SHIM_FAMILY "Open MPI"
#define SHIM_HEADER_VERSION SHIM_STR(OMPI_MAJOR_VERSION) "." SHIM_STR(OMPI_MINOR_VERSION) "." SHIM_STR(OMPI_RELEASE_VERSION)
#elif defined(MPICH_VERSION)
#define SHIM_FAMILY "MPICH"
#define SHIM_HEADER_VERSION MPICH_VERSION
#else
#error "mpi.h is neither Open MPI's nor MPICH's"
#endif

_Static_assert(sizeof(MPI_Comm) <= sizeof(void*), "an MPI_Comm must fit in a pointer");
_Static_assert(sizeof(MPI_Request) <= sizeof(void*), "an MPI_Request must fit in a pointer");

static void* from_comm(MPI_Comm c) {
  void* p = NULL;
  memcpy(&p, &c, sizeof c);
  return p;
}
static MPI_Comm to_comm(void* p) {
  MPI_Comm c;
  memcpy(&c, &p, sizeof c);
  return c;
}
static void* from_request(MPI_Request r) {
  void* p = NULL;
  memcpy(&p, &r, sizeof r);
  return p;
}
static MPI_Request to_request(void* p) {
  MPI_Request r;
  memcpy(&r, &p, sizeof r);
  return r;
}

static MPI_Datatype mpi_type(int dtype) {
  switch (dtype) {
    case HPCDL_UINT8: return MPI_UINT8_T;
    case HPCDL_INT8: return MPI_INT8_T;
    case HPCDL_INT16: return MPI_INT16_T;
    case HPCDL_INT32: return MPI_INT32_T;
    case HPCDL_INT64: return MPI_INT64_T;
    case HPCDL_FLOAT32: return MPI_FLOAT;
    case HPCDL_FLOAT64: return MPI_DOUBLE;
    default: return MPI_DATATYPE_NULL; /* float16, bfloat16, bool: reduced by hpcdl's kernels */
  }
}

static MPI_Op mpi_op(int op) {
  switch (op) {
    case HPCDL_SUM: return MPI_SUM;
    case HPCDL_MIN: return MPI_MIN;
    case HPCDL_MAX: return MPI_MAX;
    case HPCDL_PRODUCT: return MPI_PROD;
    default: return MPI_OP_NULL;
  }
}

static int library_version(char* out, int capacity) {
  char text[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  int rc = MPI_Get_library_version(text, &len);
  if (capacity > 0) {
    int n = rc == MPI_SUCCESS ? (len < capacity - 1 ? len : capacity - 1) : 0;
    memcpy(out, text, (size_t)n);
    out[n] = '\0';
  }
  return rc;
}

static int initialized(void) {
  int flag = 0;
  MPI_Initialized(&flag);
  return flag != 0;
}

static int finalized(void) {
  int flag = 0;
  MPI_Finalized(&flag);
  return flag != 0;
}

static int init_thread(int* multiple) {
  int provided = MPI_THREAD_SINGLE;
  int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
  *multiple = provided == MPI_THREAD_MULTIPLE;
  return rc;
}

static int query_thread(int* multiple) {
  int provided = MPI_THREAD_SINGLE;
  int rc = MPI_Query_thread(&provided);
  *multiple = provided == MPI_THREAD_MULTIPLE;
  return rc;
}

static int finalize(void) { return MPI_Finalize(); }

static int world_rank_size(int* rank, int* size) {
  int rc = MPI_Comm_rank(MPI_COMM_WORLD, rank);
  return rc != MPI_SUCCESS ? rc : MPI_Comm_size(MPI_COMM_WORLD, size);
}

static int world_bcast(void* buf, int bytes, int root) { return MPI_Bcast(buf, bytes, MPI_BYTE, root, MPI_COMM_WORLD); }

static int comm_create(const int* world_ranks, int count, void** comm) {
  MPI_Group world_group, group;
  MPI_Comm out = MPI_COMM_NULL;
  MPI_Comm_group(MPI_COMM_WORLD, &world_group);
  MPI_Group_incl(world_group, count, world_ranks, &group);
  int rc = MPI_Comm_create_group(MPI_COMM_WORLD, group, 0, &out);
  MPI_Group_free(&group);
  MPI_Group_free(&world_group);
  *comm = out == MPI_COMM_NULL ? NULL : from_comm(out);
  return rc;
}

static int comm_dup(void* comm, void** out) {
  MPI_Comm dup = MPI_COMM_NULL;
  int rc = MPI_Comm_dup(to_comm(comm), &dup);
  *out = from_comm(dup);
  return rc;
}

static int comm_free(void** comm) {
  MPI_Comm c = to_comm(*comm);
  int rc = MPI_Comm_free(&c);
  *comm = NULL;
  return rc;
}

static int comm_rank_size(void* comm, int* rank, int* size) {
  int rc = MPI_Comm_rank(to_comm(comm), rank);
  return rc != MPI_SUCCESS ? rc : MPI_Comm_size(to_comm(comm), size);
}

static int native(int dtype, int op) { return mpi_type(dtype) != MPI_DATATYPE_NULL && mpi_op(op) != MPI_OP_NULL; }

static int iallreduce(const void* send, void* recv, int count, int dtype, int op, void* comm, void** request) {
  MPI_Request r = MPI_REQUEST_NULL;
  int rc = MPI_Iallreduce(send == recv ? MPI_IN_PLACE : send, recv, count, mpi_type(dtype), mpi_op(op),
                          to_comm(comm), &r);
  *request = from_request(r);
  return rc;
}

static int iallgather(const void* send, int bytes, void* recv, void* comm, void** request) {
  MPI_Request r = MPI_REQUEST_NULL;
  int rc = MPI_Iallgather(send, bytes, MPI_BYTE, recv, bytes, MPI_BYTE, to_comm(comm), &r);
  *request = from_request(r);
  return rc;
}

static int iallgatherv(const void* send, int bytes, void* recv, const int* counts, const int* displs, void* comm,
                       void** request) {
  MPI_Request r = MPI_REQUEST_NULL;
  int rc = MPI_Iallgatherv(send, bytes, MPI_BYTE, recv, counts, displs, MPI_BYTE, to_comm(comm), &r);
  *request = from_request(r);
  return rc;
}

static int ibcast(void* buf, int bytes, int root, void* comm, void** request) {
  MPI_Request r = MPI_REQUEST_NULL;
  int rc = MPI_Ibcast(buf, bytes, MPI_BYTE, root, to_comm(comm), &r);
  *request = from_request(r);
  return rc;
}

static int ialltoallv(const void* send, const int* send_counts, const int* send_displs, void* recv,
                      const int* recv_counts, const int* recv_displs, void* comm, void** request) {
  MPI_Request r = MPI_REQUEST_NULL;
  int rc = MPI_Ialltoallv(send, send_counts, send_displs, MPI_BYTE, recv, recv_counts, recv_displs, MPI_BYTE,
                          to_comm(comm), &r);
  *request = from_request(r);
  return rc;
}

static int test(void** request, int* done) {
  MPI_Request r = to_request(*request);
  int rc = MPI_Test(&r, done, MPI_STATUS_IGNORE);
  *request = from_request(r);
  return rc;
}

static int ring(int dest, int tag, void* comm) {
  MPI_Request r = MPI_REQUEST_NULL;
  int rc = MPI_Isend(NULL, 0, MPI_BYTE, dest, tag, to_comm(comm), &r);
  return rc != MPI_SUCCESS ? rc : MPI_Request_free(&r);
}

static int take_rings(void* comm, void (*taken)(void* context, int tag), void* context) {
  int flag = 1, rc = MPI_SUCCESS;
  while (flag && rc == MPI_SUCCESS) {
    MPI_Status status;
    rc = MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, to_comm(comm), &flag, &status);
    if (rc == MPI_SUCCESS && flag) {
      rc = MPI_Recv(NULL, 0, MPI_BYTE, status.MPI_SOURCE, status.MPI_TAG, to_comm(comm), MPI_STATUS_IGNORE);
      if (rc == MPI_SUCCESS && taken) taken(context, status.MPI_TAG);
    }
  }
  return rc;
}

static const hpcdl_mpi_shim kShim = {
    HPCDL_MPI_SHIM_VERSION, SHIM_FAMILY,    SHIM_HEADER_VERSION, library_version, initialized, finalized,
    init_thread,            query_thread,   finalize,            world_rank_size, world_bcast, comm_create,
    comm_dup,               comm_free,      comm_rank_size,      native,          iallreduce,  iallgather,
    iallgatherv,            ibcast,         ialltoallv,          test,            ring,        take_rings,
};

HPCDL_API const hpcdl_mpi_shim* hpcdl_mpi_shim_v1(void) { return &kShim; }
