/* The per-operation hot path of hpcdl.common.engine, in C.
 *
 * A training step submits a few hundred tensors, waits for each and drops its handle. Through ctypes
 * and a Python handle class every operation cost 10 to 15 us of Python (a ctypes structure, pointer
 * lookups, argument conversion, an object with seven attributes and a finaliser), as much as the engine's
 * whole negotiation. Here submit() builds the hpcdl_request on the stack from Python objects, calls the
 * runtime and returns the handle object in one call; allreduce() does the same straight from NumPy
 * arrays (a gradient's allreduce, with the checks its Python helper made); the handle's poll, wait,
 * release and result, and its deallocation, are C too. allreduce_now() is hpcdl.common.allreduce's in-place
 * call on a NumPy array (no engine), where ctypes and the helper's checks cost about 1 us of a 2 us call.
 *
 * It links to nothing: bind() hands it the addresses of hpcdl_enqueue, hpcdl_wait, hpcdl_poll,
 * hpcdl_release and hpcdl_allreduce from the library hpcdl.common.library loaded through ctypes, so HPCDL_LIBRARY keeps
 * selecting the runtime and the C ABI (c_api.h) stays the only contract with it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <structmember.h>

#include "hpcdl/c_api.h"

#if PY_VERSION_HEX < 0x030A0000
static inline PyObject* Py_NewRef(PyObject* obj) {
  Py_INCREF(obj);
  return obj;
}
#endif

#define MAX_DIMS 32
#define MAX_SPLITS 4096

/* The types of the functions bind() takes, from their declarations in c_api.h (the compiler checks every
 * call against them; hpcdl.common.abi.HOTPATH lists them for bind()). */
typedef __typeof__(&hpcdl_enqueue) enqueue_fn;
typedef __typeof__(&hpcdl_wait) wait_fn;
typedef __typeof__(&hpcdl_poll) handle_fn;

static enqueue_fn enqueue_ptr;
static wait_fn wait_ptr;
static handle_fn poll_ptr;
static __typeof__(&hpcdl_release) release_ptr;
static __typeof__(&hpcdl_allreduce) allreduce_ptr;
static __typeof__(&hpcdl_run) run_ptr;
static __typeof__(&hpcdl_output) output_ptr;
static __typeof__(&hpcdl_received_splits) received_splits_ptr;
static PyObject* raise_status; /* Python callable: raises the hpcdl exception for a status */
static PyObject* error_class;   /* hpcdl.common.exceptions.HpcdlError */
/* What allreduce() accepts without the Python helper: numpy.ndarray, and the buffer formats of the dtypes
 * the runtime has (format -> the runtime's dtype code), both from bind(). */
#define MAX_FORMATS 16
static PyTypeObject* array_type;
static struct {
  char format[8];
  int32_t dtype;
} formats[MAX_FORMATS];
static int nformats;
/* Handles dropped while their operation still runs, as (id, buffers) tuples: the buffers must outlive
 * the operation. Reaped at the next submission. Only touched with the GIL held. */
static PyObject* orphans;

static int bound(void) {
  if (enqueue_ptr) return 1;
  PyErr_SetString(PyExc_RuntimeError, "hpcdl._hotpath is not bound to the runtime library (call bind())");
  return 0;
}

/* Raises the exception for a failed status (through the bound callable); always returns NULL. */
static PyObject* fail(int status) {
  PyObject* r = PyObject_CallFunction(raise_status, "i", status);
  Py_XDECREF(r);
  if (!PyErr_Occurred()) PyErr_Format(error_class, "hpcdl status %d", status);
  return NULL;
}

/* bind(enqueue, wait, poll, release, allreduce, run, output, received_splits, raise_status, error_class,
 * array_type, formats): the functions' addresses in the loaded runtime, the callable that raises for a
 * status, the exception class of bad submissions, numpy.ndarray and a dict {buffer format: runtime dtype
 * code}. */
#define NFUNCTIONS 8
static PyObject* bind(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != NFUNCTIONS + 4 || !PyType_Check(args[NFUNCTIONS + 2]) || !PyDict_Check(args[NFUNCTIONS + 3]) ||
      PyDict_GET_SIZE(args[NFUNCTIONS + 3]) > MAX_FORMATS) {
    PyErr_SetString(PyExc_TypeError,
                    "bind() takes the addresses of enqueue, wait, poll, release, allreduce, run, output and "
                    "received_splits, raise_status, "
                    "error_class, the array type and a dict of at most 16 buffer formats");
    return NULL;
  }
  Py_ssize_t pos = 0;
  PyObject *key, *value;
  int n = 0;
  while (PyDict_Next(args[NFUNCTIONS + 3], &pos, &key, &value)) {
    const char* f = PyUnicode_AsUTF8(key);
    long code = PyLong_AsLong(value);
    if (f == NULL || (code == -1 && PyErr_Occurred())) return NULL;
    if (strlen(f) >= sizeof(formats[n].format)) {
      PyErr_Format(PyExc_ValueError, "buffer format %R is too long", key);
      return NULL;
    }
    strcpy(formats[n].format, f);
    formats[n++].dtype = (int32_t)code;
  }
  nformats = n;
  Py_XSETREF(array_type, (PyTypeObject*)Py_NewRef(args[NFUNCTIONS + 2]));
  void* f[NFUNCTIONS];
  for (int i = 0; i < NFUNCTIONS; ++i) {
    f[i] = PyLong_AsVoidPtr(args[i]);
    if (f[i] == NULL) {
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "bind() got a NULL function address");
      return NULL;
    }
  }
  if (orphans == NULL && (orphans = PyList_New(0)) == NULL) return NULL;
  enqueue_ptr = (enqueue_fn)f[0];
  wait_ptr = (wait_fn)f[1];
  poll_ptr = (handle_fn)f[2];
  release_ptr = (__typeof__(&hpcdl_release))f[3];
  allreduce_ptr = (__typeof__(&hpcdl_allreduce))f[4];
  run_ptr = (__typeof__(&hpcdl_run))f[5];
  output_ptr = (__typeof__(&hpcdl_output))f[6];
  received_splits_ptr = (__typeof__(&hpcdl_received_splits))f[7];
  Py_XSETREF(raise_status, Py_NewRef(args[NFUNCTIONS]));
  Py_XSETREF(error_class, Py_NewRef(args[NFUNCTIONS + 1]));
  Py_RETURN_NONE;
}

/* ---- Handle -------------------------------------------------------------------------------------------- */

typedef struct {
  PyObject_HEAD
  long long id;
  PyObject* op_type;
  int ndim;
  PyObject* keep;   /* the objects owning the buffers, alive until the engine is done with them */
  PyObject* result; /* callable(handle) -> what the helper that submitted it promises, or None */
  PyObject* value;  /* or that result itself, when the helper knows it at submission (an output array) */
  char released, finished;
} HandleObject;

static int handle_traverse(HandleObject* self, visitproc visit, void* arg) {
  Py_VISIT(self->op_type);
  Py_VISIT(self->keep);
  Py_VISIT(self->result);
  Py_VISIT(self->value);
  return 0;
}

static int handle_clear(HandleObject* self) {
  Py_CLEAR(self->op_type);
  Py_CLEAR(self->keep);
  Py_CLEAR(self->result);
  Py_CLEAR(self->value);
  return 0;
}

/* Frees the runtime's handle, or parks the buffers among the orphans while the operation still runs. */
static int handle_release_now(HandleObject* self) {
  if (self->released) return 0;
  self->released = 1;
  if (!self->finished && poll_ptr(self->id) == HPCDL_PENDING) {
    PyObject* entry = Py_BuildValue("(LO)", self->id, self->keep ? self->keep : Py_None);
    if (entry == NULL || PyList_Append(orphans, entry) < 0) {
      Py_XDECREF(entry);
      return -1;
    }
    Py_DECREF(entry);
  } else {
    release_ptr(self->id);
  }
  Py_CLEAR(self->keep);
  return 0;
}

static void handle_dealloc(HandleObject* self) {
  PyObject_GC_UnTrack(self);
  if (!self->released && enqueue_ptr) {
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    if (handle_release_now(self) < 0) PyErr_WriteUnraisable((PyObject*)self);
    PyErr_Restore(type, value, traceback);
  }
  handle_clear(self);
  Py_TYPE(self)->tp_free((PyObject*)self);
}

static int check_live(HandleObject* self) {
  if (!self->released) return 1;
  PyErr_Format(error_class, "handle %lld was already released", self->id);
  return 0;
}

static PyObject* handle_check_live(HandleObject* self, PyObject* unused) {
  if (!check_live(self)) return NULL;
  Py_RETURN_NONE;
}

static PyObject* handle_poll(HandleObject* self, PyObject* unused) {
  if (!check_live(self)) return NULL;
  int status = poll_ptr(self->id);
  if (status == HPCDL_PENDING) Py_RETURN_FALSE;
  self->finished = 1;
  if (status != HPCDL_OK) return fail(status);
  Py_RETURN_TRUE;
}

static PyObject* handle_wait(HandleObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
  if (nargs + nkw > 1 ||
      (nkw == 1 && PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, 0), "timeout") != 0)) {
    PyErr_SetString(PyExc_TypeError, "wait() takes one optional argument, timeout (seconds)");
    return NULL;
  }
  double timeout = -1.0; /* the runtime's timeout */
  if (nargs + nkw == 1 && args[0] != Py_None) {
    timeout = PyFloat_AsDouble(args[0]);
    if (timeout == -1.0 && PyErr_Occurred()) return NULL;
  }
  if (!check_live(self)) return NULL;
  int status;
  Py_BEGIN_ALLOW_THREADS
  status = wait_ptr(self->id, timeout);
  Py_END_ALLOW_THREADS
  if (status != HPCDL_ERR_TIMEOUT) self->finished = 1;
  if (status != HPCDL_OK) return fail(status);
  Py_RETURN_NONE;
}

static PyObject* handle_release(HandleObject* self, PyObject* unused) {
  if (handle_release_now(self) < 0) return NULL;
  Py_RETURN_NONE;
}

static PyObject* handle_result(HandleObject* self, PyObject* unused) {
  if (self->value) return Py_NewRef(self->value);
  if (self->result && self->result != Py_None) return PyObject_CallOneArg(self->result, (PyObject*)self);
  Py_RETURN_NONE;
}

/* (address, bytes, shape) of an allgather's or alltoall's result: the output offered at submission when the
 * result fitted it (c_api.h), else the engine's own buffer, valid until the handle is released. */
static PyObject* handle_output_bytes(HandleObject* self, PyObject* unused) {
  if (!check_live(self)) return NULL;
  void* data = NULL;
  int64_t nbytes = 0, shape[MAX_DIMS];
  if (self->ndim < 0 || self->ndim > MAX_DIMS) {
    PyErr_Format(PyExc_ValueError, "handle %lld has %d dimensions", self->id, self->ndim);
    return NULL;
  }
  int status = output_ptr(self->id, &data, &nbytes, shape);
  if (status != HPCDL_OK) return fail(status);
  PyObject* dims = PyTuple_New(self->ndim);
  if (dims == NULL) return NULL;
  for (int i = 0; i < self->ndim; ++i) {
    PyObject* d = PyLong_FromLongLong(shape[i]);
    if (d == NULL) {
      Py_DECREF(dims);
      return NULL;
    }
    PyTuple_SET_ITEM(dims, i, d);
  }
  return Py_BuildValue("(NLN)", PyLong_FromVoidPtr(data), (long long)nbytes, dims);
}

/* alltoall: the rows received from each member of the process set, as a list. */
static PyObject* handle_received_splits(HandleObject* self, PyObject* unused) {
  if (!check_live(self)) return NULL;
  int64_t few[64];
  int64_t* splits = few;
  int count = received_splits_ptr(self->id, few, 64);
  if (count > 64) { /* a set of more than 64 members: ask again with room for all */
    if ((splits = PyMem_Malloc(sizeof(int64_t) * (size_t)count)) == NULL) return PyErr_NoMemory();
    count = received_splits_ptr(self->id, splits, count);
  }
  PyObject* list = count < 0 ? fail(-count) : PyList_New(count);
  for (int i = 0; list != NULL && i < count; ++i) {
    PyObject* v = PyLong_FromLongLong(splits[i]);
    if (v == NULL) Py_CLEAR(list);
    else PyList_SET_ITEM(list, i, v);
  }
  if (splits != few) PyMem_Free(splits);
  return list;
}

static PyMethodDef handle_methods[] = {
    {"_check_live", (PyCFunction)handle_check_live, METH_NOARGS, "Raise HpcdlError if the handle was released."},
    {"poll", (PyCFunction)handle_poll, METH_NOARGS, "True when the operation finished; raises if it failed."},
    {"wait", (PyCFunction)(void (*)(void))handle_wait, METH_FASTCALL | METH_KEYWORDS,
     "wait(timeout=None): block until the operation finished (timeout in seconds; None: the runtime's)."},
    {"release", (PyCFunction)handle_release, METH_NOARGS,
     "Free the handle and any engine-owned output. Idempotent; buffers of a running operation stay alive "
     "until it finishes."},
    {"result", (PyCFunction)handle_result, METH_NOARGS,
     "What the NumPy helper that created this handle promises (after wait()), or None."},
    {"output_bytes", (PyCFunction)handle_output_bytes, METH_NOARGS,
     "allgather, alltoall: (address, bytes, shape) of the result: the offered output when the result fitted "
     "it, else the engine's own buffer, valid until release()."},
    {"received_splits", (PyCFunction)handle_received_splits, METH_NOARGS,
     "alltoall: the rows received from each member of the process set."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef handle_members[] = {
    {"id", T_LONGLONG, offsetof(HandleObject, id), READONLY, "the runtime's handle"},
    {"op_type", T_OBJECT, offsetof(HandleObject, op_type), READONLY, "the operation type (OpType)"},
    {"_ndim", T_INT, offsetof(HandleObject, ndim), READONLY, NULL},
    {"_keep", T_OBJECT, offsetof(HandleObject, keep), READONLY, NULL},
    {"_result", T_OBJECT, offsetof(HandleObject, result), READONLY, NULL},
    {"_released", T_BOOL, offsetof(HandleObject, released), READONLY, NULL},
    {"_finished", T_BOOL, offsetof(HandleObject, finished), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject HandleType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hpcdl.common._hotpath.HandleBase",
    .tp_basicsize = sizeof(HandleObject),
    .tp_dealloc = (destructor)handle_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "One submitted operation (created by submit()); keeps its buffers alive until released.",
    .tp_traverse = (traverseproc)handle_traverse,
    .tp_clear = (inquiry)handle_clear,
    .tp_methods = handle_methods,
    .tp_members = handle_members,
};

/* ---- submit -------------------------------------------------------------------------------------------- */

/* Releases the orphans whose operations finished. */
static int reap_orphans(void) {
  PyObject* still_running = PyList_New(0);
  if (still_running == NULL) return -1;
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(orphans); ++i) {
    PyObject* entry = PyList_GET_ITEM(orphans, i);
    long long id = PyLong_AsLongLong(PyTuple_GET_ITEM(entry, 0));
    if (poll_ptr(id) != HPCDL_PENDING) {
      release_ptr(id);
    } else if (PyList_Append(still_running, entry) < 0) {
      Py_DECREF(still_running);
      return -1;
    }
  }
  Py_SETREF(orphans, still_running);
  return 0;
}

/* A buffer's address: None -> NULL, an int -> that address, else the object's buffer (an ndarray). The
 * caller keeps the object alive until the operation completes; the view is released at once. */
static int address_of(PyObject* obj, int writable, void** out) {
  if (obj == Py_None) {
    *out = NULL;
    return 1;
  }
  if (PyLong_Check(obj)) {
    *out = PyLong_AsVoidPtr(obj);
    return !PyErr_Occurred();
  }
  Py_buffer view;
  if (PyObject_GetBuffer(obj, &view, writable ? PyBUF_WRITABLE : PyBUF_SIMPLE) != 0) return 0;
  *out = view.buf;
  PyBuffer_Release(&view);
  return 1;
}

static int int64s_of(PyObject* seq, int64_t* out, Py_ssize_t capacity, Py_ssize_t* n, const char* what) {
  PyObject* fast = PySequence_Fast(seq, what);
  if (fast == NULL) return 0;
  *n = PySequence_Fast_GET_SIZE(fast);
  if (*n > capacity) {
    PyErr_Format(PyExc_ValueError, "%s has %zd entries; at most %zd are supported", what, *n, capacity);
    Py_DECREF(fast);
    return 0;
  }
  PyObject** items = PySequence_Fast_ITEMS(fast);
  for (Py_ssize_t i = 0; i < *n; ++i) {
    out[i] = PyLong_AsLongLong(items[i]);
    if (out[i] == -1 && PyErr_Occurred()) {
      Py_DECREF(fast);
      return 0;
    }
  }
  Py_DECREF(fast);
  return 1;
}

/* A buffer or a count the runtime cannot take (a read-only output array, too many dimensions) is the
 * caller's mistake: say so in hpcdl's exception. */
static PyObject* bad_submission(void) {
  if (!PyErr_ExceptionMatches(PyExc_BufferError) && !PyErr_ExceptionMatches(PyExc_ValueError)) return NULL;
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  PyErr_Format(error_class, "cannot submit this operation: %S", value ? value : Py_None);
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(traceback);
  return NULL;
}

/* cls when it is a HandleBase subclass; else raises TypeError for function `fn`. */
static PyTypeObject* handle_class(PyObject* cls, const char* fn) {
  if (PyType_Check(cls) && PyType_IsSubtype((PyTypeObject*)cls, &HandleType)) return (PyTypeObject*)cls;
  PyErr_Format(PyExc_TypeError, "%s() needs a HandleBase subclass as its first argument", fn);
  return NULL;
}

/* Reaps the handles orphaned since the last submission, enqueues r and returns a new cls instance for it
 * that keeps `keep` alive and gives `result` (a callable) or `value` as its result; raises the runtime's
 * error when the runtime refuses r. With wait, the caller waits for it at once (hpcdl_run: a lone
 * submission runs on this thread when the engine is idle, and the engine thread is not woken for it): the
 * handle comes back finished, or the operation's error is raised (after a timeout its buffers stay among
 * the orphans while it may still run). */
static PyObject* enqueue_into(PyTypeObject* cls, const hpcdl_request* r, PyObject* op_type, PyObject* keep,
                              PyObject* result, PyObject* value, int wait) {
  if (PyList_GET_SIZE(orphans) > 0 && reap_orphans() < 0) return NULL;
  HandleObject* h = (HandleObject*)cls->tp_alloc(cls, 0);
  if (h == NULL) return NULL;
  hpcdl_handle id = 0;
  int status = HPCDL_OK;
  if (wait) {
    Py_BEGIN_ALLOW_THREADS
    status = run_ptr(r, -1.0, &id);
    Py_END_ALLOW_THREADS
  } else {
    id = enqueue_ptr(r);
    if (id <= 0) status = (int)-id;
  }
  if (id <= 0) {
    h->released = 1; /* nothing to release */
    Py_DECREF(h);
    return fail(status);
  }
  h->id = id;
  h->op_type = Py_NewRef(op_type);
  h->ndim = r->ndim > 1 ? (int)r->ndim : 1;
  h->keep = Py_NewRef(keep);
  h->result = Py_NewRef(result);
  h->value = value ? Py_NewRef(value) : NULL;
  if (wait && status != HPCDL_ERR_TIMEOUT) h->finished = 1;
  if (status != HPCDL_OK) {
    PyObject* raised = fail(status); /* reads this thread's error before the release can replace it */
    Py_DECREF(h);                    /* releases it, or parks its buffers while it still runs */
    return raised;
  }
  return (PyObject*)h;
}

#define SUBMIT_ARGS 21

/* submit(cls, op_type, name, process_set, dtype, input, output, shape, reduce_op, prescale, postscale,
 *        root, splits, group_id, group_size, keep, result, value, placement, tag, wait) -> a cls (a
 * HandleBase subclass) instance; value None means none; wait: see enqueue_into. */
static PyObject* submit(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  if (!bound()) return NULL;
  if (nargs != SUBMIT_ARGS) {
    PyErr_Format(PyExc_TypeError, "submit() takes %d arguments (%zd given)", SUBMIT_ARGS, nargs);
    return NULL;
  }
  PyTypeObject* cls = handle_class(args[0], "submit");
  if (cls == NULL) return NULL;
  hpcdl_request r;
  int64_t shape[MAX_DIMS];
  Py_ssize_t ndim = 0, nsplits = 0;
  int64_t* splits = NULL;
  r.op_type = (int32_t)PyLong_AsLong(args[1]);
  r.name = NULL;
  if (args[2] != Py_None) {
    r.name = PyUnicode_AsUTF8(args[2]);
    if (r.name == NULL) return NULL;
  }
  r.process_set = (int32_t)PyLong_AsLong(args[3]);
  r.dtype = (int32_t)PyLong_AsLong(args[4]);
  if (!address_of(args[5], 0, (void**)&r.input) || !address_of(args[6], 1, &r.output) ||
      !int64s_of(args[7], shape, MAX_DIMS, &ndim, "shape"))
    return bad_submission();
  r.ndim = (int32_t)ndim;
  r.shape = shape;
  r.reduce_op = (int32_t)PyLong_AsLong(args[8]);
  r.prescale = PyFloat_AsDouble(args[9]);
  r.postscale = PyFloat_AsDouble(args[10]);
  r.root = (int32_t)PyLong_AsLong(args[11]);
  r.group_id = (int32_t)PyLong_AsLong(args[13]);
  r.group_size = (int32_t)PyLong_AsLong(args[14]);
  r.placement = (int32_t)PyLong_AsLong(args[18]);
  r.tag = (int64_t)PyLong_AsLongLong(args[19]);
  const int wait = PyObject_IsTrue(args[20]);
  if (PyErr_Occurred() || wait < 0) return NULL;
  if (args[12] != Py_None) {
    splits = PyMem_Malloc(sizeof(int64_t) * MAX_SPLITS);
    if (splits == NULL) return PyErr_NoMemory();
    if (!int64s_of(args[12], splits, MAX_SPLITS, &nsplits, "splits")) {
      PyMem_Free(splits);
      return bad_submission();
    }
  }
  r.splits = splits;
  r.nsplits = (int32_t)nsplits;
  PyObject* h = enqueue_into(cls, &r, args[1], args[15], args[16], args[17] == Py_None ? NULL : args[17], wait);
  PyMem_Free(splits);
  return h;
}

/* The runtime dtype of a buffer format (NULL means unsigned bytes), or -1 for one the fast path leaves to
 * the Python helper (another byte order, a dtype the runtime lacks). */
static int32_t dtype_of_format(const char* format) {
  if (format == NULL) format = "B";
  for (int i = 0; i < nformats; ++i)
    if (strcmp(formats[i].format, format) == 0) return formats[i].dtype;
  return -1;
}

#define ALLREDUCE_ARGS 9

/* allreduce(cls, op_type, a, name, reduce_op, prescale, postscale, out, process_set) -> a cls instance,
 * or None where engine.allreduce_async's Python helper must take the call.
 *
 * The whole submission of a gradient reduced into an array the caller gave (in place or not), in one C
 * call: its Python helper (checks, the dtype's lookup, the output's closure) cost as much as submit()
 * itself, about 0.6 us a tensor, more right after a collective has emptied the caches. Anything else
 * (no output array, a non-contiguous or foreign-order array, an unsupported dtype, a shape or dtype
 * mismatch, a read-only output) returns None, and the helper handles it, errors included. */
static PyObject* allreduce(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != ALLREDUCE_ARGS) {
    PyErr_Format(PyExc_TypeError, "allreduce() takes %d arguments (%zd given)", ALLREDUCE_ARGS, nargs);
    return NULL;
  }
  PyTypeObject* cls = handle_class(args[0], "allreduce");
  if (cls == NULL) return NULL;
  PyObject *a = args[2], *out = args[7];
  if (enqueue_ptr == NULL || out == Py_None || !PyObject_TypeCheck(a, array_type) ||
      !PyObject_TypeCheck(out, array_type))
    Py_RETURN_NONE;
  const int in_place = out == a;
  Py_buffer in, res;
  if (PyObject_GetBuffer(a, &in, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (in_place ? PyBUF_WRITABLE : 0)) != 0) {
    PyErr_Clear();
    Py_RETURN_NONE;
  }
  int ok = in.ndim <= MAX_DIMS;
  void* output = in.buf;
  if (ok && !in_place) {
    ok = PyObject_GetBuffer(out, &res, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) == 0;
    if (!ok) {
      PyErr_Clear();
    } else {
      ok = res.ndim == in.ndim && strcmp(res.format ? res.format : "B", in.format ? in.format : "B") == 0;
      for (int d = 0; ok && d < in.ndim; ++d) ok = res.shape[d] == in.shape[d];
      output = res.buf;
      PyBuffer_Release(&res);
    }
  }
  hpcdl_request r;
  int64_t shape[MAX_DIMS];
  r.dtype = ok ? dtype_of_format(in.format) : -1;
  for (int d = 0; d < in.ndim && d < MAX_DIMS; ++d) shape[d] = in.shape[d];
  r.ndim = in.ndim;
  r.input = in.buf;
  PyBuffer_Release(&in); /* the handle keeps the arrays alive */
  if (r.dtype < 0) Py_RETURN_NONE;
  r.op_type = (int32_t)PyLong_AsLong(args[1]);
  r.name = NULL;
  if (args[3] != Py_None && (r.name = PyUnicode_AsUTF8(args[3])) == NULL) return NULL;
  r.output = output;
  r.shape = shape;
  r.reduce_op = (int32_t)PyLong_AsLong(args[4]);
  r.prescale = PyFloat_AsDouble(args[5]);
  r.postscale = PyFloat_AsDouble(args[6]);
  r.process_set = (int32_t)PyLong_AsLong(args[8]);
  if (PyErr_Occurred()) return NULL;
  r.root = 0;
  r.splits = NULL;
  r.nsplits = 0;
  r.group_id = 0;
  r.group_size = 0;
  r.placement = HPCDL_PLACEMENT_HOST;
  r.tag = 0;
  PyObject* keep = in_place ? Py_NewRef(a) : PyTuple_Pack(2, a, out);
  if (keep == NULL) return NULL;
  PyObject* h = enqueue_into(cls, &r, args[1], keep, Py_None, out, 0);
  Py_DECREF(keep);
  return h;
}

#define ALLREDUCE_NOW_ARGS 5

/* allreduce_now(a, reduce_op, prescale, postscale, process_set) -> True, or None where hpcdl.common's
 * Python code must take the call: the runtime's blocking allreduce of a NumPy array in place, without the
 * engine. Takes a writeable C-contiguous numpy.ndarray of a dtype the runtime has and at least one element;
 * anything else returns None. The array's buffer stays exported, so nothing can resize it, while the
 * collective runs with the GIL released. */
static PyObject* allreduce_now(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != ALLREDUCE_NOW_ARGS) {
    PyErr_Format(PyExc_TypeError, "allreduce_now() takes %d arguments (%zd given)", ALLREDUCE_NOW_ARGS, nargs);
    return NULL;
  }
  PyObject* a = args[0];
  if (allreduce_ptr == NULL || !PyObject_TypeCheck(a, array_type)) Py_RETURN_NONE;
  Py_buffer buf;
  if (PyObject_GetBuffer(a, &buf, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) != 0) {
    PyErr_Clear();
    Py_RETURN_NONE;
  }
  const int32_t dtype = dtype_of_format(buf.format);
  if (dtype < 0 || buf.len == 0 || buf.itemsize <= 0) {
    PyBuffer_Release(&buf);
    Py_RETURN_NONE;
  }
  const int op = (int)PyLong_AsLong(args[1]);
  const double prescale = PyFloat_AsDouble(args[2]), postscale = PyFloat_AsDouble(args[3]);
  const int process_set = (int)PyLong_AsLong(args[4]);
  if (PyErr_Occurred()) {
    PyBuffer_Release(&buf);
    return NULL;
  }
  int status;
  Py_BEGIN_ALLOW_THREADS
  status = allreduce_ptr(buf.buf, buf.buf, buf.len / buf.itemsize, dtype, op, prescale, postscale, process_set);
  Py_END_ALLOW_THREADS
  PyBuffer_Release(&buf);
  if (status != HPCDL_OK) return fail(status);
  Py_RETURN_TRUE;
}

#define RUN_ARGS 12

/* run(op_type, name, process_set, dtype, input, output, shape, reduce_op, prescale, postscale, root, keep):
 * submits one operation whose output the caller owns (allreduce, broadcast, reducescatter) and waits for
 * it, without a handle object: a blocking collective in one call (hpcdl_run, with the GIL released: the
 * engine thread is not woken for it). When the engine is idle and the response cache knows the name, the
 * runtime runs the collective on this thread (see hpcdl_wait). input and output are addresses; `keep` owns
 * the buffers and is kept alive past a timeout (the operation may still run then). */
static PyObject* run(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  if (!bound()) return NULL;
  if (nargs != RUN_ARGS) {
    PyErr_Format(PyExc_TypeError, "run() takes %d arguments (%zd given)", RUN_ARGS, nargs);
    return NULL;
  }
  hpcdl_request r;
  int64_t shape[MAX_DIMS];
  Py_ssize_t ndim = 0;
  r.op_type = (int32_t)PyLong_AsLong(args[0]);
  r.name = NULL;
  if (args[1] != Py_None && (r.name = PyUnicode_AsUTF8(args[1])) == NULL) return NULL;
  r.process_set = (int32_t)PyLong_AsLong(args[2]);
  r.dtype = (int32_t)PyLong_AsLong(args[3]);
  if (!address_of(args[4], 0, (void**)&r.input) || !address_of(args[5], 1, &r.output) ||
      !int64s_of(args[6], shape, MAX_DIMS, &ndim, "shape"))
    return bad_submission();
  r.ndim = (int32_t)ndim;
  r.shape = shape;
  r.reduce_op = (int32_t)PyLong_AsLong(args[7]);
  r.prescale = PyFloat_AsDouble(args[8]);
  r.postscale = PyFloat_AsDouble(args[9]);
  r.root = (int32_t)PyLong_AsLong(args[10]);
  if (PyErr_Occurred()) return NULL;
  r.splits = NULL;
  r.nsplits = 0;
  r.group_id = 0;
  r.group_size = 0;
  r.placement = HPCDL_PLACEMENT_HOST;
  r.tag = 0;
  if (PyList_GET_SIZE(orphans) > 0 && reap_orphans() < 0) return NULL;
  hpcdl_handle id = 0;
  int status;
  Py_BEGIN_ALLOW_THREADS
  status = run_ptr(&r, -1.0, &id);
  Py_END_ALLOW_THREADS
  if (id <= 0) return fail(status);
  if (status == HPCDL_ERR_TIMEOUT) {
    /* The operation may still run: its buffers stay alive until it ends (see reap_orphans). */
    PyObject* entry = Py_BuildValue("(LO)", (long long)id, args[11]);
    if (entry == NULL || PyList_Append(orphans, entry) < 0) {
      Py_XDECREF(entry);
      return NULL;
    }
    Py_DECREF(entry);
    return fail(status);
  }
  if (status != HPCDL_OK) {
    PyObject* raised = fail(status); /* reads the error of this thread's last call before release clears it */
    release_ptr(id);
    return raised;
  }
  release_ptr(id);
  Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"bind", (PyCFunction)(void (*)(void))bind, METH_FASTCALL,
     "bind(enqueue, wait, poll, release, allreduce, run, raise_status, error_class, array_type, formats)"},
    {"submit", (PyCFunction)(void (*)(void))submit, METH_FASTCALL,
     "submit(cls, op_type, name, process_set, dtype, input, output, shape, reduce_op, prescale, postscale, "
     "root, splits, group_id, group_size, keep, result, value, placement, tag, wait) -> handle (a cls instance; "
     "with wait, finished)"},
    {"run", (PyCFunction)(void (*)(void))run, METH_FASTCALL,
     "run(op_type, name, process_set, dtype, input, output, shape, reduce_op, prescale, postscale, root, keep): "
     "submit an operation with a caller-owned output and wait for it"},
    {"allreduce_now", (PyCFunction)(void (*)(void))allreduce_now, METH_FASTCALL,
     "allreduce_now(a, reduce_op, prescale, postscale, process_set) -> True, or None when the Python code must "
     "take the call"},
    {"allreduce", (PyCFunction)(void (*)(void))allreduce, METH_FASTCALL,
     "allreduce(cls, op_type, a, name, reduce_op, prescale, postscale, out, process_set) -> handle, or None "
     "when the Python helper must take the call"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_hotpath", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__hotpath(void) {
  if (PyType_Ready(&HandleType) < 0) return NULL;
  PyObject* m = PyModule_Create(&module);
  if (m == NULL) return NULL;
  Py_INCREF(&HandleType);
  if (PyModule_AddObject(m, "HandleBase", (PyObject*)&HandleType) < 0) {
    Py_DECREF(&HandleType);
    Py_DECREF(m);
    return NULL;
  }
  return m;
}
