/* A launch record: one compiled Triton kernel, its grid and every argument but the data
 * pointers, packed once; calling it with the tensors launches the kernel through
 * cuLaunchKernel. See cuda_launch.py for why and when it is used.
 *
 *   record = Record(function, gx, gy, gz, threads, shared, slots, ptr_slots,
 *                   get_device, get_stream, enter_hook, exit_hook)
 *   record(t0, t1, ...) -> True (launched) | False (not launched: the caller launches the
 *                          ordinary way)
 *
 * slots: bytes, 8 per kernel parameter, scalars already packed little-endian; ptr_slots: the
 * parameter index of each tensor argument, or -1 - k for one that is the base of tensor map k.
 * maps (optional): per TMA tensor descriptor of the kernel, (parameter index, CUtensorMap data
 * type, swizzle, element size, shape, strides in elements, block shape, padding), as Triton's
 * fill_tma_descriptor takes them; the record encodes each map per call from its base pointer
 * (cuTensorMapEncodeTiled) into the 128-byte parameter the kernel takes by value. False is returned, before anything is launched, when
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
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef void *CUfunction;
typedef void *CUstream;
typedef void *CUcontext;
typedef CUresult (*launch_t)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, CUstream, void **, void **);
typedef CUresult (*ctx_t)(CUcontext *);
typedef CUresult (*errstr_t)(CUresult, const char **);
typedef CUresult (*encode_t)(void *, int, uint32_t, void *, const uint64_t *, const uint64_t *, const uint32_t *,
                             const uint32_t *, int, int, int, int);

static launch_t cu_launch = NULL;
static ctx_t cu_ctx_get_current = NULL;
static errstr_t cu_get_error_string = NULL;
static encode_t cu_encode_tiled = NULL;  /* cuTensorMapEncodeTiled (CUDA 12+ drivers) */
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
  cu_encode_tiled = (encode_t)dlsym(h, "cuTensorMapEncodeTiled");
  if (!cu_launch || !cu_ctx_get_current) {
    cu_launch = NULL;
    driver_error = "libcuda.so.1 lacks cuLaunchKernel/cuCtxGetCurrent";
    return 0;
  }
  return 1;
}

#define MAX_PARAMS 64
#define MAX_PTRS 8
#define MAX_MAPS 4
#define MAX_RANK 5

typedef struct {
  int param, dtype, swizzle, fill;
  uint32_t rank;
  uint64_t dims[MAX_RANK], strides[MAX_RANK]; /* innermost first; strides in bytes */
  uint32_t box[MAX_RANK], elem_strides[MAX_RANK];
} MapSpec;

typedef struct {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  CUfunction function;
  unsigned grid[3], threads, shared;
  Py_ssize_t n_params, n_ptrs, n_maps;
  Py_ssize_t ptr_slot[MAX_PTRS]; /* >= 0: a parameter slot; -1 - k: the base of map k */
  PyObject *get_device, *get_stream, *enter_hook, *exit_hook;
  uint64_t slots[MAX_PARAMS];
  void *params[MAX_PARAMS];
  MapSpec map_spec[MAX_MAPS];
  unsigned char (*maps)[128]; /* n_maps CUtensorMaps, 128-byte aligned (as Triton keeps them) */
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
  for (Py_ssize_t j = 0; j < nargs; j++) {
    Py_ssize_t at = self->ptr_slot[j];
    if (at >= 0) {
      self->slots[at] = ptr[j];
      continue;
    }
    MapSpec *m = &self->map_spec[-1 - at];
    if (!cu_encode_tiled) {
      PyErr_SetString(PyExc_RuntimeError, "xkernels direct launch: the driver has no cuTensorMapEncodeTiled");
      return NULL;
    }
    CUresult e = cu_encode_tiled(self->maps[-1 - at], m->dtype, m->rank, (void *)(uintptr_t)ptr[j], m->dims,
                                 m->strides, m->box, m->elem_strides, 0 /* interleave none */, m->swizzle,
                                 2 /* L2 promotion 128B */, m->fill);
    if (e != 0) {
      const char *msg = "unknown error";
      if (cu_get_error_string) cu_get_error_string(e, &msg);
      PyErr_Format(PyExc_RuntimeError, "xkernels direct launch: cuTensorMapEncodeTiled failed (%d): %s", e, msg);
      return NULL;
    }
  }
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

static int read_u64s(PyObject *seq, uint64_t *out, Py_ssize_t n, const char *what) {
  if (!PyTuple_Check(seq) || PyTuple_GET_SIZE(seq) != n) {
    PyErr_Format(PyExc_ValueError, "launch record: a map's %s must be a tuple of %zd ints", what, n);
    return -1;
  }
  for (Py_ssize_t i = 0; i < n; i++) {
    out[i] = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(seq, i));
    if (PyErr_Occurred()) return -1;
  }
  return 0;
}

static int read_map(PyObject *spec, MapSpec *m, Py_ssize_t n_params) {
  /* (param, dtype, swizzle, elem_size, shape, strides, block, padding), outermost dim first, as
   * fill_tma_descriptor takes them; stored innermost first, strides in bytes (the innermost
   * stride is the element size and not passed to the driver) */
  int param, dtype, swizzle, elem_size, padding;
  PyObject *shape, *strides, *block;
  if (!PyTuple_Check(spec) || !PyArg_ParseTuple(spec, "iiiiOOOi", &param, &dtype, &swizzle, &elem_size, &shape,
                                                &strides, &block, &padding))
    return -1;
  Py_ssize_t rank = PyTuple_Check(shape) ? PyTuple_GET_SIZE(shape) : -1;
  if (rank < 1 || rank > MAX_RANK || param < 0 || param >= n_params || elem_size < 1) {
    PyErr_Format(PyExc_ValueError, "launch record: bad tensor map (parameter %d of %zd, rank %zd)", param,
                 n_params, rank);
    return -1;
  }
  uint64_t dims[MAX_RANK], st[MAX_RANK], box[MAX_RANK];
  if (read_u64s(shape, dims, rank, "shape") < 0 || read_u64s(strides, st, rank, "strides") < 0 ||
      read_u64s(block, box, rank, "block shape") < 0)
    return -1;
  m->param = param; m->dtype = dtype; m->swizzle = swizzle; m->fill = padding ? 1 : 0;
  m->rank = (uint32_t)rank;
  for (Py_ssize_t i = 0; i < rank; i++) {
    m->dims[rank - 1 - i] = dims[i];
    m->box[rank - 1 - i] = (uint32_t)box[i];
    m->elem_strides[i] = 1;
  }
  for (Py_ssize_t i = 0; i + 1 < rank; i++) m->strides[rank - 2 - i] = st[i] * (uint64_t)elem_size;
  return 0;
}

static PyObject *record_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
  unsigned long long function;
  unsigned gx, gy, gz, threads, shared;
  Py_buffer slots;
  PyObject *ptr_slots, *get_device, *get_stream, *enter_hook, *exit_hook, *maps = NULL;
  if (!PyArg_ParseTuple(args, "KIIIIIy*O!OOOO|O!", &function, &gx, &gy, &gz, &threads, &shared, &slots,
                        &PyTuple_Type, &ptr_slots, &get_device, &get_stream, &enter_hook, &exit_hook,
                        &PyTuple_Type, &maps))
    return NULL;
  Py_ssize_t n_params = slots.len / 8, n_ptrs = PyTuple_GET_SIZE(ptr_slots);
  Py_ssize_t n_maps = maps ? PyTuple_GET_SIZE(maps) : 0;
  if (slots.len % 8 || n_params > MAX_PARAMS || n_ptrs > MAX_PTRS || n_ptrs < 1 || n_maps > MAX_MAPS) {
    PyBuffer_Release(&slots);
    PyErr_Format(PyExc_ValueError, "launch record: %zd bytes of slots (8 per parameter, at most %d), %zd "
                 "pointers (1 to %d) and %zd tensor maps (at most %d)", slots.len, MAX_PARAMS, n_ptrs, MAX_PTRS,
                 n_maps, MAX_MAPS);
    return NULL;
  }
  Record *self = (Record *)type->tp_alloc(type, 0);
  if (!self) { PyBuffer_Release(&slots); return NULL; }
  memcpy(self->slots, slots.buf, slots.len);
  PyBuffer_Release(&slots);
  for (Py_ssize_t i = 0; i < n_params; i++) self->params[i] = &self->slots[i];
  if (n_maps) {
    void *buf = NULL;
    if (posix_memalign(&buf, 128, (size_t)n_maps * 128) != 0) {
      Py_DECREF(self);
      return PyErr_NoMemory();
    }
    memset(buf, 0, (size_t)n_maps * 128);
    self->maps = (unsigned char (*)[128])buf;
  }
  for (Py_ssize_t k = 0; k < n_maps; k++) {
    if (read_map(PyTuple_GET_ITEM(maps, k), &self->map_spec[k], n_params) < 0) {
      Py_DECREF(self);
      return NULL;
    }
    self->params[self->map_spec[k].param] = self->maps[k];
  }
  for (Py_ssize_t j = 0; j < n_ptrs; j++) {
    Py_ssize_t s = PyLong_AsSsize_t(PyTuple_GET_ITEM(ptr_slots, j));
    if (s >= n_params || s < -n_maps || (s == -1 && PyErr_Occurred())) {
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
  self->n_maps = n_maps;
  Py_INCREF(get_device); self->get_device = get_device;
  Py_INCREF(get_stream); self->get_stream = get_stream;
  Py_INCREF(enter_hook); self->enter_hook = enter_hook;
  Py_INCREF(exit_hook); self->exit_hook = exit_hook;
  return (PyObject *)self;
}

static PyObject *record_map(Record *self, PyObject *arg) {
  /* the 128 bytes of tensor map k as last encoded (zeros before the first launch); for tests */
  long k = PyLong_AsLong(arg);
  if (k == -1 && PyErr_Occurred()) return NULL;
  if (k < 0 || k >= self->n_maps) return PyErr_Format(PyExc_IndexError, "no tensor map %ld", k);
  return PyBytes_FromStringAndSize((const char *)self->maps[k], 128);
}

static PyObject *encode_available(PyObject *m, PyObject *unused) {
  if (open_driver() && cu_encode_tiled) Py_RETURN_TRUE;
  Py_RETURN_FALSE;
}

static void record_dealloc(Record *self) {
  free(self->maps);
  Py_XDECREF(self->get_device);
  Py_XDECREF(self->get_stream);
  Py_XDECREF(self->enter_hook);
  Py_XDECREF(self->exit_hook);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *record_slots(Record *self, PyObject *unused) {
  return PyBytes_FromStringAndSize((const char *)self->slots, self->n_params * 8);
}

static PyObject *record_spec(Record *self, PyObject *unused) {
  /* what native.cpp copies to launch without Python: (function, gx, gy, gz, threads, shared, slots,
   * ptr_slots, maps, enter_hook, exit_hook); maps: per tensor map (param, dtype, swizzle, fill, dims,
   * strides in bytes, box), innermost first, as the record encodes them */
  PyObject *ptrs = PyTuple_New(self->n_ptrs);
  PyObject *maps = PyTuple_New(self->n_maps);
  if (!ptrs || !maps) {
    Py_XDECREF(ptrs);
    Py_XDECREF(maps);
    return NULL;
  }
  for (Py_ssize_t i = 0; i < self->n_ptrs; i++) PyTuple_SET_ITEM(ptrs, i, PyLong_FromSsize_t(self->ptr_slot[i]));
  for (Py_ssize_t k = 0; k < self->n_maps; k++) {
    MapSpec *m = &self->map_spec[k];
    PyObject *dims = PyTuple_New(m->rank), *strides = PyTuple_New(m->rank - 1), *box = PyTuple_New(m->rank);
    if (!dims || !strides || !box) {
      Py_XDECREF(dims); Py_XDECREF(strides); Py_XDECREF(box); Py_DECREF(ptrs); Py_DECREF(maps);
      return NULL;
    }
    for (uint32_t i = 0; i < m->rank; i++) {
      PyTuple_SET_ITEM(dims, i, PyLong_FromUnsignedLongLong(m->dims[i]));
      PyTuple_SET_ITEM(box, i, PyLong_FromUnsignedLong(m->box[i]));
      if (i + 1 < m->rank) PyTuple_SET_ITEM(strides, i, PyLong_FromUnsignedLongLong(m->strides[i]));
    }
    PyTuple_SET_ITEM(maps, k, Py_BuildValue("(iiiiNNN)", m->param, m->dtype, m->swizzle, m->fill, dims, strides, box));
  }
  return Py_BuildValue("(KIIIIIy#NNOO)", (unsigned long long)(uintptr_t)self->function, self->grid[0], self->grid[1],
                       self->grid[2], self->threads, self->shared, (const char *)self->slots,
                       (Py_ssize_t)(self->n_params * 8), ptrs, maps, self->enter_hook, self->exit_hook);
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
    {"spec", (PyCFunction)record_spec, METH_NOARGS, "The packed launch without its Python parts (native.cpp)."},
    {"bench", (PyCFunction)record_bench, METH_O, "Launch n times from C with the last pointers; for measuring."},
    {"map", (PyCFunction)record_map, METH_O, "The 128 bytes of tensor map k as last encoded."},
    {NULL, NULL, 0, NULL}};

static PyTypeObject RecordType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "xkernels_cuda_launch.Record",
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
    {"encode_available", encode_available, METH_NOARGS, "Whether the driver has cuTensorMapEncodeTiled."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "xkernels_cuda_launch", NULL, -1, module_methods};

PyMODINIT_FUNC PyInit_xkernels_cuda_launch(void) {
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
