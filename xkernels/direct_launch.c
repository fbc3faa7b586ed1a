/* A launch record: one compiled Triton kernel, its grid and every argument but the data
 * pointers, packed once; calling it with the tensors launches the kernel through
 * cuLaunchKernel. See direct_launch.py for why and when it is used.
 *
 *   record = Record(function, gx, gy, gz, threads, shared, slots, ptr_slots,
 *                   get_device, get_stream, enter_hook, exit_hook)
 *   record(t0, t1, ...) -> True (launched) | False (not launched: the caller launches the
 *                          ordinary way)
 *
 * slots: bytes, 8 per kernel parameter, scalars already packed little-endian; ptr_slots: the
 * parameter index of each tensor argument. False is returned, before anything is launched, when
 * a data pointer is not 16-byte aligned (the kernel was compiled for aligned pointers), when a
 * launch hook is installed (enter_hook.calls / exit_hook.calls non-empty), or when the calling
 * thread has no CUDA context. The GIL is held from packing to launch, so two threads cannot
 * interleave on one record.
 *
 * No CUDA header or library is needed to build it: the driver is opened at run time.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef int CUresult;
typedef void *CUfunction;
typedef void *CUstream;
typedef void *CUcontext;
typedef CUresult (*launch_t)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, CUstream, void **, void **);
typedef CUresult (*ctx_t)(CUcontext *);
typedef CUresult (*errstr_t)(CUresult, const char **);

static launch_t cu_launch = NULL;
static ctx_t cu_ctx_get_current = NULL;
static errstr_t cu_get_error_string = NULL;
static const char *driver_error = "libcuda.so.1 not opened yet";

static int open_driver(void) {
  if (cu_launch) return 1;
  void *h = dlopen("libcuda.so.1", RTLD_LAZY);
  if (!h) {
    driver_error = "libcuda.so.1 could not be opened (no NVIDIA driver)";
    return 0;
  }
  cu_launch = (launch_t)dlsym(h, "cuLaunchKernel");
  cu_ctx_get_current = (ctx_t)dlsym(h, "cuCtxGetCurrent");
  cu_get_error_string = (errstr_t)dlsym(h, "cuGetErrorString");
  if (!cu_launch || !cu_ctx_get_current) {
    cu_launch = NULL;
    driver_error = "libcuda.so.1 lacks cuLaunchKernel/cuCtxGetCurrent";
    return 0;
  }
  return 1;
}

#define MAX_PARAMS 64
#define MAX_PTRS 8

typedef struct {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  CUfunction function;
  unsigned grid[3], threads, shared;
  Py_ssize_t n_params, n_ptrs;
  Py_ssize_t ptr_slot[MAX_PTRS];
  PyObject *get_device, *get_stream, *enter_hook, *exit_hook;
  uint64_t slots[MAX_PARAMS];
  void *params[MAX_PARAMS];
} Record;

static PyObject *str_calls, *str_data_ptr;

static int hook_active(PyObject *hook) {
  PyObject *calls = PyObject_GetAttr(hook, str_calls);
  if (!calls) return -1;
  int on = PyObject_IsTrue(calls);
  Py_DECREF(calls);
  return on;
}

static int as_u64(PyObject *o, uint64_t *out) {
  if (PyLong_Check(o)) {
    *out = PyLong_AsUnsignedLongLong(o);
    return PyErr_Occurred() ? -1 : 0;
  }
  PyObject *p = PyObject_CallMethodNoArgs(o, str_data_ptr);
  if (!p) return -1;
  *out = PyLong_AsUnsignedLongLong(p);
  Py_DECREF(p);
  return PyErr_Occurred() ? -1 : 0;
}

static PyObject *record_call(PyObject *self_obj, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
  Record *self = (Record *)self_obj;
  Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  if (kwnames && PyTuple_GET_SIZE(kwnames)) {
    PyErr_SetString(PyExc_TypeError, "launch record takes no keyword arguments");
    return NULL;
  }
  if (nargs != self->n_ptrs) {
    PyErr_Format(PyExc_TypeError, "launch record takes %zd tensors, got %zd", self->n_ptrs, nargs);
    return NULL;
  }
  uint64_t ptr[MAX_PTRS], any = 0;
  for (Py_ssize_t j = 0; j < nargs; j++) {
    if (as_u64(args[j], &ptr[j]) < 0) return NULL;
    any |= ptr[j];
  }
  if (any & 15) Py_RETURN_FALSE;
  int on = hook_active(self->enter_hook);
  if (on != 0) { if (on < 0) return NULL; Py_RETURN_FALSE; }
  on = hook_active(self->exit_hook);
  if (on != 0) { if (on < 0) return NULL; Py_RETURN_FALSE; }
  if (!open_driver()) {
    PyErr_SetString(PyExc_RuntimeError, driver_error);
    return NULL;
  }
  CUcontext ctx = NULL;
  if (cu_ctx_get_current(&ctx) != 0 || !ctx) Py_RETURN_FALSE;
  PyObject *dev = PyObject_CallNoArgs(self->get_device);
  if (!dev) return NULL;
  PyObject *st = PyObject_CallOneArg(self->get_stream, dev);
  Py_DECREF(dev);
  if (!st) return NULL;
  uint64_t stream = PyLong_AsUnsignedLongLong(st);
  Py_DECREF(st);
  if (PyErr_Occurred()) return NULL;
  for (Py_ssize_t j = 0; j < nargs; j++) self->slots[self->ptr_slot[j]] = ptr[j];
  CUresult r = cu_launch(self->function, self->grid[0], self->grid[1], self->grid[2], self->threads, 1, 1,
                         self->shared, (CUstream)(uintptr_t)stream, self->params, NULL);
  if (r != 0) {
    const char *msg = "unknown error";
    if (cu_get_error_string) cu_get_error_string(r, &msg);
    PyErr_Format(PyExc_RuntimeError, "xkernels direct launch: cuLaunchKernel failed (%d): %s", r, msg);
    return NULL;
  }
  Py_RETURN_TRUE;
}

static PyObject *record_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
  unsigned long long function;
  unsigned gx, gy, gz, threads, shared;
  Py_buffer slots;
  PyObject *ptr_slots, *get_device, *get_stream, *enter_hook, *exit_hook;
  if (!PyArg_ParseTuple(args, "KIIIIIy*O!OOOO", &function, &gx, &gy, &gz, &threads, &shared, &slots,
                        &PyTuple_Type, &ptr_slots, &get_device, &get_stream, &enter_hook, &exit_hook))
    return NULL;
  Py_ssize_t n_params = slots.len / 8, n_ptrs = PyTuple_GET_SIZE(ptr_slots);
  if (slots.len % 8 || n_params > MAX_PARAMS || n_ptrs > MAX_PTRS || n_ptrs < 1) {
    PyBuffer_Release(&slots);
    PyErr_Format(PyExc_ValueError, "launch record: %zd bytes of slots (8 per parameter, at most %d) and %zd "
                 "pointers (1 to %d)", slots.len, MAX_PARAMS, n_ptrs, MAX_PTRS);
    return NULL;
  }
  Record *self = (Record *)type->tp_alloc(type, 0);
  if (!self) { PyBuffer_Release(&slots); return NULL; }
  memcpy(self->slots, slots.buf, slots.len);
  PyBuffer_Release(&slots);
  for (Py_ssize_t i = 0; i < n_params; i++) self->params[i] = &self->slots[i];
  for (Py_ssize_t j = 0; j < n_ptrs; j++) {
    Py_ssize_t s = PyLong_AsSsize_t(PyTuple_GET_ITEM(ptr_slots, j));
    if (s < 0 || s >= n_params) {
      Py_DECREF(self);
      if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "launch record: pointer slot %zd out of range", s);
      return NULL;
    }
    self->ptr_slot[j] = s;
  }
  self->vectorcall = record_call;
  self->function = (CUfunction)(uintptr_t)function;
  self->grid[0] = gx; self->grid[1] = gy; self->grid[2] = gz;
  self->threads = threads;
  self->shared = shared;
  self->n_params = n_params;
  self->n_ptrs = n_ptrs;
  Py_INCREF(get_device); self->get_device = get_device;
  Py_INCREF(get_stream); self->get_stream = get_stream;
  Py_INCREF(enter_hook); self->enter_hook = enter_hook;
  Py_INCREF(exit_hook); self->exit_hook = exit_hook;
  return (PyObject *)self;
}

static void record_dealloc(Record *self) {
  Py_XDECREF(self->get_device);
  Py_XDECREF(self->get_stream);
  Py_XDECREF(self->enter_hook);
  Py_XDECREF(self->exit_hook);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *record_slots(Record *self, PyObject *unused) {
  return PyBytes_FromStringAndSize((const char *)self->slots, self->n_params * 8);
}

static PyObject *record_bench(Record *self, PyObject *arg) {
  /* n launches from a C loop with the packed arguments: the driver's own cost per launch */
  long n = PyLong_AsLong(arg);
  if (n < 0 && PyErr_Occurred()) return NULL;
  if (!open_driver()) { PyErr_SetString(PyExc_RuntimeError, driver_error); return NULL; }
  PyObject *dev = PyObject_CallNoArgs(self->get_device);
  if (!dev) return NULL;
  PyObject *st = PyObject_CallOneArg(self->get_stream, dev);
  Py_DECREF(dev);
  if (!st) return NULL;
  uint64_t stream = PyLong_AsUnsignedLongLong(st);
  Py_DECREF(st);
  for (long i = 0; i < n; i++) {
    CUresult r = cu_launch(self->function, self->grid[0], self->grid[1], self->grid[2], self->threads, 1, 1,
                           self->shared, (CUstream)(uintptr_t)stream, self->params, NULL);
    if (r != 0) return PyErr_Format(PyExc_RuntimeError, "cuLaunchKernel failed (%d)", r);
  }
  Py_RETURN_NONE;
}

static PyMethodDef record_methods[] = {
    {"slots", (PyCFunction)record_slots, METH_NOARGS, "The packed parameter slots (8 bytes each)."},
    {"bench", (PyCFunction)record_bench, METH_O, "Launch n times from C with the last pointers; for measuring."},
    {NULL, NULL, 0, NULL}};

static PyTypeObject RecordType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "xkernels_direct_launch.Record",
    .tp_basicsize = sizeof(Record),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(Record, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_new = record_new,
    .tp_dealloc = (destructor)record_dealloc,
    .tp_methods = record_methods,
    .tp_doc = "A packed launch of one compiled kernel; call it with the tensors.",
};

static PyObject *driver_ok(PyObject *m, PyObject *unused) {
  if (open_driver()) Py_RETURN_TRUE;
  Py_RETURN_FALSE;
}

static PyMethodDef module_methods[] = {
    {"driver_ok", driver_ok, METH_NOARGS, "Whether libcuda.so.1 could be opened."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "xkernels_direct_launch", NULL, -1, module_methods};

PyMODINIT_FUNC PyInit_xkernels_direct_launch(void) {
  str_calls = PyUnicode_InternFromString("calls");
  str_data_ptr = PyUnicode_InternFromString("data_ptr");
  if (!str_calls || !str_data_ptr || PyType_Ready(&RecordType) < 0) return NULL;
  PyObject *m = PyModule_Create(&module_def);
  if (!m) return NULL;
  Py_INCREF(&RecordType);
  if (PyModule_AddObject(m, "Record", (PyObject *)&RecordType) < 0) {
    Py_DECREF(&RecordType);
    Py_DECREF(m);
    return NULL;
  }
  return m;
}
