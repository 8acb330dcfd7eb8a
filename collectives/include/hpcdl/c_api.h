/*
 * hpcdl collective runtime: the C ABI.
 *
 * This header is the whole contract between the compiled runtime and its callers (hpcdl.common loads
 * the library with ctypes). It is plain C: no C++ types cross it, every function returns a status or a
 * value, and the text of the last error on the calling thread is available from hpcdl_last_error().
 *
 * Two ways to run a collective:
 *   - the direct path (hpcdl_allreduce, ...): blocking, on the caller's thread, over a communicator
 *     channel of its own; no negotiation, no fusion. Used for latency-critical single collectives and
 *     for benchmarking the data plane.
 *   - the engine path (hpcdl_enqueue + hpcdl_poll/hpcdl_wait, or hpcdl_run for a blocking call):
 *     asynchronous, named operations that a background thread negotiates across ranks, validates, fuses
 *     and records in the timeline.
 * Both may be used in the same job; they never share a channel, so they cannot cross-talk.
 *
 * Every blocking call has a deadline (the init option timeout_s, or an explicit argument); on expiry it
 * returns HPCDL_ERR_TIMEOUT with a message naming the ranks and the operation it waited for.
 */
#ifndef HPCDL_C_API_H
#define HPCDL_C_API_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define HPCDL_ABI_VERSION 3

#if defined(__GNUC__)
#define HPCDL_API __attribute__((visibility("default")))
#else
#define HPCDL_API
#endif

/* ---- status codes ------------------------------------------------------------------------------ */
typedef enum {
  HPCDL_OK = 0,
  HPCDL_ERR_INVALID = 1,       /* bad argument from the caller (unknown dtype, negative count, ...) */
  HPCDL_ERR_NOT_INITIALIZED = 2,
  HPCDL_ERR_TIMEOUT = 3,       /* a deadline expired; message names the missing ranks and the op */
  HPCDL_ERR_PEER_LOST = 4,     /* a peer closed its connection or died; message names the rank */
  HPCDL_ERR_MISMATCH = 5,      /* ranks disagreed on shape/dtype/op/root for one name */
  HPCDL_ERR_AUTH = 6,          /* rendezvous authentication failed */
  HPCDL_ERR_UNSUPPORTED = 7,   /* e.g. transport=mpi where no MPI library could be loaded */
  HPCDL_ERR_SHUTDOWN = 8,      /* runtime is shutting down / was shut down (also: stall shutdown) */
  HPCDL_ERR_INTERNAL = 9,
  HPCDL_PENDING = 10,          /* hpcdl_poll: not finished yet */
  HPCDL_ERR_JOINED = 11        /* an engine operation other than allreduce/barrier met a joined rank */
} hpcdl_status;

/* ---- data types (values are stable; Python mirrors them) ------------------------------------- */
typedef enum {
  HPCDL_UINT8 = 0,
  HPCDL_INT8 = 1,
  HPCDL_INT16 = 2,
  HPCDL_INT32 = 3,
  HPCDL_INT64 = 4,
  HPCDL_FLOAT16 = 5,
  HPCDL_BFLOAT16 = 6,
  HPCDL_FLOAT32 = 7,
  HPCDL_FLOAT64 = 8,
  HPCDL_BOOL = 9
} hpcdl_dtype;

/* ---- reduction operators ---------------------------------------------------------------------- */
typedef enum {
  HPCDL_SUM = 0,
  HPCDL_AVERAGE = 1,   /* sum, then divided by the number of contributing ranks */
  HPCDL_MIN = 2,
  HPCDL_MAX = 3,
  HPCDL_PRODUCT = 4
} hpcdl_reduce_op;
/* bool: SUM/MAX = logical or, MIN/PRODUCT = logical and. Integer AVERAGE truncates toward zero.
 * float16/bfloat16 are accumulated in float32. prescale multiplies each input before the reduction,
 * postscale the result after it (both in the accumulation type). */

/* ---- collective kinds ------------------------------------------------------------------------- */
typedef enum {
  HPCDL_OP_ALLREDUCE = 0,
  HPCDL_OP_ALLGATHER = 1,
  HPCDL_OP_BROADCAST = 2,
  HPCDL_OP_ALLTOALL = 3,
  HPCDL_OP_REDUCESCATTER = 4,
  HPCDL_OP_BARRIER = 5,
  HPCDL_OP_JOIN = 6
} hpcdl_op_type;

/* ---- errors, build facts ---------------------------------------------------------------------- */
HPCDL_API int hpcdl_abi_version(void);
/* The message of the last failed call on this thread ("" if none). Valid until the next call. */
HPCDL_API const char* hpcdl_last_error(void);
/* JSON object describing this build, e.g.
 * {"version":"0.1.0","compiler":"GNU 12.2.0","shm":true,"tcp":true,
 *  "mpi":true,"mpi_shims":"openmpi,mpich","mpi_missing":"",
 *  "cuda":false,"nccl":false,"simd":"avx2"}
 * The runtime links no MPI: "mpi_shims" lists the MPI families it has a shim for (the job's libmpi is found
 * and loaded at run time, see the option mpi_shim), "mpi_missing" says why a family has none. Static
 * string, never freed. */
HPCDL_API const char* hpcdl_build_info(void);

/* ---- lifecycle ---------------------------------------------------------------------------------- */
/*
 * Options: "key=value" lines separated by '\n'. Settings are resolved by hpcdl.common (explicit argument
 * > HPCDL_* > HOROVOD_* > default); the runtime reads no environment itself. Keys:
 *   rank, size                    this process's world rank and the world size (required)
 *   host                          host identity; ranks with equal host share memory (required)
 *   rendezvous_addr, rendezvous_port   where the rendezvous server listens (a name or an address)
 *   rendezvous_ports              instead of rendezvous_port: comma list of ports; the server (rank 0) binds
 *                                 the first free one, the other ranks walk them until they find it
 *   rendezvous_serve=0|1          1: this process (world rank 0) runs the rendezvous server itself
 *   rendezvous_job                tells this job from others walking the same ports with the same secret
 *   rendezvous_origin             what named the rendezvous (e.g. "MASTER_ADDR/MASTER_PORT"), for messages
 *   secret                        job secret (hex); peers must prove they hold it
 *   bootstrap=tcp|mpi             how ranks meet (mpi: through the job's MPI, under its mpirun/mpiexec)
 *   mpi_shim                      with bootstrap=mpi or transport=mpi: path of the MPI shim of the job's MPI
 *                                 family (_mpi_openmpi.so, _mpi_mpich.so beside the runtime), loaded after
 *                                 hpcdl.common loaded that family's libmpi with RTLD_GLOBAL
 *   transport=auto|shm|tcp|mpi    data plane to use between ranks (auto: shm within a host, tcp across)
 *   iface                         network interface (or IPv4 address) for TCP data connections; without it
 *                                 a rank is reached at the address the rendezvous saw it connect from
 *   timeout_s                     deadline of every blocking wait, seconds (float)
 *   small_message_bytes           below this, latency-optimal algorithms; at/above, ring
 *   shm_chunk_bytes               shared-memory staging buffer per rank and step
 *   tcp_spin_us                   how long a wait on TCP sockets polls them before it sleeps (us)
 *   tcp_send_buffer_bytes         SO_SNDBUF of TCP data connections (default 192 KiB; 0: 4 MiB)
 *   shm_stores=auto|cached|streaming  how ranks write staged chunks (auto: measured, see staging_stores.h)
 *   hierarchical=auto|0|1         large allreduces within hosts, then across, when ranks span hosts (auto,
 *                                 the default: when some host has several ranks of the process set)
 *   fusion_threshold              engine fusion buffer bytes (0 disables fusion)
 *   cycle_time_ms                 engine cycle time (float)
 *   cache_capacity                engine response cache entries (0 disables); unless the user set it, the
 *                                 cache doubles when a name it evicted for want of room comes back
 *   timeline, timeline_mark_cycles  Chrome-trace output path written by rank 0, mark cycles 0|1
 *   stall_check=0|1, stall_check_s, stall_shutdown_s
 *   autotune=0|1, autotune_log, autotune_warmup_samples, autotune_steps_per_sample,
 *   user_set_knobs                comma list of knobs the user set explicitly (never tuned, never grown)
 *   process_sets                  static process sets, ';'-separated lists of ','-separated world ranks
 *   dynamic_process_sets=0|1
 *   members                       ','-separated world ranks: after the rendezvous of every rank, this
 *                                 process's job is these ranks only, numbered by position (init(comm=[...]))
 *   debug_dir                     the job's directory for diagnostic files (flight recorder dumps); "": none
 *   flight_recorder_size          submissions the flight recorder keeps (0 disables it)
 *   stack_fd, stack_signal, stack_thread   where this process's Python stacks are written when it raises
 *                                 stack_signal, and the main thread's id as the dump names it: stall reports
 *                                 and timeouts show the main thread of each rank they wait for
 *   log_level=trace|debug|info|warning|error
 */
HPCDL_API int hpcdl_init(const char* options);
HPCDL_API int hpcdl_shutdown(void);
HPCDL_API int hpcdl_is_initialized(void);

HPCDL_API int hpcdl_rank(void);
HPCDL_API int hpcdl_size(void);
HPCDL_API int hpcdl_local_rank(void);
HPCDL_API int hpcdl_local_size(void);
HPCDL_API int hpcdl_cross_rank(void);
HPCDL_API int hpcdl_cross_size(void);
HPCDL_API int hpcdl_is_homogeneous(void);
/* Transport actually used to reach peers on this host / on other hosts: "shm", "tcp", "mpi", "self". */
HPCDL_API const char* hpcdl_transport_name(int local);
/* Congestion control of this rank's TCP connections to its peers (option tcp_congestion, where the system
   offers it), e.g. "cubic". */
HPCDL_API const char* hpcdl_tcp_congestion(void);
HPCDL_API int hpcdl_mpi_enabled(void);
HPCDL_API int hpcdl_mpi_threads_supported(void);

/* ---- rendezvous server (hosted by the launcher or by world rank 0) ------------------------------ */
/* Starts a rendezvous server on host:port (port 0 picks a free one) for a job of `size` ranks that
 * knows `secret`. Returns an opaque handle > 0, or < 0 on error. The caller owns the server until
 * hpcdl_rendezvous_server_stop, which stops and frees it; the handle must not be used after that. */
HPCDL_API int64_t hpcdl_rendezvous_server_start(const char* host, int port, const char* secret, int size);
HPCDL_API int hpcdl_rendezvous_server_port(int64_t server);
/* Writes up to `capacity` world ranks that have registered into `ranks`; returns how many did. */
HPCDL_API int hpcdl_rendezvous_server_arrived(int64_t server, int32_t* ranks, int capacity);
HPCDL_API int hpcdl_rendezvous_server_stop(int64_t server);

/* ---- object payloads ---------------------------------------------------------------------------------
 * Receivers unpickle the payloads of object collectives (broadcast_object, allgather_object, ...), so each
 * payload travels with an HMAC-SHA-256 that receivers check first. hpcdl_object_key writes this job's
 * 32-byte key for it: derived from the job secret and the nonce of this job's rendezvous round, the same on
 * every rank of the job and new with every init. hpcdl_object_sequence returns the next number (1, 2, ...)
 * of object operations called `name` on `process_set` in this process; every member calls it once per
 * operation, so a MAC over (operation, set, name, number, sender, payload) binds a payload to one operation
 * and a replayed one is refused like an altered one. Returns < 0 (a negated status) when not initialised. */
HPCDL_API int hpcdl_object_key(uint8_t* key);
HPCDL_API int64_t hpcdl_object_sequence(int process_set, const char* name);

/* ---- direct, blocking collectives (caller's thread) ----------------------------------------------
 * process_set: 0 = global; others come from init's process_sets or hpcdl_add_process_set.
 * send == recv means in place (allgather: send at this rank's place in recv; alltoall has none). counts are
 * elements, not bytes. Buffers that overlap in any other way fail with HPCDL_ERR_INVALID. */
HPCDL_API int hpcdl_allreduce(const void* send, void* recv, int64_t count, int dtype, int op,
                              double prescale, double postscale, int process_set);
/* Each rank contributes `count` elements; recv holds sum(counts) elements in rank order.
 * recv_counts (length = set size) gives every rank's count; pass NULL when all are equal to count. */
HPCDL_API int hpcdl_allgather(const void* send, int64_t count, void* recv, const int64_t* recv_counts,
                              int dtype, int process_set);
/* root is a rank within the process set. */
HPCDL_API int hpcdl_broadcast(void* buf, int64_t count, int dtype, int root, int process_set);
/* send_counts[i] elements go to rank i; recv_counts[i] come from rank i (both length = set size). */
HPCDL_API int hpcdl_alltoall(const void* send, const int64_t* send_counts, void* recv,
                             const int64_t* recv_counts, int dtype, int process_set);
/* recv_counts[i] = elements rank i receives (length = set size, sum = elements in send). */
HPCDL_API int hpcdl_reducescatter(const void* send, void* recv, const int64_t* recv_counts, int dtype,
                                  int op, double prescale, double postscale, int process_set);
HPCDL_API int hpcdl_barrier(int process_set);

/* ---- process sets ------------------------------------------------------------------------------- */
/* Collective over the whole world. Returns the new set's id (> 0) or < 0 on error. */
HPCDL_API int hpcdl_add_process_set(const int32_t* ranks, int n);
HPCDL_API int hpcdl_remove_process_set(int process_set);
HPCDL_API int hpcdl_process_set_rank(int process_set);   /* -1 if this rank is not a member */
HPCDL_API int hpcdl_process_set_size(int process_set);
HPCDL_API int hpcdl_process_set_ranks(int process_set, int32_t* ranks, int capacity);
/* Number of known process sets and their ids (global first). */
HPCDL_API int hpcdl_process_set_ids(int32_t* ids, int capacity);

/* ---- the engine: asynchronous named operations -------------------------------------------------- */
typedef struct {
  int32_t op_type;            /* hpcdl_op_type */
  const char* name;           /* NULL or "": the engine assigns a deterministic name */
  int32_t process_set;        /* 0 = global */
  int32_t dtype;              /* hpcdl_dtype */
  int32_t ndim;
  const int64_t* shape;       /* ndim entries; the first dimension may differ per rank for allgather */
  const void* input;          /* must stay valid until the handle completes */
  void* output;               /* allreduce/broadcast/reducescatter: caller-owned (may equal input, must
                                 not overlap it otherwise). allgather/alltoall: NULL, or a buffer offered
                                 for the usual result (allgather: set size x the input's bytes; alltoall:
                                 the input's bytes), apart from the input; the engine writes the result
                                 there when it has exactly that size (every member's input has this one's
                                 rows; this member receives as many rows as it sends), else into a buffer
                                 of its own; hpcdl_output says where it is */
  int32_t reduce_op;          /* hpcdl_reduce_op (allreduce, reducescatter) */
  double prescale, postscale; /* 1.0 for none; integer and float16/bfloat16 inputs are scaled and stored
                                 in their own type before the reduction (Horovod's rule) */
  int32_t root;               /* broadcast root, a world rank (Horovod semantics) */
  const int64_t* splits;      /* alltoall: rows of dim 0 sent to each set member; NULL = even */
  int32_t nsplits;
  int32_t group_id;           /* 0 = not grouped; ops sharing a group id run together, atomically */
  int32_t group_size;         /* number of ops in the group */
  int32_t placement;          /* hpcdl_placement: where the data lives and who moves it (every member of
                                 the process set must submit a name with the same placement) */
  int64_t tag;                /* HPCDL_PLACEMENT_DEVICE: the caller's id of this operation, handed back in
                                 the batches of hpcdl_device_next; ignored otherwise */
} hpcdl_request;

/* Where an engine operation's data lives. HOST: the engine's own data plane reads `input` and writes
 * `output`. DEVICE: the engine only negotiates (names, validation, response cache, fusion, ordering, stall
 * inspector, join, timeline) and never dereferences the buffers; each decided batch goes, in the one order
 * every rank agrees on, to the caller's executor (hpcdl_device_next), which moves the data (NCCL on GPUs)
 * and reports back (hpcdl_device_done). Such operations are never fused with host ones. */
typedef enum { HPCDL_PLACEMENT_HOST = 0, HPCDL_PLACEMENT_DEVICE = 1 } hpcdl_placement;

typedef int64_t hpcdl_handle;

/* Returns a handle > 0, or a negative hpcdl_status on immediate error. */
HPCDL_API hpcdl_handle hpcdl_enqueue(const hpcdl_request* request);
/* HPCDL_OK when done, HPCDL_PENDING when not, an error status when the op failed. */
HPCDL_API int hpcdl_poll(hpcdl_handle handle);
/* Blocks until done or timeout_s (< 0: the runtime's timeout) expires. Releases the GIL-free wait. */
HPCDL_API int hpcdl_wait(hpcdl_handle handle, double timeout_s);
/* hpcdl_enqueue, then hpcdl_wait, in one call: a blocking collective. The caller waits at once, and its wait
 * runs the cycle itself when the engine is idle (the direct path), so the engine thread is not woken for
 * the operation, whatever its size. *handle receives its handle (0 when it could not be submitted); the
 * caller releases it, after a failure too (after a timeout only once the operation ended: it may still
 * run). Returns hpcdl_wait's status, or the submission's error. */
HPCDL_API int hpcdl_run(const hpcdl_request* request, double timeout_s, hpcdl_handle* handle);
/* allgather, alltoall: pointer, byte size and shape of the result (in the offered output buffer, or in the
 * engine's own, valid until hpcdl_release). shape must hold at least the request's ndim entries. */
HPCDL_API int hpcdl_output(hpcdl_handle handle, void** data, int64_t* nbytes, int64_t* shape);
/* alltoall: rows received from each set member (set size entries). */
HPCDL_API int hpcdl_received_splits(hpcdl_handle handle, int64_t* splits, int capacity);
/* join: the last rank to join (valid after completion). */
HPCDL_API int hpcdl_join_result(hpcdl_handle handle);
/* Frees the handle and any engine-owned output. */
HPCDL_API int hpcdl_release(hpcdl_handle handle);
/* A fresh group id (> 0) for the operations of one group on a process set, or a negative status. Every
 * member allocates its groups in the same order; a joined rank skips the ids of the groups it stood in
 * for, so that the ranks' next groups still get the same ids. */
HPCDL_API int hpcdl_new_group_id(int process_set);

/* ---- the device executor: batches of HPCDL_PLACEMENT_DEVICE operations ------------------------------
 * One executor thread per process takes the batches the engine decided, in order, runs them and reports
 * each one's end. A batch is a row of int64 words:
 *   [0] batch id (> 0)   [1] process set   [2] op type   [3] dtype   [4] reduce op
 *   [5] root (broadcast: its index in the set)   [6] entries E   [7] set size N   [8] this rank's index
 *   [9] flags (HPCDL_DEVICE_FUSED: the E allreduces share one fusion buffer and one collective;
 *       HPCDL_DEVICE_TIMED: the timeline records this batch, report its phase times)
 *   [10] prescale, [11] postscale (the bits of a double)   [12] T, the length of the table
 *   then E entries of 2 words: tag (0: this rank stands in for a joined rank and contributes zeros),
 *   element count; then the table: allgather, the rows of each member (N words); alltoall, the rows each
 *   member sends to this rank (N words); otherwise empty.
 * Returns the batch's length in words (> 0), 0 when none came within timeout_s, or a negative status:
 * the engine failed (hpcdl_last_error says why; every operation it held has failed, and the executor must
 * abort what it runs) or the job shut down (HPCDL_ERR_SHUTDOWN: the batches the executor runs still
 * complete when it reports them; it should let them end, then stop), or
 * HPCDL_ERR_INVALID when `capacity` is too small (the batch stays queued; batch[0] holds the length it
 * needs). */
#define HPCDL_DEVICE_FUSED 1
#define HPCDL_DEVICE_TIMED 2
#define HPCDL_DEVICE_HEADER_WORDS 13
HPCDL_API int hpcdl_device_next(double timeout_s, int64_t* batch, int capacity);
/* The end of a batch: status HPCDL_OK completes its operations, anything else fails them (and the engine,
 * as a failed collective of the engine's own data plane does) with `message`. times_ns: NULL, or 4
 * CLOCK_MONOTONIC times (start, collective start, collective end, end; equal neighbours for a phase a
 * batch does not have) for the timeline. */
HPCDL_API int hpcdl_device_done(int64_t batch_id, int status, const char* message, const int64_t* times_ns);
/* Makes the thread blocked in hpcdl_device_next, or the next call that finds no batch, return 0 at once
 * (the executor is stopping). */
HPCDL_API int hpcdl_device_interrupt(void);

/* ---- timeline, autotune, stall inspector ------------------------------------------------------- */
HPCDL_API int hpcdl_start_timeline(const char* path, int mark_cycles);
HPCDL_API int hpcdl_stop_timeline(void);
/* Current value of an engine knob: "fusion_threshold", "cycle_time_ms", "small_message_bytes",
 * "cache_capacity". */
HPCDL_API double hpcdl_get_knob(const char* name);

/* ---- the flight recorder ------------------------------------------------------------------------
 * Each rank keeps its recent submissions (name, operation, dtype, shape, process set, state, when it was
 * submitted, negotiated, started and done) in a ring, and writes them to <debug_dir>/flight.rank<R>.json
 * on a stall report, a timeout, a mismatch, a failure, and here on request (reason: why, e.g. "request";
 * message: a text to keep with it), with its Python stacks except after a mismatch or a failure. Writes
 * nothing without a debug_dir. */
HPCDL_API int hpcdl_flight_dump(const char* reason, const char* message);

#ifdef __cplusplus
}
#endif
#endif /* HPCDL_C_API_H */
