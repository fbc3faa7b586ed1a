// One kernel launch with everything but the data pointers fixed, as native code runs it: a copy
// of a cuda_launch.Record's packed arguments (its spec(): pointer kernels and TMA kernels, whose
// tensor maps are encoded per call from the base pointers), or, where the backend has no records
// (the Triton interpreter), a Python launch function. Included by native.cpp only.
//
// The driver is opened at run time: no CUDA header or library is needed at build time.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <dlfcn.h>
#include <torch/csrc/utils/pybind.h>

#include <cstring>
#include <string>
#include <vector>

namespace xk {

namespace py = pybind11;

typedef int CUresult;
typedef CUresult (*launch_t)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*,
                             void**, void**);
typedef CUresult (*ctx_get_t)(void**);
typedef CUresult (*ctx_set_t)(void*);
typedef CUresult (*dev_get_t)(int*, int);
typedef CUresult (*retain_t)(void**, int);
typedef CUresult (*errstr_t)(CUresult, const char**);
typedef CUresult (*encode_t)(void*, int, uint32_t, void*, const uint64_t*, const uint64_t*, const uint32_t*,
                             const uint32_t*, int, int, int, int);
typedef CUresult (*is_capturing_t)(void*, int*);

struct Driver {
  launch_t launch = nullptr;
  ctx_get_t ctx_get = nullptr;
  ctx_set_t ctx_set = nullptr;
  dev_get_t dev_get = nullptr;
  retain_t retain = nullptr;
  errstr_t errstr = nullptr;
  encode_t encode_tiled = nullptr;  // cuTensorMapEncodeTiled (CUDA 12+ drivers)
  is_capturing_t is_capturing = nullptr;  // cuStreamIsCapturing
  std::string why = "not opened";
};

inline const Driver& driver() {
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
    d.encode_tiled = (encode_t)dlsym(h, "cuTensorMapEncodeTiled");
    d.is_capturing = (is_capturing_t)dlsym(h, "cuStreamIsCapturing");
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

// Whether a CUDA graph is being captured on the current stream of cuda device `dev` (true where
// the driver cannot tell, e.g. the legacy stream while another stream captures).
inline bool capturing(const at::Device& dev) {
  const Driver& d = driver();
  if (!d.is_capturing) return true;
  void* stream = c10::impl::getDeviceGuardImpl(dev.type())->getStream(dev).native_handle();
  int status = 0;
  return d.is_capturing(stream, &status) != 0 || status != 0;  // 0: CU_STREAM_CAPTURE_STATUS_NONE
}

constexpr size_t kMaxParams = 64;
constexpr size_t kMaxMaps = 4;
constexpr size_t kMaxRank = 5;

// A TMA tensor map of the kernel, encoded per call from its base pointer (as cuda_launch.c's
// record does): dims and box innermost first, strides in bytes (rank - 1 of them).
struct MapSpec {
  int param = 0, dtype = 0, swizzle = 0, fill = 0;
  uint32_t rank = 0;
  uint64_t dims[kMaxRank] = {}, strides[kMaxRank] = {};
  uint32_t box[kMaxRank] = {}, elem_strides[kMaxRank] = {1, 1, 1, 1, 1};
};

inline bool hook_calls(const py::object& hook) {  // a Triton launch hook chain with hooks installed
  if (!hook) return false;
  py::object calls = py::getattr(hook, "calls", py::none());
  return calls.is_none() || PyObject_IsTrue(calls.ptr()) != 0;
}

struct Launch {
  uint64_t function = 0;  // CUfunction; 0: launch through `pylaunch` instead
  unsigned grid[3] = {1, 1, 1};
  unsigned threads = 0, shared = 0;
  std::vector<uint64_t> slots;
  std::vector<int64_t> ptr_slot;  // per tensor argument: its parameter slot, or -1 - k: the base of map k
  std::vector<MapSpec> maps;
  py::object pylaunch;            // Python launch function of the tensors, returning whether it launched
  py::object enter_hook, exit_hook;  // Triton's launch hook chains (checked where the GIL is held)

  bool empty() const { return !function && !pylaunch; }

  // Whether Triton launch hooks are installed now (a profiler): then the caller launches the
  // Python way, which calls them. Needs the GIL.
  bool hooked() const { return hook_calls(enter_hook) || hook_calls(exit_hook); }

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
    alignas(128) unsigned char map_buf[kMaxMaps][128];
    const size_t n = slots.size();
    for (size_t k = 0; k < n; ++k) values[k] = slots[k];
    for (size_t k = 0; k < n; ++k) params[k] = &values[k];
    const Driver& d = driver();
    TORCH_CHECK(d.launch, "xkernels native launch: ", d.why);
    for (size_t i = 0; i < ts.size(); ++i) {
      auto p = reinterpret_cast<uint64_t>(ts[i].data_ptr());
      if (p & 15) return false;  // compiled for 16-byte aligned pointers
      if (ptr_slot[i] >= 0) {
        values[ptr_slot[i]] = p;
        continue;
      }
      const size_t k = static_cast<size_t>(-1 - ptr_slot[i]);
      const MapSpec& m = maps[k];
      TORCH_CHECK(d.encode_tiled, "xkernels native launch: the driver has no cuTensorMapEncodeTiled");
      std::memset(map_buf[k], 0, 128);
      CUresult e = d.encode_tiled(map_buf[k], m.dtype, m.rank, reinterpret_cast<void*>(p), m.dims, m.strides, m.box,
                                  m.elem_strides, 0 /* no interleave */, m.swizzle, 2 /* L2 promotion 128B */,
                                  m.fill);
      if (e != 0) {
        const char* msg = "unknown error";
        if (d.errstr) d.errstr(e, &msg);
        TORCH_CHECK(false, "xkernels native launch: cuTensorMapEncodeTiled failed: ", msg);
      }
      params[m.param] = map_buf[k];
    }
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

// A launch from what native.py's launch_spec gives: a cuda_launch.Record's spec() (function, gx,
// gy, gz, threads, shared, slots: bytes, ptr_slots[, maps[, enter_hook, exit_hook]]), or a Python
// launch function.
inline Launch make_launch(const py::object& how) {
  Launch l;
  if (!py::isinstance<py::tuple>(how)) {
    TORCH_CHECK(PyCallable_Check(how.ptr()), "xkernels native: a launch is a record spec or a callable");
    l.pylaunch = how;
    return l;
  }
  auto t = how.cast<py::tuple>();
  TORCH_CHECK(t.size() == 8 || t.size() == 9 || t.size() == 11, "xkernels native: a record spec has 8, 9 or 11 fields");
  l.function = t[0].cast<uint64_t>();
  for (int i = 0; i < 3; ++i) l.grid[i] = t[1 + i].cast<unsigned>();
  l.threads = t[4].cast<unsigned>();
  l.shared = t[5].cast<unsigned>();
  std::string raw = t[6].cast<std::string>();
  TORCH_CHECK(raw.size() % 8 == 0 && raw.size() / 8 <= kMaxParams, "xkernels native: bad parameter slots");
  l.slots.resize(raw.size() / 8);
  std::memcpy(l.slots.data(), raw.data(), raw.size());
  if (t.size() >= 9) {
    for (auto item : t[8].cast<py::tuple>()) {
      // (param, dtype, swizzle, fill, dims, strides in bytes, box): innermost first, as the record keeps them
      auto f = item.cast<py::tuple>();
      TORCH_CHECK(f.size() == 7, "xkernels native: a tensor map spec has 7 fields");
      MapSpec m;
      m.param = f[0].cast<int>();
      m.dtype = f[1].cast<int>();
      m.swizzle = f[2].cast<int>();
      m.fill = f[3].cast<int>();
      auto dims = f[4].cast<std::vector<uint64_t>>(), strides = f[5].cast<std::vector<uint64_t>>();
      auto box = f[6].cast<std::vector<uint32_t>>();
      TORCH_CHECK(!dims.empty() && dims.size() <= kMaxRank && box.size() == dims.size() &&
                      strides.size() + 1 == dims.size() && m.param >= 0 &&
                      static_cast<size_t>(m.param) < l.slots.size() && l.maps.size() < kMaxMaps,
                  "xkernels native: bad tensor map spec");
      m.rank = static_cast<uint32_t>(dims.size());
      for (size_t i = 0; i < dims.size(); ++i) {
        m.dims[i] = dims[i];
        m.box[i] = box[i];
      }
      for (size_t i = 0; i < strides.size(); ++i) m.strides[i] = strides[i];
      l.maps.push_back(m);
    }
  }
  if (t.size() == 11) {
    l.enter_hook = t[9];
    l.exit_hook = t[10];
  }
  for (auto v : t[7].cast<py::tuple>()) {
    int64_t slot = v.cast<int64_t>();
    TORCH_CHECK((slot >= 0 && static_cast<size_t>(slot) < l.slots.size()) ||
                    (slot < 0 && static_cast<size_t>(-1 - slot) < l.maps.size()),
                "xkernels native: bad pointer slot");
    l.ptr_slot.push_back(slot);
  }
  return l;
}

// Releases a launch's Python references where the interpreter is still up (else leaks them).
inline void drop_python(Launch& l) {
  if (Py_IsInitialized()) {
    py::gil_scoped_acquire gil;
    l.pylaunch = py::object();
    l.enter_hook = py::object();
    l.exit_hook = py::object();
  } else {
    l.pylaunch.release();
    l.enter_hook.release();
    l.exit_hook.release();
  }
}

}  // namespace xk
