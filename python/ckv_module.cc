// SPDX-License-Identifier: Apache-2.0
// python/ckv_module.cc: the Python module `ckv` (pybind11) over the public C++ API.
//
// Tensors come in through the buffer protocol without a copy: numpy arrays (or objects that
// numpy.asarray turns into arrays without copying, e.g. CPU torch tensors through __array__) of
// the exact dtype, shape and C-contiguous strides; anything else is a ValueError naming the
// tensor. fp16 is numpy float16, bf16 is numpy uint16 (the raw bits), fp32 is float32. Every
// blocking call releases the GIL, and so does the destruction of an engine or a session that
// Python collects. A failed absl::Status becomes a ckv.Error (attribute `code`:
// the absl code name) of the subclass for its code. await_layer's arrays are views of the pinned
// records, except GPU-tier records in device memory, which are copied to host memory. See
// python/ckv.pyi and docs/python.md.
#include <pybind11/eval.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ckv/chunk_key.h"
#include "ckv/codec.h"
#include "ckv/engine.h"
#include "ckv/kv.h"
#include "ckv/model_spec.h"
#include "ckv/options.h"
#include "ckv/session.h"
#include "ckv/stats.h"

#ifdef CKV_PYTHON_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace py = pybind11;

namespace {

// ---- errors -------------------------------------------------------------------------------------

// Thrown by the binding code, translated into the ckv.Error subclass for the status's code.
struct StatusError {
  absl::Status status;
};

// The Python side of the error classes: defined in Python for multiple inheritance from built-ins.
constexpr const char* kErrorClasses = R"py(
class Error(Exception):
    """A ckv call failed. `code` is the absl status code's name, e.g. "NOT_FOUND"."""
    def __init__(self, message, code="UNKNOWN"):
        super().__init__(message)
        self.code = code

class NotFoundError(Error, LookupError):
    """NOT_FOUND: the store, prefix or chunk does not exist."""

class InvalidArgumentError(Error, ValueError):
    """INVALID_ARGUMENT: bad caller input (wrong dtype, shape, strides, token count, spec)."""

class FailedPreconditionError(Error, RuntimeError):
    """FAILED_PRECONDITION: a read-only engine asked to write, a closed engine, a spec mismatch."""

class AlreadyExistsError(Error):
    """ALREADY_EXISTS: a store is there and error_if_exists was set."""

class DataLossError(Error):
    """DATA_LOSS: a record failed its checksum or could not be read."""

class ResourceExhaustedError(Error):
    """RESOURCE_EXHAUSTED: the cap cannot be met or the disk is full."""

class PermissionDeniedError(Error, PermissionError):
    """PERMISSION_DENIED: the store's directory cannot be written."""

class UnavailableError(Error):
    """UNAVAILABLE: a retry might work."""

class UnimplementedError(Error, NotImplementedError):
    """UNIMPLEMENTED: not supported here (e.g. a GPU-tier record in device memory)."""

class OutOfRangeError(Error, IndexError):
    """OUT_OF_RANGE."""

_BY_CODE = {
    "NOT_FOUND": NotFoundError,
    "INVALID_ARGUMENT": InvalidArgumentError,
    "FAILED_PRECONDITION": FailedPreconditionError,
    "ALREADY_EXISTS": AlreadyExistsError,
    "DATA_LOSS": DataLossError,
    "RESOURCE_EXHAUSTED": ResourceExhaustedError,
    "PERMISSION_DENIED": PermissionDeniedError,
    "UNAVAILABLE": UnavailableError,
    "UNIMPLEMENTED": UnimplementedError,
    "OUT_OF_RANGE": OutOfRangeError,
}
)py";

// The module's dict, where the error classes live (set at import; never freed).
PyObject* g_module_dict = nullptr;

// "NOT_FOUND" for absl::StatusCode::kNotFound (absl's StatusCodeToString names them so).
std::string CodeName(absl::StatusCode code) { return absl::StatusCodeToString(code); }

// Sets the Python error for `status` (called by the exception translator, with the GIL).
void RaiseStatus(const absl::Status& status) {
  const std::string code = CodeName(status.code());
  py::dict d = py::reinterpret_borrow<py::dict>(g_module_dict);
  py::dict by_code = d["_BY_CODE"];
  py::object cls = by_code.contains(code) ? by_code[code.c_str()] : d["Error"];
  py::object err = cls(std::string(status.message()), code);
  PyErr_SetObject(cls.ptr(), err.ptr());
}

void Check(const absl::Status& status) {
  if (!status.ok()) throw StatusError{status};
}
template <typename T>
T Take(absl::StatusOr<T> result) {
  if (!result.ok()) throw StatusError{result.status()};
  return *std::move(result);
}

[[noreturn]] void Invalid(std::string message) {
  throw StatusError{absl::InvalidArgumentError(std::move(message))};
}

// ---- tensors ------------------------------------------------------------------------------------

py::dtype DTypeOf(ckv::DType dtype) {
  switch (dtype) {
    case ckv::DType::kFp16:
      return py::dtype("float16");
    case ckv::DType::kBf16:
      return py::dtype("uint16");
    case ckv::DType::kFp32:
      return py::dtype("float32");
  }
  return py::dtype("uint8");
}

std::string ShapeString(const std::vector<py::ssize_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

std::string ArrayShape(const py::array& a) {
  std::vector<py::ssize_t> shape(a.shape(), a.shape() + a.ndim());
  return ShapeString(shape);
}

// `obj` (named `name`) as an array without a copy: an ndarray as it is, anything else through
// numpy.asarray (buffer protocol, __array__, __array_interface__; a list becomes a new array and
// then usually fails the dtype check). A torch bfloat16 tensor, which numpy has no dtype for, is
// viewed as its raw bits (uint16, the module's bf16), still without a copy. What numpy cannot
// take in place (a tensor on a GPU, say) is a ValueError naming the tensor.
py::array AsArray(const py::handle& obj, const std::string& name) {
  if (py::isinstance<py::array>(obj)) return py::reinterpret_borrow<py::array>(obj);
  py::module_ numpy = py::module_::import("numpy");
  try {
    const std::string type_module = py::str(py::type::of(obj).attr("__module__"));
    if (type_module.rfind("torch", 0) == 0 && py::hasattr(obj, "dtype") &&
        py::str(obj.attr("dtype")).cast<std::string>() == "torch.bfloat16") {
      py::object bits = obj.attr("view")(py::module_::import("torch").attr("int16"));
      return numpy.attr("asarray")(bits).attr("view")("uint16");
    }
    return numpy.attr("asarray")(obj);
  } catch (py::error_already_set& e) {
    Invalid(absl::StrCat(name,
                         ": cannot be read in place as an array (a CPU tensor or a numpy "
                         "array is needed): ",
                         e.what()));
  }
}

std::string DTypeString(const py::dtype& dtype) { return py::str(dtype.attr("name")); }

// Checks `a` (named `name`) is C-contiguous of `dtype` and `shape`; InvalidArgument otherwise.
void CheckArray(const py::array& a, const std::string& name, const py::dtype& dtype,
                const std::vector<py::ssize_t>& shape, const char* dtype_hint) {
  if (!a.dtype().equal(dtype)) {
    Invalid(absl::StrCat(name, ": expected dtype ", DTypeString(dtype), " (", dtype_hint, "), got ",
                         DTypeString(a.dtype())));
  }
  bool shape_ok = a.ndim() == static_cast<py::ssize_t>(shape.size());
  for (size_t i = 0; shape_ok && i < shape.size(); ++i) shape_ok = a.shape(i) == shape[i];
  if (!shape_ok) {
    Invalid(absl::StrCat(name, ": expected shape ", ShapeString(shape), ", got ", ArrayShape(a)));
  }
  if (!(a.flags() & py::array::c_style)) {
    std::vector<py::ssize_t> strides(a.strides(), a.strides() + a.ndim());
    Invalid(absl::StrCat(name, ": expected a C-contiguous array, got strides ",
                         ShapeString(strides), " (use numpy.ascontiguousarray)"));
  }
}

const char* DTypeHint(ckv::DType dtype) {
  switch (dtype) {
    case ckv::DType::kFp16:
      return "the spec's fp16";
    case ckv::DType::kBf16:
      return "the spec's bf16, as its raw 16 bits";
    case ckv::DType::kFp32:
      return "the spec's fp32";
  }
  return "";
}

// Token ids: an int32 1-D C-contiguous array used in place, or a sequence of ints (copied).
py::array_t<int32_t> Tokens(const py::handle& obj) {
  if (py::isinstance<py::array>(obj) || py::hasattr(obj, "__array__") ||
      PyObject_CheckBuffer(obj.ptr())) {
    py::array a = AsArray(obj, "tokens");
    if (a.ndim() != 1) {
      Invalid(absl::StrCat("tokens: expected a 1-D array, got shape ", ArrayShape(a)));
    }
    CheckArray(a, "tokens", py::dtype::of<int32_t>(), {a.shape(0)}, "token ids");
    return py::reinterpret_borrow<py::array_t<int32_t>>(a);
  }
  // A Python sequence of ints: checked, then copied into a new int32 array.
  if (!py::isinstance<py::sequence>(obj) || py::isinstance<py::str>(obj) ||
      py::isinstance<py::bytes>(obj)) {
    Invalid(absl::StrCat("tokens: expected an int32 array or a sequence of token ids, got ",
                         py::str(py::type::of(obj).attr("__name__")).cast<std::string>()));
  }
  py::module_ numpy = py::module_::import("numpy");
  py::array a = numpy.attr("asarray")(obj);
  if (a.ndim() != 1) {
    Invalid(
        absl::StrCat("tokens: expected a flat sequence of token ids, got shape ", ArrayShape(a)));
  }
  if (a.size() == 0) return py::array_t<int32_t>(0);
  const std::string kind = py::str(a.dtype().attr("kind"));
  if (kind != "i" && kind != "u") {
    std::string offending;
    py::ssize_t at = 0;
    for (const py::handle item : py::reinterpret_borrow<py::sequence>(obj)) {
      if (!PyIndex_Check(item.ptr())) {
        offending = absl::StrCat(" (tokens[", at, "] = ", py::repr(item).cast<std::string>(), ")");
        break;
      }
      ++at;
    }
    Invalid(absl::StrCat("tokens: expected integer token ids, got ", DTypeString(a.dtype()),
                         offending));
  }
  const py::object lo = a.attr("min")(), hi = a.attr("max")();
  if (lo.attr("__lt__")(INT32_MIN).cast<bool>() || hi.attr("__gt__")(INT32_MAX).cast<bool>()) {
    Invalid(absl::StrCat("tokens: token ids must fit int32, got ", py::repr(lo).cast<std::string>(),
                         "..", py::repr(hi).cast<std::string>()));
  }
  return py::array_t<int32_t>(a.attr("astype")("int32"));
}

std::span<const int32_t> TokenSpan(const py::array_t<int32_t>& t) {
  return {t.data(), static_cast<size_t>(t.shape(0))};
}

// The K (or V) tensors of `name` ("k" or "v"): a sequence of spec.layers arrays [n, kv_heads,
// head_dim], or one array [layers, n, kv_heads, head_dim]. Appends the arrays to keep alive.
std::vector<std::span<const std::byte>> LayerTensors(const py::handle& obj, const char* name,
                                                     const ckv::ModelSpec& spec, py::ssize_t n,
                                                     std::vector<py::array>* keep) {
  const py::dtype dtype = DTypeOf(spec.dtype);
  const auto layers = static_cast<py::ssize_t>(spec.layers);
  const auto heads = static_cast<py::ssize_t>(spec.kv_heads);
  const auto dim = static_cast<py::ssize_t>(spec.head_dim);
  std::vector<std::span<const std::byte>> out;
  const size_t layer_bytes = static_cast<size_t>(n) * spec.TokenBytesPerLayer();
  if (py::isinstance<py::array>(obj) || py::hasattr(obj, "__array__")) {
    py::array a = AsArray(obj, name);
    CheckArray(a, name, dtype, {layers, n, heads, dim}, DTypeHint(spec.dtype));
    const auto* base = static_cast<const std::byte*>(a.data());
    for (py::ssize_t l = 0; l < layers; ++l) out.emplace_back(base + l * layer_bytes, layer_bytes);
    keep->push_back(std::move(a));
    return out;
  }
  if (!py::isinstance<py::sequence>(obj) || py::isinstance<py::str>(obj)) {
    Invalid(absl::StrCat(name, ": expected a list of ", spec.layers, " arrays [", n, ", ", heads,
                         ", ", dim, "] (one per layer) or one array [", layers, ", ", n, ", ",
                         heads, ", ", dim, "]"));
  }
  py::sequence seq = py::reinterpret_borrow<py::sequence>(obj);
  if (static_cast<py::ssize_t>(seq.size()) != layers) {
    Invalid(absl::StrCat(name, ": expected ", spec.layers, " tensors (one per layer), got ",
                         seq.size()));
  }
  for (py::ssize_t l = 0; l < layers; ++l) {
    const std::string layer_name = absl::StrCat(name, "[", l, "]");
    py::array a = AsArray(seq[l], layer_name);
    CheckArray(a, layer_name, dtype, {n, heads, dim}, DTypeHint(spec.dtype));
    out.emplace_back(static_cast<const std::byte*>(a.data()), layer_bytes);
    keep->push_back(std::move(a));
  }
  return out;
}

// A read-only-for-Python view of `bytes` at `data` as [c, kv_heads, head_dim] of the spec's dtype,
// kept alive by `base`.
py::array RecordHalf(const ckv::ModelSpec& spec, const std::byte* data, py::handle base) {
  const size_t item = ckv::DTypeBytes(spec.dtype);
  std::vector<py::ssize_t> shape = {spec.chunk_tokens, spec.kv_heads, spec.head_dim};
  std::vector<py::ssize_t> strides = {
      static_cast<py::ssize_t>(spec.kv_heads * spec.head_dim * item),
      static_cast<py::ssize_t>(spec.head_dim * item), static_cast<py::ssize_t>(item)};
  py::array a(DTypeOf(spec.dtype), shape, strides, data, base);
  return a;
}

ckv::ChunkKey KeyFromHex(const std::string& hex) { return Take(ckv::ChunkKey::FromHex(hex)); }

ckv::DType DTypeFromName(const std::string& name) { return Take(ckv::ParseDType(name)); }

// ---- dicts of the report structs ----------------------------------------------------------------

py::dict PutResultDict(const ckv::PutResult& r) {
  py::dict d;
  d["chunks"] = r.chunks;
  d["chunks_written"] = r.chunks_written;
  d["chunks_existing"] = r.chunks_existing;
  d["tail_tokens"] = r.tail_tokens;
  d["bytes_written"] = r.bytes_written;
  d["chunks_evicted"] = r.chunks_evicted;
  d["prefix_id"] = r.prefix_id.ToHex();
  return d;
}

py::dict EngineStatsDict(const ckv::EngineStats& s) {
  py::dict d;
#define CKV_FIELD(f) d[#f] = s.f
#define CKV_STORE_FIELD_(type, name, kind, scope, metric, help) CKV_FIELD(name);
  CKV_STORE_STATS_FIELDS(CKV_STORE_FIELD_)
#undef CKV_STORE_FIELD_
#define CKV_ENGINE_FIELD_(type, name, kind, scope, metric, help) CKV_FIELD(name);
  CKV_ENGINE_STATS_FIELDS(CKV_ENGINE_FIELD_)
#undef CKV_ENGINE_FIELD_
  return d;
}

py::dict SessionStatsDict(const ckv::SessionStats& s) {
  py::dict d;
  CKV_FIELD(matched_chunks);
  CKV_FIELD(layers_served);
  CKV_FIELD(records_served);
  CKV_FIELD(bytes_needed);
  CKV_FIELD(bytes_read);
  CKV_FIELD(summary_bytes_read);
  CKV_FIELD(summary_cache_hits);
  CKV_FIELD(gpu_hits);
  CKV_FIELD(cpu_hits);
  CKV_FIELD(nvme_records);
  CKV_FIELD(prefetched_bytes_used);
  CKV_FIELD(prefetched_bytes_wasted);
  CKV_FIELD(await_blocked_seconds);
  CKV_FIELD(device_idle_seconds);
  CKV_FIELD(remote_chunks);
  CKV_FIELD(remote_records);
  CKV_FIELD(remote_bytes_read);
  CKV_FIELD(unestimated_chunks);
  CKV_FIELD(virtual_tokens_served);
#undef CKV_FIELD
  d["read_amplification"] = s.read_amplification();
  return d;
}

// ---- engine, sessions, views --------------------------------------------------------------------

// Runs `drop` with the GIL released when this thread holds it (a collection from Python) and the
// interpreter is not shutting down: an engine's destructor joins its threads and a session's waits
// for its queued reads (remote fetches up to their deadline), which must not stall other Python
// threads.
template <typename Fn>
void WithoutGil(Fn&& drop) {
#if PY_VERSION_HEX >= 0x030D0000
  const bool finalizing = Py_IsFinalizing();
#else
  const bool finalizing = _Py_IsFinalizing();
#endif
  if (PyGILState_Check() && !finalizing) {
    py::gil_scoped_release release;
    drop();
  } else {
    drop();
  }
}

struct PyEngine {
  ~PyEngine() { Close(); }
  std::shared_ptr<ckv::Engine> engine;
  bool read_only = false;
  bool gpu_tier_on_device = false;  // GPU-tier records are device pointers

  // Closes this handle's engine now, its live sessions too (Engine::Close: the store is
  // released at once); later calls raise FailedPreconditionError. The pointer is taken out with the
  // GIL held, so no other Python thread sees it half-reset; the engine closes without it.
  void Close() {
    std::shared_ptr<ckv::Engine> closing = std::move(engine);
    // Sessions hold the engine (a shared_ptr), so dropping this reference alone left the store
    // open, and locked, while one lived. Engine::Close ends them and releases the store now.
    WithoutGil([&closing] {
      if (closing != nullptr) closing->Close().IgnoreError();  // always OK (ckv/engine.h)
      closing.reset();
    });
  }

  std::shared_ptr<ckv::Engine> Get() const {
    if (!engine) throw StatusError{absl::FailedPreconditionError("the engine is closed")};
    return engine;
  }
};

struct PySession {
  ~PySession() {
    WithoutGil([this] {
      session.reset();
      engine.reset();
    });
  }
  std::shared_ptr<ckv::Engine> engine;  // outlives the session
  std::unique_ptr<ckv::ReprefillSession> session;
  ckv::ModelSpec spec;
  bool gpu_tier_on_device = false;
  bool full_budget = false;     // budget 1, no target mass: layers may go without queries
  uint32_t window = 0;          // queries per layer
  std::vector<bool> submitted;  // per layer: submit_queries was called (by the caller or for it)
};

// Whether the C++ session took the layer as submitted: it does for every call past its
// argument checks (InvalidArgument), failed or not, so await_layer must not submit it again but
// return what AwaitLayer says (the layer's own error, e.g. a period head's DataLoss).
void MarkSubmitted(PySession& s, uint32_t layer, const absl::Status& status) {
  if (layer < s.submitted.size() && status.code() != absl::StatusCode::kInvalidArgument) {
    s.submitted[layer] = true;
  }
}

// SubmitQueries with no queries (a full-budget session selects every chunk), GIL released.
absl::Status SubmitNoQueries(PySession& s, uint32_t layer) {
  absl::Status status;
  {
    py::gil_scoped_release release;
    status = s.session->SubmitQueries(layer, {});
  }
  MarkSubmitted(s, layer, status);
  return status;
}

// A LayerView and what it needs alive: the numpy arrays over its records hold a reference to it.
struct PyLayerView {
  std::shared_ptr<PySession> session;
  ckv::LayerView view;
};

struct PyRecord {
  uint32_t chunk = 0;
  uint32_t first_token = 0;
  std::string tier;
  std::string found_in;
  bool copied = false;  // a GPU-tier record copied to host memory, or a codec's record decoded
  py::object k;
  py::object v;
};

struct PyLayer {
  uint32_t layer = 0;
  std::vector<PyRecord> records;
  py::object virtual_tokens;  // a dict of numpy arrays, or None
};

// A view's virtual tokens (ckv/virtual_tokens.h) as numpy arrays of their own (copies: a few
// floats per chunk not loaded), or None when the view has none.
py::object VirtualTokensDict(const ckv::ModelSpec& spec, const ckv::VirtualTokens& vt) {
  if (vt.count == 0) return py::none();
  const auto n = static_cast<py::ssize_t>(vt.count);
  const auto kv = static_cast<py::ssize_t>(spec.kv_heads);
  const auto d = static_cast<py::ssize_t>(spec.head_dim);
  py::array_t<uint32_t> chunks(n);
  std::copy(vt.chunks.begin(), vt.chunks.end(), chunks.mutable_data());
  py::array_t<float> keys({n, kv, d}), values({n, kv, d});
  py::array_t<float> bias({n, static_cast<py::ssize_t>(spec.q_heads)});
  std::copy(vt.keys.begin(), vt.keys.end(), keys.mutable_data());
  std::copy(vt.values.begin(), vt.values.end(), values.mutable_data());
  std::copy(vt.bias.begin(), vt.bias.end(), bias.mutable_data());
  py::dict out;
  out["chunks"] = chunks;
  out["keys"] = keys;
  out["values"] = values;
  out["bias"] = bias;
  return out;
}

const char* TierName(ckv::LayerView::Tier tier) {
  switch (tier) {
    case ckv::LayerView::Tier::kGpu:
      return "gpu";
    case ckv::LayerView::Tier::kCpu:
      return "cpu";
    case ckv::LayerView::Tier::kSession:
      return "session";
  }
  return "?";
}

std::shared_ptr<PyEngine> OpenEngine(const std::string& path,
                                     std::optional<uint64_t> max_disk_bytes,
                                     uint64_t gpu_tier_bytes, uint64_t cpu_tier_bytes,
                                     bool create_if_missing, bool error_if_exists, bool read_only,
                                     const ckv::RemoteTierOptions& remote = {}) {
  ckv::EngineOptions options;
  options.remote = remote;
  options.create_if_missing = create_if_missing;
  options.error_if_exists = error_if_exists;
  options.max_disk_bytes = max_disk_bytes;
  options.gpu_tier_bytes = gpu_tier_bytes;
  options.cpu_tier_bytes = cpu_tier_bytes;
  auto out = std::make_shared<PyEngine>();
  out->read_only = read_only;
  absl::StatusOr<std::unique_ptr<ckv::Engine>> engine;
  std::string metrics;
  {
    py::gil_scoped_release release;
    engine =
        read_only ? ckv::Engine::OpenReadOnly(options, path) : ckv::Engine::Open(options, path);
    // Whether the GPU tier holds device memory: Metrics() says so (ckv_gpu_tier_on_device).
    if (engine.ok() && gpu_tier_bytes > 0) metrics = (*engine)->Metrics();
  }
  out->engine = Take(std::move(engine));
  out->gpu_tier_on_device = metrics.find("\nckv_gpu_tier_on_device 1") != std::string::npos;
  return out;
}

}  // namespace

PYBIND11_MODULE(ckv, m) {
  m.doc() =
      "ckv: a KV-cache storage engine. Store a prefix's K/V (put), find how much of a prompt is "
      "stored (lookup), read records back (read_record), and serve Re-Prefill sessions "
      "(begin_reprefill). See docs/python.md.";

  py::exec(kErrorClasses, m.attr("__dict__"));
  g_module_dict = m.attr("__dict__").ptr();
  Py_INCREF(g_module_dict);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      RaiseStatus(e.status);
    }
  });

  // ---- ModelSpec --------------------------------------------------------------------------------
  py::class_<ckv::ModelSpec>(m, "ModelSpec",
                             "The shape of a model's KV cache and the identity that binds data "
                             "to it (ckv/model_spec.h).")
      .def(py::init([](uint32_t layers, uint32_t q_heads, uint32_t kv_heads, uint32_t head_dim,
                       const std::string& dtype, uint32_t chunk_tokens, const std::string& model_id,
                       const std::string& codec) {
             ckv::ModelSpec spec;
             spec.layers = layers;
             spec.q_heads = q_heads;
             spec.kv_heads = kv_heads;
             spec.head_dim = head_dim;
             spec.dtype = DTypeFromName(dtype);
             spec.chunk_tokens = chunk_tokens;
             spec.model_id = model_id;
             spec.codec = Take(ckv::ParseKvCodec(codec));
             Check(spec.Validate());
             return spec;
           }),
           py::kw_only(), py::arg("layers"), py::arg("q_heads"), py::arg("kv_heads"),
           py::arg("head_dim"), py::arg("dtype") = "fp16", py::arg("chunk_tokens") = 16,
           py::arg("model_id"), py::arg("codec") = "none",
           "A spec from its fields (model_id: the weights' identity, not empty; codec: how "
           "records are stored, 'none', 'fp8', 'int8' or 'int4'); InvalidArgumentError naming "
           "a field out of range.")
      .def_static(
          "preset",
          [](const std::string& name, const std::string& dtype, uint32_t chunk_tokens,
             const std::string& codec) {
            ckv::ModelSpec spec =
                Take(ckv::ModelSpec::Preset(name, DTypeFromName(dtype), chunk_tokens));
            spec.codec = Take(ckv::ParseKvCodec(codec));
            return spec;
          },
          py::arg("name"), py::arg("dtype") = "fp16", py::arg("chunk_tokens") = 16,
          py::arg("codec") = "none",
          "A named preset (ModelSpec.preset_names()); model_id is the preset's name.")
      .def_static("preset_names", &ckv::ModelSpec::PresetNames, "The names preset() takes.")
      .def_readonly("model_id", &ckv::ModelSpec::model_id, "Caller-given identity of the weights.")
      .def_readonly("layers", &ckv::ModelSpec::layers, "Transformer layers.")
      .def_readonly("q_heads", &ckv::ModelSpec::q_heads, "Query heads per layer.")
      .def_readonly("kv_heads", &ckv::ModelSpec::kv_heads, "KV heads per layer.")
      .def_readonly("head_dim", &ckv::ModelSpec::head_dim, "Channels per head.")
      .def_readonly("chunk_tokens", &ckv::ModelSpec::chunk_tokens, "Tokens per chunk, c.")
      .def_property_readonly(
          "dtype", [](const ckv::ModelSpec& s) { return std::string(ckv::DTypeName(s.dtype)); },
          "Element type: 'fp16', 'bf16' or 'fp32'.")
      .def_property_readonly(
          "codec", [](const ckv::ModelSpec& s) { return std::string(ckv::KvCodecName(s.codec)); },
          "How records are stored: 'none' (the dtype), 'fp8', 'int8' or 'int4' (ckv/codec.h). "
          "Views and read_record hand out records decoded to the dtype.")
      .def_property_readonly(
          "numpy_dtype", [](const ckv::ModelSpec& s) { return DTypeOf(s.dtype); },
          "The numpy dtype of K/V arrays: float16 (fp16), uint16 (bf16's raw bits), float32.")
      .def_property_readonly("record_bytes", &ckv::ModelSpec::RecordBytes,
                             "Bytes of one record: K then V of one chunk at one layer.")
      .def_property_readonly(
          "fingerprint", [](const ckv::ModelSpec& s) { return s.Fingerprint().ToHex(); },
          "The spec's 128-bit fingerprint as 32 hex digits.")
      .def("__eq__", [](const ckv::ModelSpec& a, const ckv::ModelSpec& b) { return a == b; })
      .def("__repr__", [](const ckv::ModelSpec& s) {
        return absl::StrCat("ckv.ModelSpec(", s.DebugString(), ", model_id='", s.model_id, "')");
      });

  m.def(
      "chunk_keys",
      [](const ckv::ModelSpec& spec, const py::object& tokens) {
        Check(spec.Validate());
        py::array_t<int32_t> t = Tokens(tokens);
        std::vector<std::string> out;
        for (const ckv::ChunkKey& k :
             ckv::ChainChunkKeys(spec.Fingerprint(), spec.chunk_tokens, TokenSpan(t))) {
          out.push_back(k.ToHex());
        }
        return out;
      },
      py::arg("spec"), py::arg("tokens"),
      "The keys (32 hex digits each) of the whole chunks of `tokens` under `spec`, first to "
      "last; a shorter tail has none. The last is the prefix id put() reports.");

  // ---- LayerView --------------------------------------------------------------------------------
  py::class_<PyRecord>(m, "LayerRecord", "One selected chunk of a LayerView.")
      .def_readonly("chunk", &PyRecord::chunk, "Index of the chunk in the prefix (0 = first).")
      .def_readonly("first_token", &PyRecord::first_token,
                    "Position of its first token: chunk * chunk_tokens.")
      .def_readonly("k", &PyRecord::k,
                    "K [chunk_tokens, kv_heads, head_dim], read-only, over the pinned record "
                    "(no copy).")
      .def_readonly("v", &PyRecord::v, "V, as k.")
      .def_readonly("tier", &PyRecord::tier, "Where the record is: 'gpu', 'cpu' or 'session'.")
      .def_readonly("copied", &PyRecord::copied,
                    "True when k and v are a host copy of a record in GPU device memory, or "
                    "the record decoded (a spec with a codec); False when they are views of "
                    "the pinned record itself.")
      .def_readonly("found_in", &PyRecord::found_in,
                    "Where the session found it: 'gpu', 'cpu', or 'session' (read from NVMe).")
      .def("__repr__", [](const PyRecord& r) {
        return absl::StrCat("ckv.LayerRecord(chunk=", r.chunk, ", first_token=", r.first_token,
                            ", tier='", r.tier, "')");
      });

  py::class_<PyLayer>(m, "LayerView",
                      "The selected chunks of one layer (await_layer). Their records stay pinned "
                      "while this view or any of its arrays is alive.")
      .def_readonly("layer", &PyLayer::layer, "The layer.")
      .def_readonly("records", &PyLayer::records, "The selected chunks, in prefix order.")
      .def_readonly("virtual_tokens", &PyLayer::virtual_tokens,
                    "With estimate_rest: the matched chunks not loaded, as virtual tokens for "
                    "the layer's attention (ckv/virtual_tokens.h): a dict of numpy arrays, "
                    "chunks uint32 [n], keys and values float32 [n, kv_heads, head_dim], bias "
                    "float32 [n, q_heads] (q head g's logit for token j is q . keys[j, g // "
                    "(q_heads // kv_heads)] / sqrt(head_dim) + bias[j, g]). None otherwise.")
      .def("__len__", [](const PyLayer& l) { return l.records.size(); })
      .def(
          "__iter__",
          [](const PyLayer& l) { return py::make_iterator(l.records.begin(), l.records.end()); },
          py::keep_alive<0, 1>())
      .def("__getitem__", [](const PyLayer& l, size_t i) {
        if (i >= l.records.size()) throw py::index_error("LayerView index out of range");
        return l.records[i];
      });

  // ---- Session ----------------------------------------------------------------------------------
  py::class_<PySession, std::shared_ptr<PySession>>(
      m, "ReprefillSession",
      "A Re-Prefill session (ckv/session.h): submit_queries and await_layer per layer, in order, "
      "then finish(). Driven by one thread at a time.")
      .def_property_readonly(
          "matched_chunks", [](const PySession& s) { return s.session->matched_chunks(); },
          "Leading whole chunks of the prompt that are stored.")
      .def(
          "submit_queries",
          [](PySession& s, uint32_t layer, const py::object& queries) {
            if (queries.is_none()) {
              Check(SubmitNoQueries(s, layer));
              return;
            }
            const auto q_heads = static_cast<py::ssize_t>(s.spec.q_heads);
            const auto dim = static_cast<py::ssize_t>(s.spec.head_dim);
            py::array a = AsArray(queries, "queries");
            if (a.ndim() != 3) {
              Invalid(absl::StrCat("queries: expected shape [window, ", q_heads, ", ", dim,
                                   "], got ", ArrayShape(a)));
            }
            if (a.shape(0) == 0) {
              Invalid(
                  absl::StrCat("queries: an array of 0 rows; pass None to submit no queries "
                               "(a session at budget_fraction 1 only), or [",
                               s.window, ", ", q_heads, ", ", dim, "] (the session's window)"));
            }
            CheckArray(a, "queries", py::dtype::of<float>(),
                       {static_cast<py::ssize_t>(s.window), q_heads, dim},
                       "float32 queries of the session's window");
            std::span<const float> span(static_cast<const float*>(a.data()),
                                        static_cast<size_t>(a.size()));
            absl::Status status;
            {
              py::gil_scoped_release release;
              status = s.session->SubmitQueries(layer, span);
            }
            MarkSubmitted(s, layer, status);
            Check(status);
          },
          py::arg("layer"), py::arg("queries") = py::none(),
          "Hands over layer `layer`'s suffix queries: float32 [window, q_heads, head_dim], "
          "C-contiguous (read during the call only). Starts the layer's selection and reads. "
          "None (only at budget_fraction 1): every matched chunk, with no scoring.")
      .def(
          "await_layer",
          [](const std::shared_ptr<PySession>& s, uint32_t layer) {
            // At a full budget a layer needs no queries: submit none for the caller.
            if (s->full_budget && layer < s->submitted.size() && !s->submitted[layer]) {
              Check(SubmitNoQueries(*s, layer));
            }
            absl::StatusOr<ckv::LayerView> view;
            {
              py::gil_scoped_release release;
              view = s->session->AwaitLayer(layer);
            }
            auto holder = std::make_shared<PyLayerView>();
            holder->session = s;
            holder->view = Take(std::move(view));
            PyLayer out;
            out.layer = holder->view.layer();
            out.virtual_tokens = VirtualTokensDict(s->spec, holder->view.virtual_tokens());
            // Records in the GPU tier's device memory cannot be numpy arrays: they are copied to
            // host arrays of their own (the only copy await_layer makes).
            std::vector<py::object> host_copies(holder->view.records().size());  // null: a view
            if (s->gpu_tier_on_device) {
              const size_t bytes = s->spec.RecordBytes();
              for (size_t i = 0; i < holder->view.records().size(); ++i) {
                const auto& r = holder->view.records()[i];
                if (r.tier != ckv::LayerView::Tier::kGpu) continue;
#ifdef CKV_PYTHON_HAVE_CUDA
                py::array_t<uint8_t> copy(static_cast<py::ssize_t>(bytes));
                void* dst = copy.mutable_data();
                cudaError_t err;
                {
                  py::gil_scoped_release release;
                  err = cudaMemcpy(dst, r.data, bytes, cudaMemcpyDefault);
                }
                if (err != cudaSuccess) {
                  throw StatusError{absl::InternalError(absl::StrCat(
                      "layer ", layer, ", chunk ", r.chunk,
                      ": copying the record from the GPU tier: ", cudaGetErrorString(err)))};
                }
                host_copies[i] = std::move(copy);
#else
                (void)bytes;
                throw StatusError{absl::UnimplementedError(absl::StrCat(
                    "layer ", layer, ", chunk ", r.chunk,
                    ": the record is in the GPU tier's device memory and this module was built "
                    "without CUDA; open the engine with gpu_tier_bytes=0"))};
#endif
              }
            }
            // One capsule owns a reference to the view; every array's base is that capsule.
            py::capsule base(new std::shared_ptr<PyLayerView>(holder),
                             [](void* p) { delete static_cast<std::shared_ptr<PyLayerView>*>(p); });
            const size_t half = s->spec.DecodedRecordBytes() / 2;
            for (size_t i = 0; i < holder->view.records().size(); ++i) {
              const auto& r = holder->view.records()[i];
              PyRecord rec;
              rec.chunk = r.chunk;
              rec.first_token = r.first_token;
              rec.tier = TierName(r.tier);
              rec.found_in = TierName(r.found_in);
              rec.copied = static_cast<bool>(host_copies[i]);
              py::handle owner = rec.copied ? py::handle(host_copies[i]) : py::handle(base);
              const std::byte* data = r.data;
              if (rec.copied) {
                data = static_cast<const std::byte*>(host_copies[i].cast<py::array>().data());
              }
              if (s->spec.codec != ckv::KvCodec::kNone) {
                // Stored encoded: decoded into an array of its own (ckv/codec.h).
                py::array_t<uint8_t> decoded(
                    static_cast<py::ssize_t>(s->spec.DecodedRecordBytes()));
                auto* out_bytes = reinterpret_cast<std::byte*>(decoded.mutable_data());
                Check(ckv::DecodeRecord(s->spec, {data, s->spec.RecordBytes()},
                                        {out_bytes, s->spec.DecodedRecordBytes()}));
                host_copies[i] = std::move(decoded);
                rec.copied = true;
                owner = py::handle(host_copies[i]);
                data = out_bytes;
              }
              py::array k = RecordHalf(s->spec, data, owner);
              py::array v = RecordHalf(s->spec, data + half, owner);
              k.attr("setflags")(py::arg("write") = false);  // the tier's bytes are shared
              v.attr("setflags")(py::arg("write") = false);
              rec.k = std::move(k);
              rec.v = std::move(v);
              out.records.push_back(std::move(rec));
            }
            return out;
          },
          py::arg("layer"),
          "Waits until every selected record of `layer` is readable and returns a LayerView: "
          "(at budget_fraction 1 it first submits no queries for a layer that has none) "
          "per chunk its index, first token and read-only numpy arrays k and v over the pinned "
          "record (no copy); a record in GPU device memory is copied to host arrays "
          "(LayerRecord.copied).")
      .def(
          "finish",
          [](PySession& s) {
            absl::StatusOr<ckv::SessionStats> stats;
            {
              py::gil_scoped_release release;
              stats = s.session->Finish();
            }
            return SessionStatsDict(Take(std::move(stats)));
          },
          "Ends the session (adds its attention to I and its loads to F) and returns its "
          "SessionStats as a dict. Views may outlive it. Twice returns the same figures.");

  // ---- Engine -----------------------------------------------------------------------------------
  py::class_<PyEngine, std::shared_ptr<PyEngine>>(
      m, "Engine",
      "A ckv store, opened (ckv/engine.h). Thread-safe; blocking calls release the GIL.")
      .def_static(
          "open",
          [](const std::string& path, std::optional<uint64_t> max_disk_bytes,
             uint64_t gpu_tier_bytes, uint64_t cpu_tier_bytes, bool create_if_missing,
             bool error_if_exists, std::optional<std::string> remote,
             const std::string& remote_key_prefix, uint32_t remote_call_timeout_ms,
             uint32_t remote_connect_timeout_ms) {
            ckv::RemoteTierOptions r;
            if (remote.has_value()) r.seeds = {*remote};
            r.key_prefix = remote_key_prefix;
            r.call_timeout_ms = remote_call_timeout_ms;
            r.connect_timeout_ms = remote_connect_timeout_ms;
            return OpenEngine(path, max_disk_bytes, gpu_tier_bytes, cpu_tier_bytes,
                              create_if_missing, error_if_exists, /*read_only=*/false, r);
          },
          py::arg("path"), py::kw_only(), py::arg("max_disk_bytes") = py::none(),
          py::arg("gpu_tier_bytes") = 0, py::arg("cpu_tier_bytes") = 0,
          py::arg("create_if_missing") = true, py::arg("error_if_exists") = false,
          py::arg("remote") = py::none(), py::arg("remote_key_prefix") = "ckv",
          py::arg("remote_call_timeout_ms") = 500, py::arg("remote_connect_timeout_ms") = 200,
          "Opens (or creates) the store in directory `path`. max_disk_bytes: None keeps the "
          "store's persisted cap (0, unlimited, for a new store); a number sets and persists it. "
          "NotFoundError when missing and create_if_missing is False. remote: "
          "'host:port[,host:port...]', any nodes of a Redis Cluster to share chunks through "
          "(docs/remote.md), with remote_key_prefix and the timeouts in milliseconds; "
          "ValueError for a bad endpoint or timeout.")
      .def_static(
          "open_read_only",
          [](const std::string& path) {
            return OpenEngine(path, std::nullopt, 0, 0, false, false, /*read_only=*/true);
          },
          py::arg("path"),
          "Opens the store in `path` read-only, beside a writer in another process; sees the "
          "store as of the open or the last catch_up(). Writes raise FailedPreconditionError.")
      .def_property_readonly(
          "read_only", [](const PyEngine& e) { return e.read_only; },
          "Whether the engine was opened with open_read_only.")
      .def(
          "close", [](PyEngine& e) { e.Close(); },
          "Closes the engine now, even while sessions live (their later calls raise "
          "FailedPreconditionError): the store can be opened again at once. Later calls on the "
          "engine raise FailedPreconditionError.")
      .def("__enter__", [](const std::shared_ptr<PyEngine>& e) { return e; })
      .def("__exit__",
           [](PyEngine& e, const py::object&, const py::object&, const py::object&) { e.Close(); })
      .def(
          "catch_up",
          [](PyEngine& e) {
            auto engine = e.Get();
            absl::Status status;
            {
              py::gil_scoped_release release;
              status = engine->CatchUp();
            }
            Check(status);
          },
          "A read-only engine takes a new view of the store; a writing engine: nothing to do.")
      .def(
          "put",
          [](PyEngine& e, const ckv::ModelSpec& spec, const py::object& tokens, const py::object& k,
             const py::object& v) {
            auto engine = e.Get();
            Check(spec.Validate());
            py::array_t<int32_t> t = Tokens(tokens);
            std::vector<py::array> keep;
            ckv::KvTensors kv;
            kv.tokens = static_cast<size_t>(t.shape(0));
            kv.k = LayerTensors(k, "k", spec, t.shape(0), &keep);
            kv.v = LayerTensors(v, "v", spec, t.shape(0), &keep);
            absl::StatusOr<ckv::PutResult> result;
            {
              py::gil_scoped_release release;
              result = engine->Put(spec, TokenSpan(t), kv);
            }
            return PutResultDict(Take(std::move(result)));
          },
          py::arg("spec"), py::arg("tokens"), py::arg("k"), py::arg("v"),
          "Stores the whole chunks of the prefix `tokens` (int32 [n]) with its K and V: each a "
          "list of spec.layers arrays [n, kv_heads, head_dim] or one array [layers, n, kv_heads, "
          "head_dim], C-contiguous, dtype spec.numpy_dtype; read in place (no copy). Returns a "
          "dict of PutResult (prefix_id as hex).")
      .def(
          "lookup",
          [](PyEngine& e, const ckv::ModelSpec& spec, const py::object& tokens) {
            auto engine = e.Get();
            py::array_t<int32_t> t = Tokens(tokens);
            absl::StatusOr<uint64_t> n;
            {
              py::gil_scoped_release release;
              n = engine->Lookup(spec, TokenSpan(t));
            }
            return Take(std::move(n));
          },
          py::arg("spec"), py::arg("tokens"),
          "The number of leading whole chunks of `tokens` stored under `spec`. With a remote "
          "tier, a local miss first fetches the rest of the chain from the cluster and stores "
          "it here; probe() does not.")
      .def(
          "probe",
          [](PyEngine& e, const ckv::ModelSpec& spec, const py::object& tokens) {
            auto engine = e.Get();
            py::array_t<int32_t> t = Tokens(tokens);
            absl::StatusOr<ckv::PrefixExtent> extent;
            {
              py::gil_scoped_release release;
              extent = engine->Probe(spec, TokenSpan(t));
            }
            const ckv::PrefixExtent x = Take(std::move(extent));
            py::dict d;
            d["local_chunks"] = x.local_chunks;
            d["remote_chunks"] = x.remote_chunks;
            d["chunks"] = x.chunks();
            return d;
          },
          py::arg("spec"), py::arg("tokens"),
          "How much of `tokens` could be served, changing nothing: {'local_chunks', "
          "'remote_chunks', 'chunks'}, the leading whole chunks stored here and how far the "
          "chain continues in the remote tier (existence only; nothing fetched). What a "
          "scheduler asks before admitting a request.")
      .def(
          "read_record",
          [](PyEngine& e, const ckv::ModelSpec& spec, const std::string& key, uint32_t layer) {
            auto engine = e.Get();
            Check(spec.Validate());
            const ckv::ChunkKey chunk = KeyFromHex(key);
            py::array_t<uint8_t> buffer(static_cast<py::ssize_t>(spec.RecordBytes()));
            auto* data = reinterpret_cast<std::byte*>(buffer.mutable_data());
            absl::Status status;
            {
              py::gil_scoped_release release;
              status = engine->ReadRecord(spec, chunk, layer, {data, spec.RecordBytes()});
            }
            Check(status);
            if (spec.codec != ckv::KvCodec::kNone) {
              py::array_t<uint8_t> decoded(static_cast<py::ssize_t>(spec.DecodedRecordBytes()));
              auto* out_bytes = reinterpret_cast<std::byte*>(decoded.mutable_data());
              Check(ckv::DecodeRecord(spec, {data, spec.RecordBytes()},
                                      {out_bytes, spec.DecodedRecordBytes()}));
              buffer = std::move(decoded);
              data = out_bytes;
            }
            const size_t half = spec.DecodedRecordBytes() / 2;
            py::array k = RecordHalf(spec, data, buffer);
            py::array v = RecordHalf(spec, data + half, buffer);
            return py::make_tuple(k, v);
          },
          py::arg("spec"), py::arg("key"), py::arg("layer"),
          "Reads the record of chunk `key` (hex, from chunk_keys) at `layer`, checksum verified. "
          "Returns (k, v), arrays [chunk_tokens, kv_heads, head_dim] over one new buffer.")
      .def(
          "delete",
          [](PyEngine& e, const ckv::ModelSpec& spec, const py::object& tokens) {
            auto engine = e.Get();
            py::array_t<int32_t> t = Tokens(tokens);
            absl::Status status;
            {
              py::gil_scoped_release release;
              status = engine->Delete(spec, TokenSpan(t));
            }
            Check(status);
          },
          py::arg("spec"), py::arg("tokens"),
          "Drops the stored prefix `tokens` (a whole number of chunks). NotFoundError when no "
          "such prefix is stored.")
      .def(
          "delete_prefix",
          [](PyEngine& e, const std::string& prefix_id) {
            auto engine = e.Get();
            const ckv::ChunkKey id = KeyFromHex(prefix_id);
            absl::Status status;
            {
              py::gil_scoped_release release;
              status = engine->DeletePrefix(id);
            }
            Check(status);
          },
          py::arg("prefix_id"), "Drops the prefix whose id (hex) list_prefixes() reports.")
      .def(
          "list_prefixes",
          [](PyEngine& e) {
            auto engine = e.Get();
            std::vector<ckv::PrefixInfo> prefixes;
            {
              py::gil_scoped_release release;
              prefixes = engine->ListPrefixes();
            }
            py::list out;
            for (const auto& p : prefixes) {
              py::dict d;
              d["id"] = p.id.ToHex();
              d["model_id"] = p.model_id;
              d["model_fingerprint"] = p.model_fingerprint.ToHex();
              d["chunks"] = p.chunks;
              d["tokens"] = p.tokens;
              d["bytes"] = p.bytes;
              d["created_unix_ms"] = p.created_unix_ms;
              out.append(d);
            }
            return out;
          },
          "The stored prefixes, newest first, as dicts (id, model_id, chunks, tokens, ...).")
      .def(
          "verify",
          [](PyEngine& e) {
            auto engine = e.Get();
            absl::StatusOr<ckv::VerifyReport> report;
            {
              py::gil_scoped_release release;
              report = engine->Verify();
            }
            ckv::VerifyReport r = Take(std::move(report));
            py::dict d;
            d["ok"] = r.ok();
            d["chunks_checked"] = r.chunks_checked;
            d["records_checked"] = r.records_checked;
            d["bytes_checked"] = r.bytes_checked;
            d["checksum_failures"] = r.checksum_failures;
            py::list problems;
            for (const ckv::VerifyProblem& p : r.problems) {
              py::dict problem;
              problem["kind"] = ckv::VerifyProblemKindName(p.kind);
              problem["chunk"] =
                  p.chunk.IsZero() ? py::object(py::none()) : py::object(py::str(p.chunk.ToHex()));
              problem["layer"] = p.layer == ckv::VerifyProblem::kNoLayer
                                     ? py::object(py::none())
                                     : py::object(py::int_(p.layer));
              problem["message"] = p.message;
              problems.append(problem);
            }
            d["problems"] = problems;
            return d;
          },
          "Reads every record and checks its checksum and the catalog's chains; returns a dict "
          "(ok, chunks_checked, records_checked, bytes_checked, checksum_failures, problems: a "
          "list of dicts with kind ('checksum', 'unreadable', 'damaged', 'inconsistent'), chunk "
          "(hex, or None), layer (or None) and message).")
      .def(
          "begin_reprefill",
          [](PyEngine& e, const ckv::ModelSpec& spec, const py::object& tokens,
             const std::string& selector, double budget_fraction, uint32_t window,
             uint32_t period_layers, bool period_selection, uint32_t sink_chunks,
             uint32_t recent_chunks, bool prefetch, bool estimate_rest, double target_mass,
             bool rescore_layers) {
            auto engine = e.Get();
            ckv::ReprefillOptions options;
            options.selector = Take(ckv::ParseSelector(selector));
            options.budget_fraction = budget_fraction;
            options.window = window;
            options.period_layers = period_layers;
            options.period_selection = period_selection;
            options.sink_chunks = sink_chunks;
            options.recent_chunks = recent_chunks;
            options.prefetch = prefetch;
            options.estimate_rest = estimate_rest;
            options.target_mass = target_mass;
            options.rescore_layers = rescore_layers;
            py::array_t<int32_t> t = Tokens(tokens);
            absl::StatusOr<std::unique_ptr<ckv::ReprefillSession>> session;
            {
              py::gil_scoped_release release;
              session = engine->BeginReprefill(spec, TokenSpan(t), options);
            }
            auto out = std::make_shared<PySession>();
            out->session = Take(std::move(session));
            out->engine = engine;
            out->spec = spec;
            out->gpu_tier_on_device = e.gpu_tier_on_device;
            out->full_budget = budget_fraction >= 1.0 && !(target_mass > 0);
            out->window = window;
            out->submitted.assign(spec.layers, false);
            return out;
          },
          py::arg("spec"), py::arg("tokens"), py::kw_only(), py::arg("selector") = "period-exact",
          py::arg("budget_fraction") = 0.1, py::arg("window") = 32, py::arg("period_layers") = 8,
          py::arg("period_selection") = false, py::arg("sink_chunks") = 1,
          py::arg("recent_chunks") = 1, py::arg("prefetch") = true,
          py::arg("estimate_rest") = false, py::arg("target_mass") = 0.0,
          py::arg("rescore_layers") = false,
          "Starts a Re-Prefill of the stored leading chunks of `tokens`. selector: "
          "'period-exact', 'quest', 'mean-key', 'outlier-key' or 'oracle'; the options are "
          "ReprefillOptions'.")
      .def(
          "stats",
          [](PyEngine& e) {
            auto engine = e.Get();
            ckv::EngineStats stats;
            {
              py::gil_scoped_release release;
              stats = engine->Stats();
            }
            return EngineStatsDict(stats);
          },
          "The engine's EngineStats as a dict.")
      .def(
          "metrics",
          [](PyEngine& e) {
            auto engine = e.Get();
            std::string text;
            {
              py::gil_scoped_release release;
              text = engine->Metrics();
            }
            return text;
          },
          "The engine's figures in the Prometheus text format (docs/metrics.md).");
}
