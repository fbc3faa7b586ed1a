// Native autograd for xkernels' fused ops: a repeated training call recorded and differentiated
// without Python. See native.py for how it is built and loaded, and ops/fused/add_norm_native.py
// for how the add + norm route uses it.
//
// AddNormSpec: one signature's (and one eps/offset value's) add + LayerNorm / RMSNorm, as its
// Python route planned it: the forward launch (a copy of a cuda_launch.Record's packed
// arguments, or a Python launch function where the backend has no records: the interpreter),
// the result's shape and dtype, and once the first backward of the signature has run in
// Python, the backward launch and what it allocates.
//
//   spec.apply(x, residual, weight, bias) -> (y, s) with a native grad_fn, or None (the launch
//                                            declined: the caller takes the Python route)
//
// The grad_fn (AddNormBackward) launches the backward kernel and reduces d(w)/d(b) with ATen,
// never taking the GIL. Anything its one recorded backward does not cover (no dy, other grad
// strides or dtypes, other required gradients, a declined launch, create_graph) goes to the
// Python backward (`fallback`), which is the op's own: same kernels, same formulas.
#include <ATen/ATen.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <dlfcn.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/utils/pybind.h>

#include <array>
#include <cmath>
#include <cstring>
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

namespace py = pybind11;
using torch::autograd::Node;
using torch::autograd::variable_list;

namespace torch::autograd {
void deleteNode(Node* function);  // declared by torch versions whose nodes are shared_ptrs
}

namespace {

// -- the driver, opened at run time (no CUDA header or library at build time) -----------------
typedef int CUresult;
typedef CUresult (*launch_t)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*,
                             void**, void**);
typedef CUresult (*ctx_get_t)(void**);
typedef CUresult (*ctx_set_t)(void*);
typedef CUresult (*dev_get_t)(int*, int);
typedef CUresult (*retain_t)(void**, int);
typedef CUresult (*errstr_t)(CUresult, const char**);

struct Driver {
  launch_t launch = nullptr;
  ctx_get_t ctx_get = nullptr;
  ctx_set_t ctx_set = nullptr;
  dev_get_t dev_get = nullptr;
  retain_t retain = nullptr;
  errstr_t errstr = nullptr;
  std::string why = "not opened";
};

const Driver& driver() {
  static Driver d = [] {
    Driver d;
    void* h = dlopen("libcuda.so.1", RTLD_LAZY);
    if (!h) {
      d.why = "libcuda.so.1 could not be opened";
      return d;
    }
    d.launch = (launch_t)dlsym(h, "cuLaunchKernel");
    d.ctx_get = (ctx_get_t)dlsym(h, "cuCtxGetCurrent");
    d.ctx_set = (ctx_set_t)dlsym(h, "cuCtxSetCurrent");
    d.dev_get = (dev_get_t)dlsym(h, "cuDeviceGet");
    d.retain = (retain_t)dlsym(h, "cuDevicePrimaryCtxRetain");
    d.errstr = (errstr_t)dlsym(h, "cuGetErrorString");
    if (!(d.launch && d.ctx_get && d.ctx_set && d.dev_get && d.retain)) {
      d.launch = nullptr;
      d.why = "libcuda.so.1 lacks a driver function this launcher uses";
    } else {
      d.why = "";
    }
    return d;
  }();
  return d;
}

constexpr size_t kMaxParams = 64;

// One kernel launch with everything but the data pointers fixed.
struct Launch {
  uint64_t function = 0;  // CUfunction; 0: launch through `pylaunch` instead
  unsigned grid[3] = {1, 1, 1};
  unsigned threads = 0, shared = 0;
  std::vector<uint64_t> slots;
  std::vector<int64_t> ptr_slot;  // the parameter slot of each tensor argument, in order
  py::object pylaunch;            // Python launch function of the tensors, returning whether it launched

  // Whether it launched; false: nothing ran (a misaligned pointer, a Python launch that declined).
  bool operator()(const std::vector<at::Tensor>& ts) const {
    if (!function) {
      py::gil_scoped_acquire gil;
      py::tuple args(ts.size());
      for (size_t i = 0; i < ts.size(); ++i) args[i] = py::cast(ts[i]);
      return pylaunch(*args).cast<bool>();
    }
    TORCH_CHECK(ts.size() == ptr_slot.size(), "xkernels native launch: ", ts.size(), " tensors for ",
                ptr_slot.size(), " pointer slots");
    uint64_t values[kMaxParams];
    void* params[kMaxParams];
    const size_t n = slots.size();
    for (size_t k = 0; k < n; ++k) values[k] = slots[k];
    for (size_t i = 0; i < ts.size(); ++i) {
      auto p = reinterpret_cast<uint64_t>(ts[i].data_ptr());
      if (p & 15) return false;  // compiled for 16-byte aligned pointers
      values[ptr_slot[i]] = p;
    }
    for (size_t k = 0; k < n; ++k) params[k] = &values[k];
    const Driver& d = driver();
    TORCH_CHECK(d.launch, "xkernels native launch: ", d.why);
    const c10::Device dev = ts[0].device();
    void* ctx = nullptr;
    d.ctx_get(&ctx);
    if (!ctx) {  // a thread that never touched the runtime API (an autograd device thread may not)
      int cu_dev = 0;
      TORCH_CHECK(d.dev_get(&cu_dev, dev.index()) == 0 && d.retain(&ctx, cu_dev) == 0 && d.ctx_set(ctx) == 0,
                  "xkernels native launch: no CUDA context for ", dev);
    }
    void* stream = c10::impl::getDeviceGuardImpl(dev.type())->getStream(dev).native_handle();
    CUresult r = d.launch(reinterpret_cast<void*>(function), grid[0], grid[1], grid[2], threads, 1, 1, shared,
                          stream, params, nullptr);
    if (r != 0) {
      const char* msg = "unknown error";
      if (d.errstr) d.errstr(r, &msg);
      TORCH_CHECK(false, "xkernels native launch: cuLaunchKernel failed: ", msg);
    }
    return true;
  }
};

// (function, gx, gy, gz, threads, shared, slots: bytes, ptr_slots) as cuda_launch.Record.spec() gives
// them, or a Python launch function.
Launch make_launch(const py::object& how) {
  Launch l;
  if (!py::isinstance<py::tuple>(how)) {
    TORCH_CHECK(PyCallable_Check(how.ptr()), "xkernels native: a launch is a record spec or a callable");
    l.pylaunch = how;
    return l;
  }
  auto t = how.cast<py::tuple>();
  TORCH_CHECK(t.size() == 8, "xkernels native: a record spec has 8 fields");
  l.function = t[0].cast<uint64_t>();
  for (int i = 0; i < 3; ++i) l.grid[i] = t[1 + i].cast<unsigned>();
  l.threads = t[4].cast<unsigned>();
  l.shared = t[5].cast<unsigned>();
  std::string raw = t[6].cast<std::string>();
  TORCH_CHECK(raw.size() % 8 == 0 && raw.size() / 8 <= kMaxParams, "xkernels native: bad parameter slots");
  l.slots.resize(raw.size() / 8);
  std::memcpy(l.slots.data(), raw.data(), raw.size());
  for (auto v : t[7].cast<py::tuple>()) {
    int64_t slot = v.cast<int64_t>();
    TORCH_CHECK(slot >= 0 && static_cast<size_t>(slot) < l.slots.size(), "xkernels native: bad pointer slot");
    l.ptr_slot.push_back(slot);
  }
  return l;
}

// The backward a signature's first Python backward planned (add_norm_bwd.HotBackward).
struct Backward {
  Launch launch;
  std::array<bool, 11> present{};  // which of the kernel's 11 tensor arguments the launch takes
  std::array<bool, 4> needs{};     // the gradients it was planned for: x, residual, weight, bias
  bool has_ds = false, need_x = false, need_r = false, need_dw = false, need_db = false, shared = false;
  bool one_chunk = true;
  int64_t programs = 0, n_part = 0, n = 0;
  at::ScalarType x_dtype{}, dr_dtype{}, w_dtype{}, b_dtype{};
  bool has_dr = false;
};

struct AddNormSpec {
  Launch forward;
  std::vector<int64_t> size;
  at::ScalarType dtype;
  int64_t rows;
  bool layer;
  bool poison = false;  // tests: results and gradients are NaN-filled before each launch
  py::object fallback;  // (spec, dy, ds, s, mean, rstd, weight, needs) -> (dx, dres, dw, db)
  std::shared_ptr<const Backward> backward;
  std::mutex lock;

  ~AddNormSpec() {
    if (Py_IsInitialized()) {
      py::gil_scoped_acquire gil;
      fallback = py::object();
      forward.pylaunch = py::object();
      if (backward) const_cast<Backward&>(*backward).launch.pylaunch = py::object();
    } else {  // interpreter gone: leak the references rather than touch it
      fallback.release();
      forward.pylaunch.release();
    }
  }

  std::shared_ptr<const Backward> get_backward() {
    std::lock_guard<std::mutex> g(lock);
    return backward;
  }
};

at::Tensor or_undefined(const py::handle& h) {
  return h.is_none() ? at::Tensor() : h.cast<at::Tensor>();
}

py::object or_none(const at::Tensor& t) {
  return t.defined() ? py::cast(t) : py::none();
}

struct AddNormBackward : public Node {
  std::shared_ptr<AddNormSpec> spec;
  at::Tensor s, mean, rstd, weight;  // detached: they share the version counters of the saved tensors
  uint32_t s_version = 0, w_version = 0;

  std::string name() const override { return "AddNormBackward"; }

  void release_variables() override {
    s.reset();
    mean.reset();
    rstd.reset();
    weight.reset();
  }

  variable_list apply(variable_list&& grads) override {
    TORCH_CHECK(s.defined(), "xkernels add_norm: trying to backward through the graph a second time (or directly "
                "access saved tensors after they have already been freed); specify retain_graph=True");
    TORCH_CHECK(s._version() == s_version && (!weight.defined() || weight._version() == w_version),
                "one of the variables needed for gradient computation has been modified by an inplace operation: "
                "the sum or the weight saved by xkernels' add_norm");
    at::Tensor dy = grads[0], ds = grads.size() > 1 ? grads[1] : at::Tensor();
    TORCH_CHECK(!(at::GradMode::is_enabled() && ((dy.defined() && dy.requires_grad()) ||
                                                  (ds.defined() && ds.requires_grad()))),
                "xkernels add_norm: double backward is not supported (a backward with create_graph=True "
                "through the fused add + norm)");
    std::array<bool, 4> needs{should_compute_output(0), should_compute_output(1), should_compute_output(2),
                              should_compute_output(3)};
    if (auto b = spec->get_backward(); b && dy.defined()) {
      variable_list out;
      if (native(*b, dy, ds, needs, out)) return out;
    }
    py::gil_scoped_acquire gil;
    py::tuple r = spec->fallback(py::cast(spec), or_none(dy), or_none(ds), s, or_none(mean), rstd, or_none(weight),
                                 py::make_tuple(needs[0], needs[1], needs[2], needs[3]));
    return {or_undefined(r[0]), or_undefined(r[1]), or_undefined(r[2]), or_undefined(r[3])};
  }

  bool fits(const at::Tensor& t) const {
    return t.scalar_type() == spec->dtype && t.is_contiguous() && t.sizes().equals(spec->size);
  }

  bool native(const Backward& b, const at::Tensor& dy, const at::Tensor& ds, const std::array<bool, 4>& needs,
              variable_list& out) {
    if (needs != b.needs || ds.defined() != b.has_ds || !fits(dy) || (ds.defined() && !fits(ds)) ||
        weight.defined() != b.present[5])
      return false;
    auto opts = dy.options();
    at::Tensor dx = b.need_x ? at::empty(spec->size, opts.dtype(b.x_dtype)) : at::Tensor();
    at::Tensor dr = b.has_dr ? at::empty(spec->size, opts.dtype(b.dr_dtype)) : at::Tensor();
    at::Tensor part;
    if (b.n_part) {
      auto f32 = opts.dtype(at::kFloat);
      part = b.one_chunk ? at::empty({b.programs, b.n_part, b.n}, f32) : at::zeros({b.programs, b.n_part, b.n}, f32);
    }
    if (spec->poison) {
      for (auto* t : {&dx, &dr}) if (t->defined()) t->fill_(NAN);
      if (part.defined() && b.one_chunk) part.fill_(NAN);
    }
    const at::Tensor full[11] = {s, at::Tensor(), at::Tensor(), dy, ds, weight, mean, rstd, dx, dr, part};
    std::vector<at::Tensor> ts;
    for (int i = 0; i < 11; ++i) {
      if (!b.present[i]) continue;
      if (!full[i].defined()) return false;
      ts.push_back(full[i]);
    }
    if (!b.launch(ts)) return false;
    at::Tensor gw, gb;
    if (b.n_part) {
      at::Tensor red = part.sum(0);
      if (b.need_dw && b.need_db && b.w_dtype == b.b_dtype && red.scalar_type() != b.b_dtype) red = red.to(b.b_dtype);
      if (b.need_dw) gw = red[0].scalar_type() == b.w_dtype ? red[0] : red[0].to(b.w_dtype);
      if (b.need_db) {
        at::Tensor last = red[b.n_part - 1];
        gb = last.scalar_type() == b.b_dtype ? last : last.to(b.b_dtype);
      }
    }
    at::Tensor gr = b.need_r ? (b.shared ? dx : dr) : at::Tensor();
    out = {dx, gr, gw, gb};
    return true;
  }
};

using NodePtr = decltype(torch::autograd::Edge::function);

template <class T, class P = NodePtr>
P make_node() {
  if constexpr (std::is_same_v<P, std::shared_ptr<Node>>) {
    return P(new T(), torch::autograd::deleteNode);
  } else {
    return c10::make_intrusive<T>();
  }
}

py::object apply(const std::shared_ptr<AddNormSpec>& spec, const at::Tensor& x, const py::object& r_obj,
                 const py::object& w_obj, const py::object& b_obj) {
  at::Tensor r = or_undefined(r_obj), w = or_undefined(w_obj), b = or_undefined(b_obj);
  auto opts = x.options().dtype(spec->dtype);
  at::Tensor y = at::empty(spec->size, opts);
  at::Tensor s = at::empty(spec->size, opts);
  at::Tensor rstd = at::empty({spec->rows}, opts.dtype(at::kFloat));
  at::Tensor mean = spec->layer ? at::empty({spec->rows}, opts.dtype(at::kFloat)) : at::Tensor();
  if (spec->poison) {
    for (auto* t : {&y, &s, &rstd, &mean}) if (t->defined()) t->fill_(NAN);
  }
  {
    at::NoGradGuard no_grad;  // as an autograd.Function's forward: the launch records nothing
    std::vector<at::Tensor> ts = {x, r.defined() ? r : x, w.defined() ? w : y, b.defined() ? b : y,
                                  s, y, mean.defined() ? mean : y, rstd};
    if (!spec->forward(ts)) return py::none();
  }
  if (torch::autograd::compute_requires_grad(x, r, w, b)) {
    auto node = make_node<AddNormBackward>();
    auto* raw = static_cast<AddNormBackward*>(node.get());
    raw->spec = spec;
    raw->set_next_edges(torch::autograd::collect_next_edges(x, r, w, b));
    torch::autograd::set_history(y, node);
    torch::autograd::set_history(s, node);
    raw->s = s.detach();
    raw->s_version = s._version();
    raw->mean = mean;
    raw->rstd = rstd;
    if (w.defined()) {
      raw->weight = w.detach();
      raw->w_version = w._version();
    }
  }
  return py::make_tuple(y, s);
}

void set_backward(AddNormSpec& spec, const py::object& launch, const py::tuple& present, const py::tuple& needs,
                  const py::dict& d) {
  auto b = std::make_shared<Backward>();
  b->launch = make_launch(launch);
  TORCH_CHECK(present.size() == 11 && needs.size() == 4, "xkernels native: bad backward description");
  for (int i = 0; i < 11; ++i) b->present[i] = present[i].cast<bool>();
  for (int i = 0; i < 4; ++i) b->needs[i] = needs[i].cast<bool>();
  b->has_ds = b->present[4];
  b->need_x = d["need_x"].cast<bool>();
  b->need_r = d["need_r"].cast<bool>();
  b->need_dw = d["need_dw"].cast<bool>();
  b->need_db = d["need_db"].cast<bool>();
  b->shared = d["shared"].cast<bool>();
  b->one_chunk = d["one_chunk"].cast<bool>();
  b->programs = d["programs"].cast<int64_t>();
  b->n_part = d["n_part"].cast<int64_t>();
  b->n = d["n"].cast<int64_t>();
  b->x_dtype = d["x_dtype"].cast<at::ScalarType>();
  b->has_dr = !d["dr_dtype"].is_none();
  if (b->has_dr) b->dr_dtype = d["dr_dtype"].cast<at::ScalarType>();
  if (!d["w_dtype"].is_none()) b->w_dtype = d["w_dtype"].cast<at::ScalarType>();
  if (!d["b_dtype"].is_none()) b->b_dtype = d["b_dtype"].cast<at::ScalarType>();
  std::lock_guard<std::mutex> g(spec.lock);
  spec.backward = std::move(b);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "xkernels native autograd (backends/native.cpp)";
  py::class_<AddNormSpec, std::shared_ptr<AddNormSpec>>(m, "AddNormSpec")
      .def(py::init([](const py::object& launch, std::vector<int64_t> size, at::ScalarType dtype, bool layer,
                       py::object fallback) {
             auto s = std::make_shared<AddNormSpec>();
             s->forward = make_launch(launch);
             s->rows = 1;
             for (size_t i = 0; i + 1 < size.size(); ++i) s->rows *= size[i];
             s->size = std::move(size);
             s->dtype = dtype;
             s->layer = layer;
             s->fallback = std::move(fallback);
             return s;
           }),
           py::arg("launch"), py::arg("size"), py::arg("dtype"), py::arg("layer"), py::arg("fallback"))
      .def("apply", &apply, py::arg("x"), py::arg("residual"), py::arg("weight"), py::arg("bias"))
      .def("set_backward", &set_backward, py::arg("launch"), py::arg("present"), py::arg("needs"), py::arg("desc"))
      .def_readwrite("poison", &AddNormSpec::poison)
      .def_property_readonly("has_backward", [](AddNormSpec& s) { return bool(s.get_backward()); })
      .def_property_readonly("native_launch", [](AddNormSpec& s) { return s.forward.function != 0; });
  m.def("driver_error", [] { return driver().why; });
}
