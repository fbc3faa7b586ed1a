// The native extension: native autograd for xkernels' fused ops (here: a repeated training call
// recorded and differentiated without Python), the ops' native front door (native_route.h; the
// op classes' call slot that runs it, native_call.h) and enable()'s overrides
// (native_overrides.h), bound into one module below. See native.py for how it
// is built and loaded, and ops/fused/add_norm_native.py for how the add + norm route uses it.
//
// AddNormSpec: one signature's (and one eps/offset value's) add + LayerNorm / RMSNorm, as its
// Python route planned it: the forward launch (a copy of a cuda_launch.Record's packed
// arguments, or a Python launch function where the backend has no records: the interpreter),
// the result's shape and dtype, and once the first backward of the signature has run in
// Python, the backward launch and what it allocates.
//
//   spec.apply(x, residual, weight, bias) -> (y, s) with a native grad_fn, or None (the launch
//                                            declined, or saved-tensor hooks are in effect: the
//                                            caller takes the Python route, whose saves they pack)
//
// The grad_fn (AddNormBackward) launches the backward kernel and reduces d(w)/d(b) with ATen,
// never taking the GIL. Anything its one recorded backward does not cover (no dy, other grad
// strides or dtypes, other required gradients, a declined launch, create_graph) goes to the
// Python backward (`fallback`), which is the op's own: same kernels, same formulas.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/library.h>

#include <array>
#include <map>
#include <unordered_map>
#include <tuple>
#include <cmath>
#include <cstring>
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>


#include "native_launch.h"
#include "native_route.h"
#include "native_overrides.h"
#include "native_call.h"

namespace py = pybind11;
using torch::autograd::Node;
using torch::autograd::variable_list;

namespace {

using xk::Launch;
using xk::make_launch;

// The backward a signature's first Python backward planned (add_norm_bwd.HotBackward).
struct Backward {
  Launch launch;
  Launch sum;  // part_sum_kernel: d(w)/d(b) from the partials, in the parameters' dtypes; empty: aten's sum
  std::array<bool, 11> present{};  // which of the kernel's 11 tensor arguments the launch takes
  std::array<bool, 4> needs{};     // the gradients it was planned for: x, residual, weight, bias
  bool has_ds = false, need_x = false, need_r = false, need_dw = false, need_db = false, shared = false;
  bool one_chunk = true;
  int64_t programs = 0, n_part = 0, n = 0;
  at::ScalarType x_dtype{}, dr_dtype{}, w_dtype{}, b_dtype{};
  bool has_dr = false;

  ~Backward() {
    xk::drop_python(launch);
    xk::drop_python(sum);
  }
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
    xk::drop_python(forward);
    if (Py_IsInitialized()) {
      py::gil_scoped_acquire gil;
      fallback = py::object();
    } else {  // interpreter gone: leak the reference rather than touch it
      fallback.release();
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
    if (b.n_part && !b.sum.empty()) {
      at::Tensor w_out = b.need_dw ? at::empty({b.n}, opts.dtype(b.w_dtype)) : at::Tensor();
      at::Tensor b_out = b.need_db ? at::empty({b.n}, opts.dtype(b.b_dtype)) : at::Tensor();
      if (spec->poison) {
        for (auto* t : {&w_out, &b_out}) if (t->defined()) t->fill_(NAN);
      }
      if (b.sum({part, w_out.defined() ? w_out : part, b_out.defined() ? b_out : part})) {
        gw = w_out;
        gb = b_out;
      }
    }
    if (b.n_part && !gw.defined() && !gb.defined()) {  // no record, or it declined: aten's sum and casts
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

using xk::make_node;

py::object apply(const std::shared_ptr<AddNormSpec>& spec, const at::Tensor& x, const py::object& r_obj,
                 const py::object& w_obj, const py::object& b_obj) {
  at::Tensor r = or_undefined(r_obj), w = or_undefined(w_obj), b = or_undefined(b_obj);
  if (xk::saved_tensor_hooks()) return py::none();  // the Python route: its saves are packed
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
  if (d.contains("sum") && !d["sum"].is_none()) b->sum = make_launch(d["sum"]);
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
  using namespace xk::overrides;
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
  py::class_<Override, std::shared_ptr<Override>>(m, "Override")
      .def("remember_add", &remember_add, py::arg("self"), py::arg("other"), py::arg("alpha"), py::arg("spec"),
           py::arg("why"))
      .def("remember_vendor", &remember_vendor, py::arg("tensors"), py::arg("why"))
      .def("remember_route", &remember_route, py::arg("tensors"), py::arg("spec"))
      .def("remove", &remove_override)
      .def("reinstall", &reinstall_override)
      .def_property_readonly("installed", [](Override& o) { return bool(o.lib); })
      .def("clear", [](Override& o) {
        std::lock_guard<std::mutex> g(o.lock);
        o.clear();
      })
      .def("take_hits", [](Override& o) {  // (launches, {reason for aten: calls}) since the last take
        py::dict vendor;
        std::lock_guard<std::mutex> g(o.lock);
        for (auto& [why, c] : o.vendor_hits)
          if (int64_t n = c->exchange(0)) vendor[py::str(why)] = n;
        return py::make_tuple(o.hits.exchange(0), vendor);
      })
      .def_property_readonly("entries", [](Override& o) {
        std::lock_guard<std::mutex> g(o.lock);
        return o.size;
      });
  py::class_<CompositeOverride, std::shared_ptr<CompositeOverride>>(m, "CompositeOverride")
      .def("remove", &remove_composite)
      .def("clear", [](CompositeOverride&) {})
      .def_property_readonly("entries", [](CompositeOverride&) { return 0; })  // it remembers no signatures
      .def("take_hits", [](CompositeOverride& o) {  // (0, {"one grad_fn": calls}) since the last take
        py::dict why;
        if (int64_t n = o.hits.exchange(0)) why[py::str("one grad_fn (xkernels::LinearBackward)")] = n;
        return py::make_tuple(0, why);
      });
  m.def("override_composite", &override_composite, py::arg("name"), py::arg("key"));
  m.def("set_overrides_active", [](int n) { g_overrides_active = n; });
  m.def("set_poison", [](bool on) {
    xk::poison_flag() = on;  // tests: a launched route's result is NaN-filled before its launch
  });
  m.def("set_context_vars", [](py::object override_var, py::object forced_var) {
    // the front door's key reads these (xkernels.dispatch's use_backend, xkernels.tuning's force)
    auto& cv = xk::context_vars();
    Py_XDECREF(cv.override_var);
    Py_XDECREF(cv.forced_var);
    cv.override_var = override_var.release().ptr();
    cv.forced_var = forced_var.release().ptr();
  });
  if (PyType_Ready(&xk::route_table_type()) < 0) throw py::error_already_set();
  Py_INCREF(&xk::route_table_type());
  m.add_object("RouteTable", py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(&xk::route_table_type())));
  m.def("install_op_call", [](py::object cls) {
    // an op class's call slot runs its RouteTable from C (native_call.h)
    const bool done = xk::install_op_call(cls.ptr());
    if (PyErr_Occurred()) throw py::error_already_set();
    return done;
  });
  m.def("op_call_installed", [](py::object cls) { return xk::op_call_installed(cls.ptr()); });
  m.def("override_op", &override_op, py::arg("name"), py::arg("key"), py::arg("python_override"));
  m.def("driver_error", [] { return xk::driver().why; });
#ifdef XK_ATEN_CUDA
  m.attr("aten_cuda_direct") = true;  // enable()'s overrides call aten's CUDA kernels directly
#else
  m.attr("aten_cuda_direct") = false;
#endif
}
