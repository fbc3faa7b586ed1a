// An op's call from C: the `tp_call` slot of the public ops' classes (subclasses of
// xkernels.ops.op.Op whose `__call__` is Op.__call__). A repeat that the op's RouteTable runs
// (native_route.h) is run from here without a Python frame; anything the table declines goes to
// the slot CPython made for the class, i.e. Op.__call__ in Python, which looks again and goes on
// (a decline costs one more key, tens of nanoseconds, on a path that then runs Python anyway).
//
// The class keeps its Python `__call__` in its dict: that is what torch.compile (dynamo traces
// the bytecode of `type(op).__call__`, never this slot), inspect and help() read, and what runs
// where this slot is not installed (no extension, XKERNELS_NATIVE=0). Reassigning a class's
// `__call__` makes CPython recompute its slot, which drops this one; once it is Op.__call__
// again, the next repeat Op.__call__ finds in the table installs it back
// (Op._restore_call_slot). Op.__call__ asks torch.compiler.is_compiling() before the table; here
// the table alone decides, which is the same answer: the table declines every call made while
// tracing (FakeTensors and proxies are subclasses or run under a dispatch mode), and dynamo never
// calls the slot.
// Included by native.cpp only.
#pragma once

#include <Python.h>

#include "native_route.h"

namespace xk {

struct OpCallState {
  ternaryfunc python_call = nullptr;  // the slot CPython gave the classes: runs their __call__
  PyObject* table_attr = nullptr;     // "_native": the op's RouteTable, or None
};

inline OpCallState& op_call_state() {
  static OpCallState s;
  return s;
}

inline PyObject* op_call(PyObject* self, PyObject* args, PyObject* kwargs) {
  OpCallState& s = op_call_state();
  if (PyObject* table = PyObject_GetAttr(self, s.table_attr)) {
    PyObject* result = Py_TYPE(table) == &route_table_type() ? PyObject_Call(table, args, kwargs) : Py_NewRef(Py_None);
    Py_DECREF(table);
    if (result != Py_None) return result;  // the table's result, or its error
    Py_DECREF(result);
  } else {
    PyErr_Clear();  // no table attribute (yet): Op.__call__ decides
  }
  return s.python_call(self, args, kwargs);
}

// Installs op_call as `cls`'s call slot; false where `cls` is not a Python class whose slot is
// the one CPython makes for a Python __call__ (the caller checked that it is Op.__call__).
inline bool install_op_call(PyObject* cls) {
  if (!PyType_Check(cls)) {
    PyErr_SetString(PyExc_TypeError, "install_op_call: expected a class");
    return false;
  }
  auto* t = reinterpret_cast<PyTypeObject*>(cls);
  OpCallState& s = op_call_state();
  if (t->tp_call == op_call) return true;
  if (!(t->tp_flags & Py_TPFLAGS_HEAPTYPE) || !t->tp_call) return false;
  if (!s.table_attr) s.table_attr = PyUnicode_InternFromString("_native");
  if (!s.python_call) s.python_call = t->tp_call;
  if (t->tp_call != s.python_call) return false;  // some other slot: leave the class as it is
  t->tp_call = op_call;
  return true;
}

inline bool op_call_installed(PyObject* cls) {
  return PyType_Check(cls) && reinterpret_cast<PyTypeObject*>(cls)->tp_call == op_call;
}

}  // namespace xk
