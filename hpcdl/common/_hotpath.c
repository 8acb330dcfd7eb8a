/* The per-operation hot path of hpcdl.common.engine, in C.
 *
 * A training step submits a few hundred tensors and waits for each; through ctypes every submission
 * costs 10 to 15 us of Python (a ctypes structure, pointer lookups, argument conversion), as much as the
 * engine's whole negotiation. This module builds the hpcdl_request on the stack from Python objects and
 * calls the runtime directly, in about a microsecond.
 *
 * It links to nothing: bind() hands it the addresses of hpcdl_enqueue, hpcdl_wait, hpcdl_poll and
 * hpcdl_release from the library hpcdl.common.library loaded through ctypes, so HPCDL_LIBRARY keeps
 * selecting the runtime and the C ABI (c_api.h) stays the only contract with it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "hpcdl/c_api.h"

#define MAX_DIMS 32
#define MAX_SPLITS 4096

typedef hpcdl_handle (*enqueue_fn)(const hpcdl_request*);
typedef int (*handle_fn)(hpcdl_handle);
typedef int (*wait_fn)(hpcdl_handle, double);

static enqueue_fn enqueue_ptr;
static wait_fn wait_ptr;
static handle_fn poll_ptr, release_ptr;

static int bound(void) {
  if (enqueue_ptr) return 1;
  PyErr_SetString(PyExc_RuntimeError, "hpcdl._hotpath is not bound to the runtime library (call bind())");
  return 0;
}

/* bind(enqueue, wait, poll, release): the functions' addresses in the loaded runtime. */
static PyObject* bind(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 4) {
    PyErr_SetString(PyExc_TypeError, "bind() takes the addresses of enqueue, wait, poll and release");
    return NULL;
  }
  void* f[4];
  for (int i = 0; i < 4; ++i) {
    f[i] = PyLong_AsVoidPtr(args[i]);
    if (f[i] == NULL) {
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "bind() got a NULL function address");
      return NULL;
    }
  }
  enqueue_ptr = (enqueue_fn)f[0];
  wait_ptr = (wait_fn)f[1];
  poll_ptr = (handle_fn)f[2];
  release_ptr = (handle_fn)f[3];
  Py_RETURN_NONE;
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

/* enqueue(op_type, name, process_set, dtype, input, output, shape, reduce_op, prescale, postscale, root,
 *         splits, group_id, group_size) -> handle (> 0) or a negative hpcdl_status. */
static PyObject* enqueue(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  if (!bound()) return NULL;
  if (nargs != 14) {
    PyErr_Format(PyExc_TypeError, "enqueue() takes 14 arguments (%zd given)", nargs);
    return NULL;
  }
  hpcdl_request r;
  int64_t shape[MAX_DIMS];
  Py_ssize_t ndim = 0, nsplits = 0;
  int64_t* splits = NULL;
  r.op_type = (int32_t)PyLong_AsLong(args[0]);
  r.name = NULL;
  if (args[1] != Py_None) {
    r.name = PyUnicode_AsUTF8(args[1]);
    if (r.name == NULL) return NULL;
  }
  r.process_set = (int32_t)PyLong_AsLong(args[2]);
  r.dtype = (int32_t)PyLong_AsLong(args[3]);
  if (!address_of(args[4], 0, (void**)&r.input) || !address_of(args[5], 1, &r.output)) return NULL;
  if (!int64s_of(args[6], shape, MAX_DIMS, &ndim, "shape")) return NULL;
  r.ndim = (int32_t)ndim;
  r.shape = shape;
  r.reduce_op = (int32_t)PyLong_AsLong(args[7]);
  r.prescale = PyFloat_AsDouble(args[8]);
  r.postscale = PyFloat_AsDouble(args[9]);
  r.root = (int32_t)PyLong_AsLong(args[10]);
  r.group_id = (int32_t)PyLong_AsLong(args[12]);
  r.group_size = (int32_t)PyLong_AsLong(args[13]);
  if (PyErr_Occurred()) return NULL;
  if (args[11] != Py_None) {
    splits = PyMem_Malloc(sizeof(int64_t) * MAX_SPLITS);
    if (splits == NULL) return PyErr_NoMemory();
    if (!int64s_of(args[11], splits, MAX_SPLITS, &nsplits, "splits")) {
      PyMem_Free(splits);
      return NULL;
    }
  }
  r.splits = splits;
  r.nsplits = (int32_t)nsplits;
  hpcdl_handle handle = enqueue_ptr(&r);
  PyMem_Free(splits);
  return PyLong_FromLongLong(handle);
}

/* wait(handle, timeout_s) -> hpcdl_status; the GIL is released while waiting. */
static PyObject* wait(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  if (!bound()) return NULL;
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "wait() takes a handle and a timeout");
    return NULL;
  }
  hpcdl_handle handle = PyLong_AsLongLong(args[0]);
  double timeout = PyFloat_AsDouble(args[1]);
  if (PyErr_Occurred()) return NULL;
  int status;
  Py_BEGIN_ALLOW_THREADS
  status = wait_ptr(handle, timeout);
  Py_END_ALLOW_THREADS
  return PyLong_FromLong(status);
}

static PyObject* call_handle(handle_fn fn, PyObject* arg) {
  if (!bound()) return NULL;
  hpcdl_handle handle = PyLong_AsLongLong(arg);
  if (handle == -1 && PyErr_Occurred()) return NULL;
  return PyLong_FromLong(fn(handle));
}

static PyObject* poll(PyObject* self, PyObject* arg) { return call_handle(poll_ptr, arg); }
static PyObject* release(PyObject* self, PyObject* arg) { return call_handle(release_ptr, arg); }

static PyMethodDef methods[] = {
    {"bind", (PyCFunction)(void (*)(void))bind, METH_FASTCALL, "bind(enqueue, wait, poll, release)"},
    {"enqueue", (PyCFunction)(void (*)(void))enqueue, METH_FASTCALL,
     "enqueue(op_type, name, process_set, dtype, input, output, shape, reduce_op, prescale, postscale, root, "
     "splits, group_id, group_size) -> handle (> 0) or -status"},
    {"wait", (PyCFunction)(void (*)(void))wait, METH_FASTCALL, "wait(handle, timeout_s) -> status"},
    {"poll", poll, METH_O, "poll(handle) -> status"},
    {"release", release, METH_O, "release(handle) -> status"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_hotpath", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__hotpath(void) { return PyModule_Create(&module); }
