// What a route of an xkernels op runs for a repeated call, in C++ (Route), and the op front door's
// table of them (RouteTable, a Python callable): a repeated call is keyed, looked up and run
// without entering Python beyond the op's __call__. Included by native.cpp only; see
// ops/native_front_door.py for how routes are handed over and docs/front-door.md for the design.
//
// A Route is one of
//   launch: allocate the result (or take an out= tensor, checking its overlap with the inputs as
//           the op's check does) and launch the kernel with the call's tensors;
//   linear: the device's BLAS as F.linear calls it (addmm / mm of the folded input);
//   matmul: the device's BLAS as torch.matmul calls it for 2-D or equal-batch 3-D operands;
//   torch_linear: a training call (a tensor requires grad) that xkernels gives PyTorch's own ops:
//           at::linear and the activation, with autograd. The only kind that runs a call with a
//           tensor requiring grad; never while a CUDA graph is captured (the Python path decides
//           then). Where the call allows (`one_node`) they are recorded as one grad_fn,
//           LinearBackward, computing PyTorch's gradients with PyTorch's own ATen calls; else
//           autograd records at::linear's and the activation's nodes, as for F.linear.
// Routes name the call's tensors by parameter index (the op's params order); kResult is the result.
#pragma once

#include <ATen/ATen.h>
#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/SavedTensorHooks.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <ATen/autocast_mode.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/autograd/saved_variable.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "native_launch.h"

namespace torch::autograd {
void deleteNode(Node* function);  // declared by torch versions whose nodes are shared_ptrs
}

namespace xk {

using NodePtr = decltype(torch::autograd::Edge::function);

// A new grad_fn of type T, in the pointer type this torch's edges hold.
template <class T, class P = NodePtr>
P make_node() {
  if constexpr (std::is_same_v<P, std::shared_ptr<torch::autograd::Node>>) {
    return P(new T(), torch::autograd::deleteNode);
  } else {
    return c10::make_intrusive<T>();
  }
}

constexpr int kResult = -1;
constexpr int kAbsent = -2;

inline std::atomic<bool>& poison_flag() {  // tests: results are NaN-filled before each launch
  static std::atomic<bool> on{false};
  return on;
}

struct Route {
  enum Kind { kLaunch, kLinear, kMatmul, kTorchLinear } kind = kLaunch;
  Launch launch;
  std::vector<int> tensors;              // launch: per kernel tensor, a parameter or kResult; linear: x, weight,
                                         // bias (kAbsent); matmul: a, b
  std::vector<int64_t> size, stride;     // the result's
  at::ScalarType dtype = at::kFloat;
  int out = kAbsent;                     // the out= parameter that is the result; kAbsent: allocate
  std::vector<std::tuple<int, int64_t, bool>> overlap;  // (input parameter, extent in bytes, same layout as out)
  int64_t out_extent = 0;
  // linear: the activation after the GEMM (applied in place, as reference_linear's PyTorch op
  // computes it), or in the BLAS epilogue (torch._addmm_activation's: relu, tanh GELU);
  // kQuickGelu: y * sigmoid(1.702 y), CLIP's QuickGELUActivation; kRelu2: square(relu(y)), the
  // squared ReLU; both as xkernels' activate()
  enum Act { kNone, kRelu, kGelu, kGeluTanh, kSilu, kLeakyRelu, kQuickGelu, kRelu2 } act = kNone;
  double slope = 0.01;
  bool epilogue = false;

  ~Route() { drop_python(launch); }
};

// A linear route's activation, out of place (as xkernels' activate()); slope: leaky_relu's.
inline at::Tensor activate(Route::Act act, double slope, const at::Tensor& y) {
  switch (act) {
    case Route::kRelu: return at::relu(y);
    case Route::kGelu: return at::gelu(y, "none");
    case Route::kGeluTanh: return at::gelu(y, "tanh");
    case Route::kSilu: return at::silu(y);
    case Route::kLeakyRelu: return at::leaky_relu(y, slope);
    case Route::kQuickGelu: return y * at::sigmoid(y * 1.702);
    case Route::kRelu2: return at::square(at::relu(y));
    default: return y;
  }
}

// torch_linear's grad_fn: F.linear + the activation as one node, where PyTorch records four to
// six (the input's and output's views, AddmmBackward0 / MmBackward0, TBackward0, the
// activation's); each costs the autograd engine's thread host time in a host-bound training step.
// The gradients are PyTorch's, from the same ATen calls on the same layouts (`one_node` admits
// only calls where mm_mat1_backward / mm_mat2_backward take their row-major / column-major
// branches below): the activation's backward of the pre-activation (relu's threshold_backward of
// the pre-activation zeroes the same entries as of its result), dx = dy.mm(w) reshaped to the
// input, dw = dy.t().mm(x) (TBackward0 of mm_mat2_backward's transposed product), the bias's
// sum_to (a sum over the rows, keepdim, viewed). Saved as SavedVariables of inputs (unpacked
// without the node): version checks as PyTorch's nodes. A create_graph backward
// records these ATen calls; with an activation it recomputes the pre-activation from the saved
// operands first, so that second-order gradients flow through it as through PyTorch's graph.
struct LinearBackward : public torch::autograd::Node {
  torch::autograd::SavedVariable x, weight, bias;  // x: for dw or an activation; weight: for dx or an
                                                   // activation; bias: with an activation
  torch::autograd::SavedVariable pre;              // the pre-activation (with an activation)
  std::vector<int64_t> x_size;
  int64_t n = 0;
  Route::Act act = Route::kNone;
  double slope = 0.01;
  bool has_bias = false;

  std::string name() const override { return "xkernels::LinearBackward"; }

  void release_variables() override {
    x.reset_data();
    weight.reset_data();
    bias.reset_data();
    pre.reset_data();
  }

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    torch::autograd::variable_list out(3);
    at::Tensor dy = grads[0];
    if (!dy.defined()) return out;
    const bool need_x = should_compute_output(0), need_w = should_compute_output(1),
               need_b = has_bias && should_compute_output(2);
    if (act != Route::kNone) {
      at::Tensor h;
      if (at::GradMode::is_enabled()) {  // create_graph: the pre-activation with its history
        const at::Tensor b = has_bias ? bias.unpack() : at::Tensor();
        h = at::linear(x.unpack(), weight.unpack(), b.defined() ? c10::optional<at::Tensor>(b) : c10::nullopt);
      } else {
        h = pre.unpack();
      }
      switch (act) {
        case Route::kRelu: dy = at::threshold_backward(dy, h, 0); break;
        case Route::kGelu: dy = at::gelu_backward(dy, h, "none"); break;
        case Route::kGeluTanh: dy = at::gelu_backward(dy, h, "tanh"); break;
        case Route::kSilu: dy = at::silu_backward(dy, h); break;
        case Route::kLeakyRelu: dy = at::leaky_relu_backward(dy, h, slope, false); break;
        case Route::kQuickGelu: {  // autograd's steps through h * sigmoid(1.702 h), as activation_grad's
          const at::Tensor s = at::sigmoid(h * 1.702);
          dy = dy * s + at::sigmoid_backward(dy * h, s) * 1.702;
          break;
        }
        case Route::kRelu2: {  // autograd's steps through square(relu(h)): pow's backward, then relu's
          const at::Tensor r = at::relu(h);
          dy = at::threshold_backward(dy * (r * 2.0), r, 0);
          break;
        }
        default: break;
      }
    }
    const at::Tensor dy2 = dy.dim() == 2 ? dy : dy.reshape({-1, n});
    if (need_x) {
      const at::Tensor dx2 = dy2.mm(weight.unpack());
      out[0] = x_size.size() == 2 ? dx2 : dx2.reshape(x_size);
    }
    if (need_w) {
      const at::Tensor xs = x.unpack();
      out[1] = dy2.t().mm(xs.dim() == 2 ? xs : xs.reshape({-1, xs.size(-1)}));
    }
    if (need_b) out[2] = dy2.sum({0}, /*keepdim=*/true).view({n});
    return out;
  }
};

// Whether saved-tensor hooks are in effect (torch.autograd.graph.saved_tensors_hooks: activation
// checkpointing, offloading). A native grad_fn then steps aside: the call records what its Python
// path records, so that the tensors a checkpointed forward saves are the ones its recomputation
// saves whichever path each took (torch.utils.checkpoint compares them), and each is packed.
inline bool saved_tensor_hooks() {  // (the stack itself: get_hooks() copies its top's Python objects)
  return !at::SavedTensorDefaultHooks::get_tls_state().stack.empty();
}

// Whether a torch_linear call is recorded as one LinearBackward: a contiguous input of 2+
// dimensions, a contiguous 2-D weight, a contiguous 1-D bias or none, one dtype, more than one row,
// input feature and output feature (so that PyTorch's mm backwards take the branches
// LinearBackward computes), no autocast (it casts the operands, which autograd records), no
// forward-mode gradient, no saved-tensor hooks. Anything else records at::linear's own nodes.
inline bool one_node(const at::Tensor& x, const at::Tensor& w, const at::Tensor* b) {
  if (x.dim() < 2 || w.dim() != 2 || !x.is_contiguous() || !w.is_contiguous() || x.scalar_type() != w.scalar_type())
    return false;
  const int64_t k = x.size(-1);
  if (k < 2 || w.size(0) < 2 || w.size(1) != k || x.numel() / k < 2) return false;
  if (x._fw_grad(0).defined() || w._fw_grad(0).defined()) return false;
  if (b && (b->dim() != 1 || !b->is_contiguous() || b->scalar_type() != x.scalar_type() || b->_fw_grad(0).defined()))
    return false;
  return !at::autocast::is_autocast_enabled(x.device().type()) && !saved_tensor_hooks();
}

// F.linear + the activation `act` (slope: leaky_relu's) recorded as one LinearBackward (callers
// checked `one_node`).
inline at::Tensor linear_one_node(Route::Act act_kind, double slope, const at::Tensor& x, const at::Tensor& w,
                                  const at::Tensor* b) {
  at::Tensor pre, y;
  {
    // at::linear below autograd: its kernels and its branches (addmm of the folded input with a
    // bias, else matmul's mm), no node recorded and no view tracked (the result is the node's)
    at::AutoDispatchBelowADInplaceOrView below;
    pre = at::linear(x, w, b ? c10::optional<at::Tensor>(*b) : c10::nullopt);
    y = activate(act_kind, slope, pre);
  }
  const at::Tensor none;
  const at::Tensor& bias = b ? *b : none;
  if (!torch::autograd::compute_requires_grad(x, w, bias)) return y;
  auto node = make_node<LinearBackward>();
  auto* raw = static_cast<LinearBackward*>(node.get());
  raw->set_next_edges(torch::autograd::collect_next_edges(x, w, bias));
  const bool act = act_kind != Route::kNone;
  raw->act = act_kind;
  raw->slope = slope;
  raw->n = w.size(0);
  raw->has_bias = b != nullptr;
  raw->x_size = x.sizes().vec();
  if (act || raw->should_compute_output(1)) raw->x = torch::autograd::SavedVariable(x, false);
  if (act || raw->should_compute_output(0)) raw->weight = torch::autograd::SavedVariable(w, false);
  if (act) {
    if (b) raw->bias = torch::autograd::SavedVariable(*b, false);
    raw->pre = torch::autograd::SavedVariable(pre, false);
  }
  torch::autograd::set_history(y, node);
  return y;
}

// Runs `r` with the call's tensors (`get(i)`: parameter i's tensor, nullptr where it is none);
// an undefined tensor where it declined (nothing was written: a tensor on another CUDA device than
// the current one, a misaligned pointer, out= partly overlapping an input, a launch that declined).
template <class Get>
at::Tensor run_route(const Route& r, Get&& get) {
  const bool poison = poison_flag().load(std::memory_order_relaxed);
  if (r.kind == Route::kLaunch) {
    // the launch runs on the current device's context: a tensor of another CUDA device declines
    const at::Tensor* first = get(r.out != kAbsent ? r.out : r.tensors[0] == kResult ? r.tensors[1] : r.tensors[0]);
    if (!first || (first->is_cuda() && r.launch.function &&
                   c10::impl::getDeviceGuardImpl(c10::kCUDA)->getDevice().index() != first->device().index()))
      return {};
    at::Tensor result;
    if (r.out != kAbsent) {
      const at::Tensor* o = first;
      result = *o;
      const auto po = reinterpret_cast<uintptr_t>(result.data_ptr());
      for (const auto& [param, extent, same] : r.overlap) {
        const at::Tensor* t = get(param);
        if (!t) return {};
        const auto pt = reinterpret_cast<uintptr_t>(t->data_ptr());
        if (po < pt + extent && pt < po + static_cast<uintptr_t>(r.out_extent) && !(same && po == pt)) return {};
      }
    } else {
      result = at::empty_strided(r.size, r.stride, first->options().dtype(r.dtype));
      if (poison && at::isFloatingType(r.dtype)) result.fill_(NAN);
    }
    std::vector<at::Tensor> ts;
    ts.reserve(r.tensors.size());
    for (int i : r.tensors) {
      if (i == kResult) {
        ts.push_back(result);
        continue;
      }
      const at::Tensor* t = get(i);
      if (!t) return {};
      ts.push_back(*t);
    }
    if (!r.launch(ts)) return {};
    return result;
  }
  const at::Tensor* a = get(r.tensors[0]);
  const at::Tensor* b = get(r.tensors[1]);
  if (!a || !b) return {};
  if (r.kind == Route::kTorchLinear) {  // with autograd, as F.linear and xkernels' activate()
    const at::Tensor* bias = r.tensors[2] == kAbsent ? nullptr : get(r.tensors[2]);
    if ((r.tensors[2] != kAbsent && !bias) || (a->is_cuda() && capturing(a->device()))) return {};
    if (one_node(*a, *b, bias)) return linear_one_node(r.act, r.slope, *a, *b, bias);
    at::Tensor y = at::linear(*a, *b, bias ? c10::optional<at::Tensor>(*bias) : c10::nullopt);
    return activate(r.act, r.slope, y);
  }
  at::AutoDispatchBelowADInplaceOrView below;  // no gradient is recorded here (callers made sure)
  // The BLAS allocates its result (contiguous, as the route's); the tests' poisoning needs the
  // result first, so it is then allocated here and the .out overload fills it.
  const bool poisoned = poison && at::isFloatingType(a->scalar_type());
  at::Tensor result;
  if (poisoned) result = at::empty(r.size, a->options()).fill_(NAN);
  if (r.kind == Route::kMatmul) {
    if (!poisoned) return a->dim() == 2 ? at::mm(*a, *b) : at::bmm(*a, *b);
    if (a->dim() == 2)
      at::mm_out(result, *a, *b);
    else
      at::bmm_out(result, *a, *b);
    return result;
  }
  const at::Tensor* bias = r.tensors[2] == kAbsent ? nullptr : get(r.tensors[2]);
  const int64_t n = b->size(0), k = b->size(1), m = a->numel() / k;
  at::Tensor x2 = a->dim() == 2 ? *a : a->view({m, k});
  if (r.epilogue && !bias) return {};
  if (!poisoned) {
    at::Tensor out2 = r.epilogue ? at::_addmm_activation(*bias, x2, b->t(), 1, 1, r.act == Route::kGeluTanh)
                      : bias     ? at::addmm(*bias, x2, b->t())
                                 : at::mm(x2, b->t());
    result = a->dim() == 2 ? out2 : out2.view(r.size);
  } else {
    at::Tensor out2 = result.dim() == 2 ? result : result.view({m, n});
    if (r.epilogue)
      at::_addmm_activation_out(out2, *bias, x2, b->t(), 1, 1, r.act == Route::kGeluTanh);
    else if (bias)
      at::addmm_out(out2, *bias, x2, b->t());
    else
      at::mm_out(out2, x2, b->t());
  }
  if (r.epilogue) return result;
  switch (r.act) {
    case Route::kRelu: at::relu_(result); break;
    case Route::kGelu: at::gelu_(result, "none"); break;
    case Route::kGeluTanh: at::gelu_(result, "tanh"); break;
    case Route::kSilu: at::silu_(result); break;
    case Route::kLeakyRelu: at::leaky_relu_(result, r.slope); break;
    case Route::kQuickGelu: result.mul_(at::sigmoid(result * 1.702)); break;
    case Route::kRelu2: at::relu_(result).square_(); break;
    default: break;
  }
  return result;
}

// A route from its Python description (ops/native_front_door.py's NativeSpec):
// (kind, launch, tensors, size, stride, dtype, out, overlap, out_extent, activation, slope, epilogue)
inline std::shared_ptr<const Route> make_route(const py::tuple& spec) {
  TORCH_CHECK(spec.size() == 12, "xkernels native: a route spec has 12 fields");
  auto r = std::make_shared<Route>();
  const std::string kind = spec[0].cast<std::string>();
  r->kind = kind == "launch" ? Route::kLaunch : kind == "linear" ? Route::kLinear
          : kind == "torch_linear" ? Route::kTorchLinear : Route::kMatmul;
  TORCH_CHECK(kind == "launch" || kind == "linear" || kind == "matmul" || kind == "torch_linear",
              "xkernels native: unknown route kind ", kind);
  if (r->kind == Route::kLaunch) r->launch = make_launch(spec[1]);
  r->tensors = spec[2].cast<std::vector<int>>();
  r->size = spec[3].cast<std::vector<int64_t>>();
  r->stride = spec[4].cast<std::vector<int64_t>>();
  if (!spec[5].is_none()) r->dtype = spec[5].cast<at::ScalarType>();
  r->out = spec[6].cast<int>();
  for (auto item : spec[7].cast<py::tuple>()) {
    auto f = item.cast<py::tuple>();
    r->overlap.emplace_back(f[0].cast<int>(), f[1].cast<int64_t>(), f[2].cast<bool>());
  }
  r->out_extent = spec[8].cast<int64_t>();
  if (!spec[9].is_none()) {
    const std::string act = spec[9].cast<std::string>();
    r->act = act == "relu" ? Route::kRelu : act == "gelu" ? Route::kGelu : act == "gelu_tanh" ? Route::kGeluTanh
           : act == "silu" ? Route::kSilu : act == "leaky_relu" ? Route::kLeakyRelu
           : act == "quick_gelu" ? Route::kQuickGelu : act == "relu2" ? Route::kRelu2 : Route::kNone;
    TORCH_CHECK(r->act != Route::kNone, "xkernels native: unknown activation ", act);
  }
  r->slope = spec[10].cast<double>();
  r->epilogue = spec[11].cast<bool>();
  TORCH_CHECK(!r->epilogue || (r->kind == Route::kLinear && (r->act == Route::kRelu || r->act == Route::kGeluTanh)),
              "xkernels native: the BLAS epilogue applies relu or the tanh GELU of a linear route");
  const size_t need = r->kind == Route::kLaunch ? 1 : r->kind == Route::kMatmul ? 2 : 3;
  TORCH_CHECK(r->tensors.size() >= need && (r->kind != Route::kLaunch || r->out != kAbsent ||
                                            r->tensors.size() >= 2 || r->tensors[0] != kResult),
              "xkernels native: a route spec names too few tensors");
  return r;
}

// -- the front door's key -----------------------------------------------------------------------
// Everything of a call that its Python signature key holds, and more: the call's form (how many
// positional arguments, which keywords in which order), the use_backend override in effect, and
// per argument its kind with a tensor's dtype, device, layout, sizes and strides, a number's or
// string's exact value. A call that cannot be keyed (any other argument type, a tensor subclass,
// a torch function or dispatch mode) is not run here.
constexpr int kMaxKey = 192;

struct Key {
  int64_t v[kMaxKey];
  int n = 0;
  bool ok = true;
  bool grad = false;  // a tensor requires grad while grad mode is on
  void push(int64_t x) {
    if (n < kMaxKey)
      v[n++] = x;
    else
      ok = false;
  }
  void push_str(PyObject* s) {
    Py_ssize_t len = 0;
    const char* c = PyUnicode_AsUTF8AndSize(s, &len);
    if (!c) {
      PyErr_Clear();
      ok = false;
      return;
    }
    push(len);
    for (Py_ssize_t i = 0; i < len; i += 8) {
      int64_t w = 0;
      std::memcpy(&w, c + i, std::min<Py_ssize_t>(8, len - i));
      push(w);
    }
  }
  bool same(const std::vector<int64_t>& stored) const {
    return stored.size() == static_cast<size_t>(n) && std::memcmp(stored.data(), v, n * sizeof(int64_t)) == 0;
  }
  std::vector<int64_t> vec() const { return std::vector<int64_t>(v, v + n); }
  uint64_t hash() const {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ static_cast<uint64_t>(n);
    for (int i = 0; i < n; ++i) {
      h ^= static_cast<uint64_t>(v[i]) + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    }
    return h;
  }
};

// A tensor's part of a key: dtype, device, dimensions, sizes, strides (after the caller's tag).
inline void push_tensor(Key& k, const at::Tensor& t) {
  k.push(static_cast<int64_t>(t.scalar_type()));
  k.push(static_cast<int64_t>(t.device().type()));
  k.push(t.device().index());
  k.push(t.dim());
  for (auto s : t.sizes()) k.push(s);
  for (auto s : t.strides()) k.push(s);
}

enum class Keyed { kOk, kNo };

// How a tensor that requires grad is keyed: grad mode off (kNone: as any tensor); on, in a table
// without torch_linear routes (kDecline: the call is not keyed, at the first such tensor); on, in
// a table with some (kMark: keyed as such, setting k.grad; only a torch_linear route is put under
// such a key).
enum class GradKey { kNone, kDecline, kMark };

// Appends one argument.
inline Keyed key_arg(Key& k, PyObject* o, GradKey grad) {
  if (o == Py_None) {
    k.push(1);
    return Keyed::kOk;
  }
  if (THPVariable_CheckExact(o)) {
    const at::Tensor& t = THPVariable_Unpack(o);
    if (t.layout() != c10::kStrided) return Keyed::kNo;
    const bool records = grad != GradKey::kNone && t.requires_grad();
    if (records && grad == GradKey::kDecline) return Keyed::kNo;
    k.grad = k.grad || records;
    k.push(records ? 8 : 2);
    push_tensor(k, t);
    return Keyed::kOk;
  }
  if (PyBool_Check(o)) {
    k.push(3);
    k.push(o == Py_True);
    return Keyed::kOk;
  }
  if (PyLong_CheckExact(o)) {
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) {
      PyErr_Clear();
      return Keyed::kNo;
    }
    k.push(4);
    k.push(v);
    return Keyed::kOk;
  }
  if (PyFloat_CheckExact(o)) {
    double d = PyFloat_AS_DOUBLE(o);
    int64_t bits = 0;
    std::memcpy(&bits, &d, 8);
    k.push(5);
    k.push(bits);
    return Keyed::kOk;
  }
  if (PyUnicode_CheckExact(o)) {
    k.push(6);
    k.push_str(o);
    return k.ok ? Keyed::kOk : Keyed::kNo;
  }
  return Keyed::kNo;
}

// The context variables the Python front door reads: the use_backend override (part of the key)
// and a forced tuning config (no route is used while one is).
struct ContextVars {
  PyObject* override_var = nullptr;
  PyObject* forced_var = nullptr;
};

inline ContextVars& context_vars() {
  static ContextVars c;
  return c;
}

// The key of a call (args[0:nargs], then kwnames' values); kOk with `k` filled, else why not.
inline Keyed call_key(Key& k, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames, GradKey grad) {
  if (at::impl::torch_function_mode_enabled() || c10::impl::TorchDispatchModeTLS::any_modes_set())
    return Keyed::kNo;
  const ContextVars& cv = context_vars();
  if (!cv.override_var || !cv.forced_var) return Keyed::kNo;
  PyObject* forced = nullptr;
  if (PyContextVar_Get(cv.forced_var, Py_None, &forced) < 0) {
    PyErr_Clear();
    return Keyed::kNo;
  }
  const bool is_forced = forced != Py_None;
  Py_DECREF(forced);
  if (is_forced) return Keyed::kNo;
  PyObject* over = nullptr;
  if (PyContextVar_Get(cv.override_var, Py_None, &over) < 0) {
    PyErr_Clear();
    return Keyed::kNo;
  }
  if (over == Py_None) {
    k.push(0);
  } else if (PyUnicode_Check(over)) {
    k.push(7);
    k.push_str(over);
  } else {
    k.ok = false;
  }
  Py_DECREF(over);
  const Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
  k.push(nargs);
  k.push(nkw);
  for (Py_ssize_t i = 0; i < nargs + nkw; ++i) {
    if (i >= nargs) k.push_str(PyTuple_GET_ITEM(kwnames, i - nargs));
    Keyed r = key_arg(k, args[i], grad);
    if (r != Keyed::kOk) return r;
  }
  return k.ok ? Keyed::kOk : Keyed::kNo;
}

// -- the table ----------------------------------------------------------------------------------
struct Slot {
  std::vector<int64_t> key;
  std::shared_ptr<const Route> route;
};

struct RouteTableObject {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  std::vector<PyObject*>* params;  // the op's parameter names, in order (owned references)
  std::unordered_map<uint64_t, std::vector<Slot>>* slots;
  size_t size, limit;
  size_t grad_routes;  // torch_linear routes held: only then is a call with a tensor requiring grad keyed
  int64_t hits;
  bool autocast_declines;  // the op casts its operands under autocast (Op.autocast_params): see autocast_would_cast
};

// Whether autocast would cast one of a call's tensors (`n` objects): a floating one, not float64,
// on a device type autocast is on for (CUDA, CPU, an out-of-tree device such as Ascend's), not
// already in that type's autocast dtype. The Python front door casts it first (ops/autocast.py);
// a call whose operands are already cast keeps its repeats here.
inline bool autocast_would_cast(PyObject* const* objs, Py_ssize_t n) {
  static const c10::DeviceType kinds[] = {c10::DeviceType::CUDA, c10::DeviceType::CPU, c10::DeviceType::PrivateUse1};
  bool any = false;
  for (c10::DeviceType d : kinds) any = any || at::autocast::is_autocast_enabled(d);
  if (!any) return false;
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (!THPVariable_Check(objs[i])) continue;
    const at::Tensor& t = THPVariable_Unpack(objs[i]);
    if (!t.defined() || !t.is_floating_point() || t.scalar_type() == at::kDouble) continue;
    const c10::DeviceType d = t.device().type();
    if ((d == c10::DeviceType::CUDA || d == c10::DeviceType::CPU || d == c10::DeviceType::PrivateUse1) &&
        at::autocast::is_autocast_enabled(d) && t.scalar_type() != at::autocast::get_autocast_dtype(d))
      return true;
  }
  return false;
}

// A strong reference: a Python launch (the interpreter) runs Python, during which another thread
// may put into or clear the table.
inline std::shared_ptr<const Route> find(RouteTableObject* t, const Key& k) {
  auto it = t->slots->find(k.hash());
  if (it == t->slots->end()) return nullptr;
  for (const Slot& s : it->second) {
    if (k.same(s.key)) return s.route;
  }
  return nullptr;
}

// Parameter i's object in a call (args, then keywords by name), or nullptr (not given: its default).
inline PyObject* param_of(RouteTableObject* t, int i, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  if (i < nargs) return args[i];
  if (!kwnames || i >= static_cast<int>(t->params->size())) return nullptr;
  PyObject* name = (*t->params)[i];
  const Py_ssize_t nkw = PyTuple_GET_SIZE(kwnames);
  for (Py_ssize_t j = 0; j < nkw; ++j) {
    PyObject* kw = PyTuple_GET_ITEM(kwnames, j);
    if (kw == name || PyUnicode_Compare(kw, name) == 0) return args[nargs + j];
  }
  return nullptr;
}

inline PyObject* route_table_call(PyObject* self, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  HANDLE_TH_ERRORS
  auto* t = reinterpret_cast<RouteTableObject*>(self);
  if (t->size == 0) Py_RETURN_NONE;
  const Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  if (t->autocast_declines && autocast_would_cast(args, nargs + (kwnames ? PyTuple_GET_SIZE(kwnames) : 0)))
    Py_RETURN_NONE;
  Key k;
  const GradKey grad = !at::GradMode::is_enabled() ? GradKey::kNone
                       : t->grad_routes ? GradKey::kMark : GradKey::kDecline;
  if (call_key(k, args, nargs, kwnames, grad) != Keyed::kOk) {
    if (PyErr_Occurred()) return nullptr;
    Py_RETURN_NONE;
  }
  const std::shared_ptr<const Route> r = find(t, k);
  if (!r || (r->kind == Route::kLaunch && r->launch.function && r->launch.hooked()) ||
      (k.grad != (r->kind == Route::kTorchLinear)))
    Py_RETURN_NONE;
  auto get = [&](int i) -> const at::Tensor* {
    PyObject* o = param_of(t, i, args, nargs, kwnames);
    return o && THPVariable_CheckExact(o) ? &THPVariable_Unpack(o) : nullptr;
  };
  at::Tensor result = run_route(*r, get);
  if (!result.defined()) Py_RETURN_NONE;
  ++t->hits;
  return THPVariable_Wrap(std::move(result));
  END_HANDLE_TH_ERRORS
}

// table.put(args, kwargs, spec) -> bool: the route of the call (args, **kwargs) in the current
// context; False where such a call cannot be keyed.
inline PyObject* route_table_put(PyObject* self, PyObject* a) {
  HANDLE_TH_ERRORS
  auto* t = reinterpret_cast<RouteTableObject*>(self);
  PyObject *args, *kwargs, *spec;
  if (!PyArg_ParseTuple(a, "O!O!O!", &PyTuple_Type, &args, &PyDict_Type, &kwargs, &PyTuple_Type, &spec))
    return nullptr;
  const Py_ssize_t nargs = PyTuple_GET_SIZE(args), nkw = PyDict_GET_SIZE(kwargs);
  std::vector<PyObject*> flat(nargs + nkw);
  for (Py_ssize_t i = 0; i < nargs; ++i) flat[i] = PyTuple_GET_ITEM(args, i);
  py::tuple names(nkw);
  Py_ssize_t pos = 0, j = 0;
  PyObject *kw, *v;
  while (PyDict_Next(kwargs, &pos, &kw, &v)) {
    names[j] = py::reinterpret_borrow<py::object>(kw);
    flat[nargs + j++] = v;
  }
  auto route = make_route(py::reinterpret_borrow<py::tuple>(spec));
  const bool training = route->kind == Route::kTorchLinear;  // keyed as a call autograd records
  Key k;
  if (call_key(k, flat.data(), nargs, nkw ? names.ptr() : nullptr, training ? GradKey::kMark : GradKey::kNone) !=
          Keyed::kOk ||
      k.grad != training) {
    if (PyErr_Occurred()) return nullptr;
    Py_RETURN_FALSE;
  }
  if (t->size >= t->limit) {
    t->slots->clear();
    t->size = t->grad_routes = 0;
  }
  auto& bucket = (*t->slots)[k.hash()];
  std::vector<int64_t> key = k.vec();
  for (Slot& s : bucket) {
    if (s.key == key) {
      s.route = std::move(route);
      Py_RETURN_TRUE;
    }
  }
  bucket.push_back({std::move(key), std::move(route)});
  ++t->size;
  t->grad_routes += training;
  Py_RETURN_TRUE;
  END_HANDLE_TH_ERRORS
}

inline PyObject* route_table_clear(PyObject* self, PyObject*) {
  auto* t = reinterpret_cast<RouteTableObject*>(self);
  t->slots->clear();
  t->size = t->grad_routes = 0;
  Py_RETURN_NONE;
}

inline PyObject* route_table_take_hits(PyObject* self, PyObject*) {
  auto* t = reinterpret_cast<RouteTableObject*>(self);
  int64_t h = t->hits;
  t->hits = 0;
  return PyLong_FromLongLong(h);
}

inline PyObject* route_table_len(PyObject* self, PyObject*) {
  return PyLong_FromSize_t(reinterpret_cast<RouteTableObject*>(self)->size);
}

inline PyObject* route_table_new(PyTypeObject* type, PyObject* a, PyObject* kw) {
  PyObject* names;
  int autocast_declines = 0;
  if (!PyArg_ParseTuple(a, "O!|p", &PyTuple_Type, &names, &autocast_declines)) return nullptr;
  auto* t = reinterpret_cast<RouteTableObject*>(type->tp_alloc(type, 0));
  if (!t) return nullptr;
  t->vectorcall = route_table_call;
  t->params = new std::vector<PyObject*>();
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(names); ++i) {
    PyObject* n = PyTuple_GET_ITEM(names, i);
    if (!PyUnicode_Check(n)) {
      Py_DECREF(t);
      PyErr_SetString(PyExc_TypeError, "RouteTable: parameter names must be strings");
      return nullptr;
    }
    Py_INCREF(n);
    t->params->push_back(n);
  }
  t->slots = new std::unordered_map<uint64_t, std::vector<Slot>>();
  t->size = t->grad_routes = 0;
  t->limit = 1024;
  t->hits = 0;
  t->autocast_declines = autocast_declines != 0;
  return reinterpret_cast<PyObject*>(t);
}

inline void route_table_dealloc(PyObject* self) {
  auto* t = reinterpret_cast<RouteTableObject*>(self);
  if (t->params) {
    for (PyObject* n : *t->params) Py_DECREF(n);
    delete t->params;
  }
  delete t->slots;  // the routes drop their Python references under the GIL, held here
  Py_TYPE(self)->tp_free(self);
}

inline PyMethodDef route_table_methods[] = {
    {"put", route_table_put, METH_VARARGS, "put(args, kwargs, spec) -> bool: the route of calls like this one."},
    {"clear", route_table_clear, METH_NOARGS, "Forget every route."},
    {"take_hits", route_table_take_hits, METH_NOARGS, "Calls run here since the last take_hits()."},
    {"size", route_table_len, METH_NOARGS, "How many routes the table holds."},
    {nullptr, nullptr, 0, nullptr}};

inline PyTypeObject& route_table_type() {
  static PyTypeObject type = [] {
    PyTypeObject t{PyVarObject_HEAD_INIT(nullptr, 0)};
    t.tp_name = "xkernels_native.RouteTable";
    t.tp_basicsize = sizeof(RouteTableObject);
    t.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL;
    t.tp_vectorcall_offset = offsetof(RouteTableObject, vectorcall);
    t.tp_call = PyVectorcall_Call;
    t.tp_new = route_table_new;
    t.tp_dealloc = route_table_dealloc;
    t.tp_methods = route_table_methods;
    t.tp_doc = "An op's routes for repeated calls: table(*args, **kwargs) -> the result, or None (not run here).";
    return t;
  }();
  return type;
}

}  // namespace xk
