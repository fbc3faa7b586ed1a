// enable()'s overrides registered from C++: aten::add.Tensor / add_.Tensor / mm / bmm / addmm on a
// backend dispatch key (Override), and aten::linear / aten::matmul on the Autograd key
// (CompositeOverride).
// Included by native.cpp only (its pybind module binds them); see xkernels/routing.py for how
// they are registered and docs/patching.md for what they run.
#pragma once

#include <ATen/ATen.h>
#include <ATen/ops/add_cpu_dispatch.h>
#include <ATen/ops/addmm_cpu_dispatch.h>
#include <ATen/ops/bmm_cpu_dispatch.h>
#include <ATen/ops/linear_native.h>
#include <ATen/ops/matmul_native.h>
#include <ATen/ops/mm_cpu_dispatch.h>
#ifdef XK_ATEN_CUDA
#include <ATen/ops/add_cuda_dispatch.h>
#include <ATen/ops/addmm_cuda_dispatch.h>
#include <ATen/ops/bmm_cuda_dispatch.h>
#include <ATen/ops/mm_cuda_dispatch.h>
#endif
#include <torch/library.h>

#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "native_route.h"

namespace xk::overrides {

namespace py = pybind11;

// -- enable()'s overrides, registered from C++ ------------------------------------------------
// aten::add.Tensor / add_.Tensor / mm / bmm / addmm on a backend dispatch key. A call whose
// signature (every operand's dtype, device, sizes and strides, a wrapped number's value, alpha)
// the Python override decided before and handed over is run here: `remember_route` / `remember_add`
// with a route (xkernels' kernel: allocate or take self, launch), `remember_vendor` /
// `remember_add` without one (the Python override's decision was aten's own kernel: the device's
// BLAS route, or an operand xkernels leaves to aten, such as a non-contiguous one). Any other
// call, every call made while the Python override runs on this thread, and every call while a
// use_backend() block is open, goes to the Python override (routing.py), which decides as it
// always did.
thread_local bool t_in_python = false;
// use_backend() blocks open anywhere in the process (xkernels.dispatch keeps the count): while
// one is, a call may belong to another backend than the one an entry was remembered for.
std::atomic<int> g_overrides_active{0};

enum OpIndex { kAdd = 0, kAddInplace, kMm, kBmm, kAddmm, kOps };
const char* const kOpNames[kOps] = {"add.Tensor", "add_.Tensor", "mm", "bmm", "addmm"};

using Counter = std::shared_ptr<std::atomic<int64_t>>;

struct Entry {
  bool vendor = false;  // aten's own kernel (its .out overload); else `route`
  Counter count;        // vendor: the calls of the Python override's reason for aten, run here
  std::shared_ptr<const xk::Route> route;  // parameters: the xkernels op's (add: x, y, out; linear: x, w, b; ...)
};

using xk::Key;  // the front door's key (a fixed array and its hash), tensors encoded alike
using xk::push_tensor;

Key key_of(std::initializer_list<const at::Tensor*> ts) {
  Key k;
  for (const at::Tensor* t : ts) push_tensor(k, *t);
  return k;
}

// A number in a key: its kind's tag (no dtype's value) and its bits.
enum NumberTag : int64_t { kTagBool = -7001, kTagInt = -7002, kTagFloat = -7003, kTagComplex = -7004 };

int64_t bits_of(double d) {
  int64_t b;
  std::memcpy(&b, &d, sizeof b);
  return b;
}

void push_scalar(Key& k, const c10::Scalar& s) {
  if (s.isBoolean()) {
    k.push(kTagBool);
    k.push(s.toBool());
  } else if (s.isIntegral(false)) {
    k.push(kTagInt);
    k.push(s.toLong());
  } else if (s.isFloatingPoint()) {
    k.push(kTagFloat);
    k.push(bits_of(s.toDouble()));
  } else {
    auto c = s.toComplexDouble();
    k.push(kTagComplex);
    k.push(bits_of(c.real()));
    k.push(bits_of(c.imag()));
  }
}

bool is_number(const at::Tensor& t) { return t.unsafeGetTensorImpl()->is_wrapped_number(); }

// A wrapped number's value (the 1.5 of `x + 1.5`: a 0-d CPU tensor of double, int64, bool or
// complex double), as the Python number PyTorch hands a Python kernel.
c10::Scalar number_of(const at::Tensor& t) {
  const void* p = t.data_ptr();
  switch (t.scalar_type()) {
    case at::kDouble: return *static_cast<const double*>(p);
    case at::kLong: return *static_cast<const int64_t*>(p);
    case at::kBool: return *static_cast<const bool*>(p);
    default: return t.item();
  }
}

// add / add_ (self, other, alpha): self's signature, other's (a tensor's, or a wrapped number's
// kind and value) and alpha's kind and value.
Key add_key(const at::Tensor& self, const at::Tensor& other, const c10::Scalar& alpha) {
  Key k;
  push_tensor(k, self);
  if (is_number(other))
    push_scalar(k, number_of(other));
  else
    push_tensor(k, other);
  push_scalar(k, alpha);
  return k;
}

struct Override {
  int op = 0;
  int slot = 0;  // the dispatch key's (slot_of)
  py::object py_fn;  // routing._add / _add_ / _mm / _bmm / _addmm
  std::unique_ptr<torch::Library> lib;
  std::mutex lock;
  // by key hash: (the key's values, its entry); `size` entries in all
  std::unordered_map<uint64_t, std::vector<std::pair<std::vector<int64_t>, std::shared_ptr<const Entry>>>> table;
  size_t size = 0;
  std::atomic<int64_t> hits{0};         // calls launched here on xkernels' kernel
  std::map<std::string, Counter> vendor_hits;  // per reason for aten, the calls that ran its kernel from here
  size_t limit = 1024;

  Counter counter(const std::string& why) {  // under `lock`
    auto& c = vendor_hits[why];
    if (!c) c = std::make_shared<std::atomic<int64_t>>(0);
    return c;
  }

  std::shared_ptr<const Entry> find(const Key& k) {  // the shared table, under `lock`
    if (!k.ok) return nullptr;  // longer than a key holds: the Python override decides
    const uint64_t h = k.hash();
    std::lock_guard<std::mutex> g(lock);
    auto it = table.find(h);
    if (it == table.end()) return nullptr;
    for (const auto& [key, e] : it->second)
      if (k.same(key)) return e;
    return nullptr;
  }

  void clear();  // under `lock`
  ~Override() {
    lib.reset();
    if (Py_IsInitialized()) {
      py::gil_scoped_acquire gil;
      py_fn = py::object();
      table.clear();
    } else {
      py_fn.release();
    }
  }
};

constexpr int kSlots = 3;  // CUDA, CPU, PrivateUse1
std::mutex g_over_lock;
std::shared_ptr<Override> g_over[kOps][kSlots];

// Bumped by every change to what a call may find: an override registered or removed, an entry
// stored, a table cleared.
std::atomic<uint64_t> g_generation{1};
void changed() { g_generation.fetch_add(1, std::memory_order_acq_rel); }

void Override::clear() {
  table.clear();
  size = 0;
  changed();
}

using Bucket = std::vector<std::pair<std::vector<int64_t>, std::shared_ptr<const Entry>>>;

// A thread's view of the overrides and of the entries it has found in their tables, as of the
// generation `gen`. While the generation has not moved, a call finds its override and its entry
// here with one atomic load and no lock or reference count (the shared tables take a mutex, and
// handing out a shared_ptr two atomic updates). The view owns what it holds: an override removed
// while a call is inside it lives until that thread's next call sees the new generation.
struct ThreadView {
  uint64_t gen = 0;
  std::shared_ptr<Override> over[kOps][kSlots];
  std::unordered_map<uint64_t, Bucket> found[kOps][kSlots];

  void refresh() {
    std::lock_guard<std::mutex> g(g_over_lock);
    gen = g_generation.load(std::memory_order_acquire);  // registration and removal change it under this lock
    for (int op = 0; op < kOps; ++op)
      for (int slot = 0; slot < kSlots; ++slot) {
        over[op][slot] = g_over[op][slot];
        found[op][slot].clear();
      }
  }
};
thread_local ThreadView t_view;

// The override of `op` on `slot` where one is registered, from this thread's view (refreshed if
// anything changed), else null.
Override* registered(int op, int slot) {
  if (t_view.gen != g_generation.load(std::memory_order_acquire)) t_view.refresh();
  return t_view.over[op][slot].get();
}

// The override of `op` on `slot`, whose kernel is running.
Override& current(int op, int slot) {
  Override* o = registered(op, slot);
  TORCH_CHECK(o, "xkernels: the native ", kOpNames[op], " override ran after it was removed");
  return *o;
}

// The entry of key `k` in `ov` (this thread's `current(ov.op, slot)`): from the view, else from
// the shared table (then kept in the view). Valid until this thread's next call of an override
// (the hit paths make none).
template <int Slot>
const Entry* find(Override& ov, const Key& k) {
  if (!k.ok) return nullptr;
  const uint64_t h = k.hash();
  auto& found = t_view.found[ov.op][Slot];
  if (auto it = found.find(h); it != found.end())
    for (const auto& [key, e] : it->second)
      if (k.same(key)) return e.get();
  std::shared_ptr<const Entry> e = ov.find(k);
  if (!e) return nullptr;
  const Entry* raw = e.get();
  found[h].emplace_back(k.vec(), std::move(e));
  return raw;
}

py::object scalar_to_py(const c10::Scalar& a) {
  if (a.isBoolean()) return py::bool_(a.toBool());
  if (a.isIntegral(false)) return py::int_(a.toLong());
  if (a.isFloatingPoint()) return py::float_(a.toDouble());
  return py::cast(c10::complex<double>(a.toComplexDouble()));
}

// As PyTorch hands a Python kernel its arguments: a wrapped number (the 1.5 of `x + 1.5`) as a
// Python number, not a 0-d tensor.
py::object as_py(const at::Tensor& t) {
  if (t.defined() && is_number(t)) return scalar_to_py(t.item());
  return py::cast(t);
}

bool is_one(const c10::Scalar& a) { return a.isIntegral(false) && a.toLong() == 1; }

bool may_run_here() { return !t_in_python && g_overrides_active.load(std::memory_order_relaxed) == 0; }

struct InPython {
  bool was = t_in_python;
  InPython() { t_in_python = true; }
  ~InPython() { t_in_python = was; }
};

// aten's own kernel of an overridden op on the slot's dispatch key, called directly (through the
// dispatcher the call would come back to the override): at::cuda:: (where the build links
// libtorch_cuda: XK_ATEN_CUDA) and at::cpu:: are the very functions aten registered, allocation
// and all; elsewhere the op's .out overload, which is never overridden.
template <int Slot>
struct Aten {
  static at::Tensor add(const at::Tensor& self, const at::Tensor& other, const c10::Scalar& alpha) {
#ifdef XK_ATEN_CUDA
    if constexpr (Slot == 0) return at::cuda::add(self, other, alpha);
#endif
    if constexpr (Slot == 1) return at::cpu::add(self, other, alpha);
    const bool cpu_scalar = self.dim() == 0 && self.is_cpu() && !is_number(other);
    at::Tensor out = at::empty({0}, self.options()
                                        .dtype(at::result_type(self, other))
                                        .device(cpu_scalar ? other.device() : self.device()));
    return at::add_out(out, self, other, alpha);
  }
  static void add_(at::Tensor& self, const at::Tensor& other, const c10::Scalar& alpha) {
#ifdef XK_ATEN_CUDA
    if constexpr (Slot == 0) {
      at::cuda::add_(self, other, alpha);
      return;
    }
#endif
    if constexpr (Slot == 1) {
      at::cpu::add_(self, other, alpha);
      return;
    }
    at::add_out(self, self, other, alpha);
  }
  template <bool Batched>
  static at::Tensor matmul(const at::Tensor& a, const at::Tensor& b) {
#ifdef XK_ATEN_CUDA
    if constexpr (Slot == 0) return Batched ? at::cuda::bmm(a, b) : at::cuda::mm(a, b);
#endif
    if constexpr (Slot == 1) return Batched ? at::cpu::bmm(a, b) : at::cpu::mm(a, b);
    at::Tensor out = Batched ? at::empty({a.size(0), a.size(1), b.size(2)}, a.options())
                             : at::empty({a.size(0), b.size(1)}, a.options());
    return Batched ? at::bmm_out(out, a, b) : at::mm_out(out, a, b);
  }
  static at::Tensor addmm(const at::Tensor& bias, const at::Tensor& a, const at::Tensor& b) {
#ifdef XK_ATEN_CUDA
    if constexpr (Slot == 0) return at::cuda::addmm(bias, a, b);
#endif
    if constexpr (Slot == 1) return at::cpu::addmm(bias, a, b);
    at::Tensor out = at::empty({a.size(0), b.size(1)}, a.options());
    return at::addmm_out(out, bias, a, b, 1, 1);
  }
};

// add (Inplace false) and add_ (true) from a remembered entry; an undefined tensor where the
// signature has none or its launch declined (the Python override decides).
template <int Slot, bool Inplace>
at::Tensor add_here(Override& ov, const at::Tensor& self, const at::Tensor& other, const c10::Scalar& alpha) {
  if (!may_run_here() || !other.defined() || is_number(self)) return {};
  const Entry* e = find<Slot>(ov, add_key(self, other, alpha));
  if (!e) return {};
  if (e->vendor) {  // aten's own kernel
    ++*e->count;
    if (!Inplace) return Aten<Slot>::add(self, other, alpha);
    Aten<Slot>::add_(const_cast<at::Tensor&>(self), other, alpha);
    return self;
  }
  const bool number = is_number(other);
  const at::Tensor* args[3] = {&self, number ? nullptr : &other, Inplace ? &self : nullptr};
  at::Tensor out = xk::run_route(*e->route, [&](int i) { return i >= 0 && i < 3 ? args[i] : nullptr; });
  if (out.defined()) ov.hits++;
  return out;
}

template <int Slot>
at::Tensor add_kernel(const at::Tensor& self, const at::Tensor& other, const c10::Scalar& alpha) {
  Override& view = current(kAdd, Slot);
  if (at::Tensor out = add_here<Slot, false>(view, self, other, alpha); out.defined()) return out;
  std::shared_ptr<Override> ov = t_view.over[kAdd][Slot];  // held: Python may change the view
  py::gil_scoped_acquire gil;
  InPython in;
  py::object r = ov->py_fn(as_py(self), as_py(other), py::arg("alpha") = scalar_to_py(alpha));
  return r.cast<at::Tensor>();
}

template <int Slot>
at::Tensor& add_inplace_kernel(at::Tensor& self, const at::Tensor& other, const c10::Scalar& alpha) {
  Override& view = current(kAddInplace, Slot);
  if (add_here<Slot, true>(view, self, other, alpha).defined()) return self;
  std::shared_ptr<Override> ov = t_view.over[kAddInplace][Slot];  // held: Python may change the view
  py::gil_scoped_acquire gil;
  InPython in;
  ov->py_fn(self, as_py(other), py::arg("alpha") = scalar_to_py(alpha));
  return self;
}

// A matmul override's entry with xkernels' kernel: its route launched with the aten op's
// operands (its parameters, in order), counted; undefined where the launch declined.
at::Tensor launch_entry(Override& ov, const Entry& e, std::initializer_list<const at::Tensor*> operands) {
  const at::Tensor* const* args = operands.begin();
  const int n = static_cast<int>(operands.size());
  at::Tensor out = xk::run_route(*e.route, [&](int i) { return i >= 0 && i < n ? args[i] : nullptr; });
  if (out.defined()) ov.hits++;
  return out;
}

// mm (Batched false) and bmm (true)
template <int Slot, bool Batched>
at::Tensor matmul_kernel(const at::Tensor& a, const at::Tensor& b) {
  constexpr int op = Batched ? kBmm : kMm;
  Override& view = current(op, Slot);
  const int64_t dims = Batched ? 3 : 2;
  if (may_run_here() && a.dim() == dims && b.dim() == dims) {
    if (const Entry* e = find<Slot>(view, key_of({&a, &b})); e && e->vendor) {
      ++*e->count;
      return Aten<Slot>::template matmul<Batched>(a, b);
    } else if (e && e->route) {
      if (at::Tensor out = launch_entry(view, *e, {&a, &b}); out.defined()) return out;
    }
  }
  std::shared_ptr<Override> ov = t_view.over[op][Slot];  // held: Python may change the view
  py::gil_scoped_acquire gil;
  InPython in;
  py::object r = ov->py_fn(a, b);
  return r.cast<at::Tensor>();
}

template <int Slot>
at::Tensor addmm_kernel(const at::Tensor& bias, const at::Tensor& a, const at::Tensor& b, const c10::Scalar& beta,
                        const c10::Scalar& alpha) {
  Override& view = current(kAddmm, Slot);
  if (may_run_here() && is_one(beta) && is_one(alpha) && bias.dim() == 1 && a.dim() == 2 && b.dim() == 2) {
    if (const Entry* e = find<Slot>(view, key_of({&bias, &a, &b})); e && e->vendor) {
      ++*e->count;
      return Aten<Slot>::addmm(bias, a, b);
    } else if (e && e->route) {
      if (at::Tensor out = launch_entry(view, *e, {&bias, &a, &b}); out.defined()) return out;
    }
  }
  std::shared_ptr<Override> ov = t_view.over[kAddmm][Slot];  // held: Python may change the view
  py::gil_scoped_acquire gil;
  InPython in;
  py::object r = ov->py_fn(bias, a, b, py::arg("beta") = scalar_to_py(beta), py::arg("alpha") = scalar_to_py(alpha));
  return r.cast<at::Tensor>();
}

int slot_of(const std::string& key) {
  if (key == "CUDA") return 0;
  if (key == "CPU") return 1;
  if (key == "PrivateUse1") return 2;
  TORCH_CHECK(false, "xkernels native override: unsupported dispatch key ", key);
}

c10::DispatchKey dispatch_key(int slot) {
  return slot == 0 ? c10::DispatchKey::CUDA : slot == 1 ? c10::DispatchKey::CPU : c10::DispatchKey::PrivateUse1;
}

template <int Slot>
void impl_op(torch::Library& lib, int op) {
  switch (op) {
    case kAdd: lib.impl("add.Tensor", TORCH_FN(add_kernel<Slot>)); break;
    case kAddInplace: lib.impl("add_.Tensor", TORCH_FN(add_inplace_kernel<Slot>)); break;
    case kMm: lib.impl("mm", TORCH_FN((matmul_kernel<Slot, false>))); break;
    case kBmm: lib.impl("bmm", TORCH_FN((matmul_kernel<Slot, true>))); break;
    default: lib.impl("addmm", TORCH_FN(addmm_kernel<Slot>)); break;
  }
}

struct QuietWarnings : c10::WarningHandler {
  void process(const c10::Warning&) override {}
};

void reinstall_override(const std::shared_ptr<Override>& ov);

// Registers the override of aten overload `name` on dispatch key `key`; the returned handle's
// `remove()` (or its destruction) restores aten's kernel.
std::shared_ptr<Override> override_op(const std::string& name, const std::string& key, py::object py_fn) {
  int op = -1;
  for (int i = 0; i < kOps; ++i)
    if (name == kOpNames[i]) op = i;
  TORCH_CHECK(op >= 0, "xkernels native override: no native override of ", name);
  const int slot = slot_of(key);
  auto ov = std::make_shared<Override>();
  ov->op = op;
  ov->slot = slot;
  ov->py_fn = std::move(py_fn);
  reinstall_override(ov);
  return ov;
}

// Registers `ov` (made by override_op, then removed) again, with the signatures it was handed
// before: an enable() after a disable() (each `with xkernels.enabled():` block) starts with them.
void reinstall_override(const std::shared_ptr<Override>& ov) {
  {
    std::lock_guard<std::mutex> g(g_over_lock);
    TORCH_CHECK(!g_over[ov->op][ov->slot] && !ov->lib, "xkernels native override: ", kOpNames[ov->op],
                " is registered already");
    g_over[ov->op][ov->slot] = ov;
    changed();
  }
  QuietWarnings quiet;  // "Overriding a previously registered kernel": the point here
  c10::WarningUtils::WarningHandlerGuard guard(&quiet);
  ov->lib = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", dispatch_key(ov->slot), __FILE__,
                                             __LINE__);
  if (ov->slot == 0) impl_op<0>(*ov->lib, ov->op);
  if (ov->slot == 1) impl_op<1>(*ov->lib, ov->op);
  if (ov->slot == 2) impl_op<2>(*ov->lib, ov->op);
}

void remove_override(Override& ov) {
  ov.lib.reset();  // aten's kernel is in effect again; the signatures stay for a reinstall
  std::lock_guard<std::mutex> g(g_over_lock);
  for (auto& row : g_over)
    for (auto& o : row)
      if (o.get() == &ov) o.reset();
  changed();
}

// -- enable()'s aten::linear and aten::matmul, on the Autograd key ------------------------------
// Kernels of aten::linear / aten::matmul on the Autograd key of CUDA / CPU (aten's own are
// CompositeImplicitAutograd: they decompose into addmm / mm / bmm, each routed by the overrides
// above). On plain tensors, outside any dispatch mode or functorch transform:
// - linear, a call with a gradient to record that LinearBackward covers (xk::one_node): recorded
//   as that one grad_fn; at::linear's decomposition runs below autograd (its addmm / mm still
//   reach the overrides above) and the backward makes PyTorch's own ATen calls;
// - either, a call with nothing to record (no tensor requiring grad while grad mode is on, no
//   forward-mode tangent): aten's decomposition below autograd, as an inference call runs. Its
//   addmm / mm / bmm reach the overrides above without the autograd and view-tracking layers of
//   the weight's transpose, the folded input's views and the product: the same kernels on the
//   same tensors, a host cost below torch's own call. (The one difference: a result that is a
//   view of the product, a 3-D linear's, is not tracked as a view of that temporary.)
// Anything else runs aten's composite kernel, exactly as the dispatcher would.
enum CompositeIndex { kLinear = 0, kMatmul, kComposites };
const char* const kCompositeNames[kComposites] = {"linear", "matmul"};

struct CompositeOverride {
  int op = kLinear;
  std::unique_ptr<torch::Library> lib;
  std::atomic<int64_t> hits{0};  // linear: calls recorded as one grad_fn
};

std::mutex g_composite_lock;
std::shared_ptr<CompositeOverride> g_composite[kComposites][2];  // AutogradCUDA, AutogradCPU

bool plain_tensor(const at::Tensor& t) {
  static const c10::DispatchKeySet other({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot,
                                          c10::DispatchKey::Functionalize, c10::DispatchKey::FuncTorchBatched,
                                          c10::DispatchKey::FuncTorchGradWrapper});
  return t.layout() == c10::kStrided && !t.is_nested() && !t.key_set().has_any(other);
}

bool plain_call(std::initializer_list<const at::Tensor*> ts) {
  if (t_in_python || c10::impl::TorchDispatchModeTLS::any_modes_set() ||
      c10::impl::tls_is_dispatch_key_included(c10::DispatchKey::FuncTorchDynamicLayerFrontMode))
    return false;
  for (const at::Tensor* t : ts)
    if (t && !plain_tensor(*t)) return false;
  return true;
}

// Nothing for autograd to do: no gradient recorded (grad mode off, or no tensor requires grad)
// and no forward-mode tangent to carry.
bool nothing_to_record(std::initializer_list<const at::Tensor*> ts) {
  const bool grad = at::GradMode::is_enabled();
  for (const at::Tensor* t : ts)
    if (t && ((grad && t->requires_grad()) || t->_fw_grad(0).defined())) return false;
  return true;
}

bool same_device_and_dtype(std::initializer_list<const at::Tensor*> ts) {
  const at::Tensor* first = *ts.begin();
  for (const at::Tensor* t : ts)
    if (t && (t->device() != first->device() || t->scalar_type() != first->scalar_type())) return false;
  return true;
}

// aten::linear's decomposition with nothing to record, below autograd. Where it is one addmm or
// mm (a 2-D input; with a 1-D bias also a contiguous 3-D input, flattened: at::native::linear's
// own cases) and that op's override is registered, the override runs it directly, skipping the
// decomposition's checks and one dispatcher round trip; anything else is at::native::linear.
template <int Slot>
at::Tensor linear_below_autograd(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& b,
                                 const at::Tensor* bp) {
  at::AutoDispatchBelowADInplaceOrView below;
  if (w.dim() == 2 && same_device_and_dtype({&x, &w, bp})) {
    if (bp && bp->dim() == 1 && registered(kAddmm, Slot)) {
      if (x.dim() == 2) return addmm_kernel<Slot>(*bp, x, w.t(), 1, 1);
      if (x.dim() == 3 && x.is_contiguous()) {
        at::Tensor y = addmm_kernel<Slot>(*bp, x.view({-1, x.size(2)}), w.t(), 1, 1);
        return y.view({x.size(0), x.size(1), y.size(1)});
      }
    } else if (!bp && x.dim() == 2 && registered(kMm, Slot)) {
      return matmul_kernel<Slot, false>(x, w.t());
    }
  }
  return at::native::linear(x, w, b);
}

template <int Slot>
at::Tensor linear_kernel(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& b) {
  const at::Tensor* bp = b.has_value() && b->defined() ? &*b : nullptr;
  // (a use_backend() block does not matter here: the addmm / mm inside decide the backend)
  if (!plain_call({&x, &w, bp})) return at::native::linear(x, w, b);
  if (nothing_to_record({&x, &w, bp})) return linear_below_autograd<Slot>(x, w, b, bp);
  if (!at::GradMode::is_enabled() || !torch::autograd::compute_requires_grad(x, w, bp ? *bp : at::Tensor()) ||
      !xk::one_node(x, w, bp))
    return at::native::linear(x, w, b);
  std::shared_ptr<CompositeOverride> ov;
  {
    std::lock_guard<std::mutex> g(g_composite_lock);
    ov = g_composite[kLinear][Slot];
  }
  if (ov) ov->hits++;
  return xk::linear_one_node(xk::Route::kNone, 0.0, x, w, bp);
}

// aten::matmul: with nothing to record, below autograd; 2-D @ 2-D (aten's mm: at::native::matmul's
// first case) goes to the mm override directly where one is registered.
template <int Slot>
at::Tensor matmul_composite_kernel(const at::Tensor& a, const at::Tensor& b) {
  if (plain_call({&a, &b}) && nothing_to_record({&a, &b})) {
    at::AutoDispatchBelowADInplaceOrView below;
    if (a.dim() == 2 && b.dim() == 2 && same_device_and_dtype({&a, &b}) && registered(kMm, Slot))
      return matmul_kernel<Slot, false>(a, b);
    return at::native::matmul(a, b);
  }
  return at::native::matmul(a, b);
}

std::shared_ptr<CompositeOverride> override_composite(const std::string& name, const std::string& key) {
  int op = -1;
  for (int i = 0; i < kComposites; ++i)
    if (name == kCompositeNames[i]) op = i;
  TORCH_CHECK(op >= 0, "xkernels native override: no Autograd-key kernel of ", name);
  const int slot = slot_of(key);
  TORCH_CHECK(slot < 2, "xkernels native override: ", name, "'s Autograd-key kernel is for CUDA and CPU, not ", key);
  auto ov = std::make_shared<CompositeOverride>();
  ov->op = op;
  {
    std::lock_guard<std::mutex> g(g_composite_lock);
    TORCH_CHECK(!g_composite[op][slot], "xkernels native override: ", name, " on ", key, " is registered already");
    g_composite[op][slot] = ov;
  }
  QuietWarnings quiet;  // "Overriding a previously registered kernel"
  c10::WarningUtils::WarningHandlerGuard guard(&quiet);
  const auto dk = slot == 0 ? c10::DispatchKey::AutogradCUDA : c10::DispatchKey::AutogradCPU;
  ov->lib = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", dk, __FILE__, __LINE__);
  if (op == kMatmul && slot == 0)
    ov->lib->impl("matmul", TORCH_FN(matmul_composite_kernel<0>));
  else if (op == kMatmul)
    ov->lib->impl("matmul", TORCH_FN(matmul_composite_kernel<1>));
  else if (slot == 0)
    ov->lib->impl("linear", TORCH_FN(linear_kernel<0>));
  else
    ov->lib->impl("linear", TORCH_FN(linear_kernel<1>));
  return ov;
}

void remove_composite(CompositeOverride& ov) {
  ov.lib.reset();  // aten's composite kernel is in effect again
  std::lock_guard<std::mutex> g(g_composite_lock);
  for (auto& row : g_composite)
    for (auto& o : row)
      if (o.get() == &ov) o.reset();
}

void store(Override& ov, const Key& k, std::shared_ptr<Entry> e) {
  if (!k.ok) return;
  const uint64_t h = k.hash();
  std::lock_guard<std::mutex> g(ov.lock);
  if (ov.size >= ov.limit) ov.clear();
  auto& bucket = ov.table[h];
  for (auto& [key, old] : bucket) {
    if (k.same(key)) {
      old = std::move(e);
      changed();
      return;
    }
  }
  bucket.emplace_back(k.vec(), std::move(e));
  ++ov.size;
  changed();
}

// mm / bmm (a, b), addmm (bias, a, b): these operands' signature runs xkernels' kernel from
// `spec` (ops/native_front_door.py's NativeSpec, its parameters the aten op's arguments).
void remember_route(Override& ov, const std::vector<at::Tensor>& ts, const py::tuple& spec) {
  TORCH_CHECK(ov.op >= kMm && ts.size() == (ov.op == kAddmm ? 3u : 2u),
              "xkernels native override: remember_route() takes mm/bmm (a, b) or addmm (bias, a, b)");
  auto e = std::make_shared<Entry>();
  e->route = xk::make_route(spec);
  TORCH_CHECK(e->route->kind == xk::Route::kLaunch && e->route->out == xk::kAbsent,
              "xkernels native override: a matmul override's route launches a kernel into a new result");
  store(ov, ov.op == kAddmm ? key_of({&ts[0], &ts[1], &ts[2]}) : key_of({&ts[0], &ts[1]}), std::move(e));
}

// The key of a Python number as add_key makes it from the wrapped number the kernel receives.
c10::Scalar scalar_of(const py::handle& v, const char* what) {
  if (PyBool_Check(v.ptr())) return v.cast<bool>();
  if (PyLong_Check(v.ptr())) return v.cast<int64_t>();
  if (PyFloat_Check(v.ptr())) return v.cast<double>();
  if (PyComplex_Check(v.ptr())) return c10::complex<double>(PyComplex_RealAsDouble(v.ptr()), PyComplex_ImagAsDouble(v.ptr()));
  TORCH_CHECK(false, "xkernels native override: remember_add() takes a number as ", what);
}

// add / add_ (self, other, alpha), other a tensor or a Python number: this signature runs
// `spec` (the add op's route: parameters x, y, out), or aten's own kernel where `spec` is None
// (its calls counted under `why`, the Python override's reason).
void remember_add(Override& ov, const at::Tensor& self, const py::object& other, const py::object& alpha,
                  const py::object& spec, const std::string& why) {
  TORCH_CHECK(ov.op == kAdd || ov.op == kAddInplace, "xkernels native override: remember_add() is for add");
  Key k;
  push_tensor(k, self);
  if (THPVariable_Check(other.ptr()))
    push_tensor(k, other.cast<at::Tensor>());
  else
    push_scalar(k, scalar_of(other, "'other'"));
  push_scalar(k, scalar_of(alpha, "'alpha'"));
  auto e = std::make_shared<Entry>();
  if (spec.is_none()) {
    e->vendor = true;
    std::lock_guard<std::mutex> g(ov.lock);
    e->count = ov.counter(why);
  } else {
    e->route = xk::make_route(spec.cast<py::tuple>());
    TORCH_CHECK(e->route->kind == xk::Route::kLaunch &&
                    e->route->out == (ov.op == kAddInplace ? 2 : xk::kAbsent),
                "xkernels native override: an add route launches a kernel into a new result (add) or self (add_)");
  }
  store(ov, k, std::move(e));
}

// mm / bmm (a, b), addmm (bias, a, b): these operands' signature runs aten's .out kernel (its
// calls counted under `why`, the Python override's reason).
void remember_vendor(Override& ov, const std::vector<at::Tensor>& ts, const std::string& why) {
  TORCH_CHECK(ov.op >= kMm && ts.size() == (ov.op == kAddmm ? 3u : 2u),
              "xkernels native override: remember_vendor() takes mm/bmm (a, b) or addmm (bias, a, b)");
  auto e = std::make_shared<Entry>();
  e->vendor = true;
  {
    std::lock_guard<std::mutex> g(ov.lock);
    e->count = ov.counter(why);
  }
  store(ov, ov.op == kAddmm ? key_of({&ts[0], &ts[1], &ts[2]}) : key_of({&ts[0], &ts[1]}), std::move(e));
}

}  // namespace xk::overrides
