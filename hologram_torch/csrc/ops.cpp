// Native front kernels of the hologram device's hottest aten ops (hologram_torch/native.py
// builds this file with hooks.cpp; docs/performance.md measures it).
//
// A device op's Python kernel costs ~3 µs before its kernel starts: torch's dispatch into
// Python, converting the arguments, the kernel's own lookups and a new tensor made from
// Python. For an op registered here, the registered kernel is this file's `front`: it
// makes a key of the call's arguments (every tensor's device, dtype, sizes and strides;
// every other argument's value) and looks it up among the calls it has filed. A filed
// call is launched from here: the outputs' blocks from the device's pool, the program's
// launcher (hologram._native.Launcher) called on the operands' addresses, the tensors
// made in C++. Any other call runs the op's Python kernel, as torch would; when that
// kernel launched one program whose outputs are its results (hologram_torch/aten/
// program.py's `remember` and `file_front`; some outputs may be arguments written in
// place), it files the call through `hologram_torch_fast_file`, with the checks of its
// index arguments it made, and the same key is served here from then on. Nothing is
// cached but which program a signature runs: every call launches it on its own operands
// into its own outputs.
//
// The key holds everything the Python kernel's decision depended on, so a filed call is
// valid for every call with that key; except for in-place calls, whose written tensor may
// overlap another operand in a way the key cannot show (addresses differ per call): those
// overlaps are checked per call and sent to the Python kernel, which runs PyTorch's CPU
// kernel on them. Every function here runs under the GIL (the pool and the launchers are
// Python objects), which also guards the tables.

#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/_unsafe_view_native.h>
#include <ATen/ops/alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_native.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/util/SmallVector.h>
#include <c10/core/StorageImpl.h>
#include <c10/core/TensorImpl.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Storage.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/library.h>

#include "native_api.h"  // hologram/csrc: the pool's allocation and Launcher calls
#include "region.h"      // recorded execution: the pending region

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

using Key = std::vector<int64_t>;
using KeyHash = hologram_region::WordsHash;

// A fresh result's layout.
struct Fresh {
  std::vector<int64_t> sizes, strides;
  int64_t nbytes = 0;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
};

// Where a launch writes one of its outputs: an argument, in place, or a fresh result.
struct Out {
  int written = -1;  // the argument's position, or -1: fresh, of `layout`
  Fresh layout;
};

// What a filed call checks of its data before it launches (a program would read out of
// bounds): every value of the index argument `index` (int64 or int32, contiguous) is in
// [0, size) or equals the int argument `ignore` (-1: none), `size` being dimension `dim`
// of tensor argument `bound`, or the int argument `bound` itself where `dim` is -1. The
// Python kernel raises PyTorch's error for a call that fails it.
struct IndexCheck {
  int index, bound, dim, ignore;
};

// How a filed call runs. The op returns its first outputs (as many as it returns): an
// in-place op its written argument; batch norm its three fresh results, not the running
// statistics it writes after them.
struct Entry {
  PyObject* launcher = nullptr;  // strong; Py_None when there is nothing to compute
  PyObject* node = nullptr;      // strong: its launch-cache entry, which a region records
  std::vector<int> operands;     // argument positions, in the launch's order
  std::vector<Out> outs;         // in the launch's order
  std::vector<int> returned;     // per result of the op: its index in outs, -1 for None
  std::vector<IndexCheck> checks;
};

void clear_entry(Entry& entry) {
  Py_CLEAR(entry.launcher);
  Py_CLEAR(entry.node);
}

struct Op {
  c10::OperatorHandle handle;
  PyObject* kernel;  // the Python kernel (strong)
  size_t returns;    // the tensors the op returns (its kernel returns a tuple of more than 1)
  std::unordered_map<Key, Entry, KeyHash> entries;
};

// A bound on each op's filed calls: past it, the table starts again (shapes that come and
// go, such as a growing sequence length, must not grow memory without bound).
constexpr size_t kMaxEntries = 4096;

std::vector<std::unique_ptr<Op>>& ops() {
  static auto* all = new std::vector<std::unique_ptr<Op>>();  // never destroyed
  return *all;
}

PyObject* g_pool = nullptr;  // the device pool's core (strong): fresh results come from it
const HologramNativeAPI* g_api = nullptr;  // hologram._native's C API
int64_t g_hits = 0, g_misses = 0, g_filed = 0;

// The call whose Python kernel runs now on this thread (innermost first).
struct Pending {
  Op* op;
  Key key;
  const c10::IValue* args;
  size_t nargs;
  bool keyed;
  bool filed = false;
  Entry entry;
  std::vector<const c10::TensorImpl*> results;  // what the filed launch produced, all outs
  Pending* outer;
};
thread_local Pending* g_pending = nullptr;

bool make_key(const c10::IValue* args, size_t n, Key& key) {
  key.clear();
  for (size_t i = 0; i < n; ++i) {
    const c10::IValue& v = args[i];
    if (v.isTensor() && !v.toTensor().defined()) {
      key.push_back(2);  // an absent optional tensor (a convolution without bias), as None
    } else if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (t.layout() != c10::kStrided) {
        return false;
      }
      const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
      key.push_back(1);
      key.push_back(static_cast<int64_t>(t.device().type()));
      key.push_back(t.device().index());  // -1 on the CPU
      key.push_back(static_cast<int64_t>(t.scalar_type()));
      key.push_back(static_cast<int64_t>(impl->is_wrapped_number()) |
                    (static_cast<int64_t>(t.is_neg()) << 1) |
                    (static_cast<int64_t>(t.is_conj()) << 2));
      key.push_back(t.dim());
      for (int64_t s : t.sizes()) {
        key.push_back(s);
      }
      for (int64_t s : t.strides()) {
        key.push_back(s);
      }
    } else if (v.isNone()) {
      key.push_back(2);
    } else if (v.isBool()) {
      key.push_back(3);
      key.push_back(v.toBool());
    } else if (v.isInt()) {
      key.push_back(4);
      key.push_back(v.toInt());
    } else if (v.isDouble()) {
      double d = v.toDouble();
      int64_t bits;
      std::memcpy(&bits, &d, sizeof bits);
      key.push_back(5);
      key.push_back(bits);
    } else if (v.isString()) {
      const std::string& text = v.toStringRef();
      key.push_back(6);
      key.push_back(static_cast<int64_t>(text.size()));
      for (size_t at = 0; at < text.size(); at += sizeof(int64_t)) {
        int64_t word = 0;
        std::memcpy(&word, text.data() + at, std::min(sizeof word, text.size() - at));
        key.push_back(word);
      }
    } else if (v.isDevice()) {  // _to_copy's device=
      const c10::Device device = v.toDevice();
      key.push_back(7);
      key.push_back(static_cast<int64_t>(device.type()));
      key.push_back(device.index());
    } else if (v.isIntList()) {  // sizes (layer_norm's normalized_shape)
      const auto list = v.toIntList();
      key.push_back(8);
      key.push_back(static_cast<int64_t>(list.size()));
      for (int64_t x : list) {
        key.push_back(x);
      }
    } else if (v.isBoolList()) {  // output masks of backward ops
      const auto list = v.toBoolList();
      key.push_back(9);
      key.push_back(static_cast<int64_t>(list.size()));
      for (bool x : list) {
        key.push_back(x);
      }
    } else {
      return false;  // tensor lists, generators...: never filed
    }
  }
  return true;
}

// The bytes a strided tensor spans, [start, end).
std::pair<uintptr_t, uintptr_t> extent(const at::Tensor& t) {
  auto start = reinterpret_cast<uintptr_t>(t.data_ptr());
  int64_t span = 1;
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) == 0) {
      return {start, start};
    }
    span += (t.size(d) - 1) * t.stride(d);
  }
  return {start, start + static_cast<uintptr_t>(span) * t.element_size()};
}

// Does writing `out` (argument `written`) in place while reading the other tensor
// operands need the Python kernel (registry.native_or_cpu's overlap rule)? Yes when an
// operand shares memory with it other than element for element.
bool overlaps(const at::Tensor& out, int written, const c10::IValue* args,
              const Entry& entry) {
  auto [start, end] = extent(out);
  for (int pos : entry.operands) {
    if (pos == written || !args[pos].isTensor()) {
      continue;
    }
    const at::Tensor& t = args[pos].toTensor();
    if (t.is_cpu() || t.is_same(out)) {
      continue;
    }
    auto [t_start, t_end] = extent(t);
    if (t_start < end && start < t_end &&
        !(t_start == start && t.sizes() == out.sizes() && t.strides() == out.strides())) {
      return true;
    }
  }
  return false;
}

template <typename T>
bool all_in_range(const T* values, int64_t n, int64_t size, bool has_ignore, int64_t ignore) {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t v = static_cast<int64_t>(values[i]);
    if ((v < 0 || v >= size) && !(has_ignore && v == ignore)) {
      return false;
    }
  }
  return true;
}

// Does the call pass `check`? (Host memory: the front kernels serve no other.)
bool passes(const IndexCheck& check, const c10::IValue* args) {
  const at::Tensor& index = args[check.index].toTensor();
  if (!index.is_contiguous()) {
    return false;
  }
  const int64_t size = check.dim < 0 ? args[check.bound].toInt()
                                     : args[check.bound].toTensor().size(check.dim);
  const bool has_ignore = check.ignore >= 0;
  const int64_t ignore = has_ignore ? args[check.ignore].toInt() : 0;
  const int64_t n = index.numel();
  switch (index.scalar_type()) {
    case c10::ScalarType::Long:
      return all_in_range(index.const_data_ptr<int64_t>(), n, size, has_ignore, ignore);
    case c10::ScalarType::Int:
      return all_in_range(index.const_data_ptr<int32_t>(), n, size, has_ignore, ignore);
    default:
      return false;
  }
}

void release_lease(void* lease) {
  // A tensor may die after the interpreter: its block then goes with the process.
  if (lease == nullptr || !Py_IsInitialized() || _Py_IsFinalizing()) {
    return;
  }
  PyGILState_STATE state = PyGILState_Ensure();
  Py_DECREF(static_cast<PyObject*>(lease));
  PyGILState_Release(state);
}

// A fresh result of `layout` on a new pool block (owned by the result's storage); false
// (no Python error set) when the pool refuses, so that the Python kernel raises its
// OutOfMemoryError.
bool fresh(const Fresh& layout, at::Tensor& out) {
  void* data = nullptr;
  PyObject* lease = nullptr;
  if (layout.nbytes > 0) {
    lease = g_api->alloc(g_pool, layout.nbytes, &data);
    if (lease == nullptr) {
      PyErr_Clear();
      return false;
    }
  }
  c10::DataPtr ptr(data, lease, &release_lease,
                   c10::Device(c10::DeviceType::PrivateUse1, 0));
  c10::Storage storage(c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), layout.nbytes, std::move(ptr), nullptr, false));
  out = at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
      c10::scalarTypeToTypeMeta(layout.dtype));
  out.unsafeGetTensorImpl()->set_sizes_and_strides(layout.sizes, layout.strides);
  return true;
}

// Run a filed call, or record it in the pending region when recorded execution is on
// (hologram_torch/lazy.py); false when it must go to the Python kernel after all (which
// records through Python, running the region first where a hazard requires it).
bool run(const Entry& entry, const c10::IValue* args, std::vector<at::Tensor>& results) {
  if (!entry.checks.empty()) {
    // Recorded, an index may be written by a pending op: the Python kernel runs the
    // region first where it must.
    if (hologram_region::recording()) {
      return false;
    }
    for (const IndexCheck& check : entry.checks) {
      if (!passes(check, args)) {
        return false;
      }
    }
  }
  results.clear();
  results.resize(entry.outs.size());
  bool given = false;  // some output is an argument
  for (size_t i = 0; i < entry.outs.size(); ++i) {
    const Out& out = entry.outs[i];
    if (out.written >= 0) {
      given = true;
      results[i] = args[out.written].toTensor();
      if (overlaps(results[i], out.written, args, entry)) {
        return false;
      }
    } else if (!fresh(out.layout, results[i])) {
      return false;
    }
  }
  if (entry.launcher == Py_None) {  // nothing to compute
    return true;
  }
  if (hologram_region::recording()) {
    std::vector<c10::IValue> operands;  // tensors and numbers (Scalar arguments)
    operands.reserve(entry.operands.size());
    for (int pos : entry.operands) {
      operands.push_back(args[pos]);
    }
    return hologram_region::record(entry.node, operands, results, given);
  }
  // A number operand (a Scalar argument) is passed boxed, as runner.run boxes it: int64,
  // double, or a bool in the first byte (every target here is little-endian).
  c10::SmallVector<int64_t, 8> boxes(entry.operands.size(), 0);
  c10::SmallVector<void*, 8> addresses;
  for (size_t i = 0; i < entry.operands.size(); ++i) {
    const c10::IValue& v = args[entry.operands[i]];
    if (v.isTensor()) {
      addresses.push_back(v.toTensor().data_ptr());
      continue;
    }
    if (v.isDouble()) {
      const double d = v.toDouble();
      std::memcpy(&boxes[i], &d, sizeof d);
    } else {
      boxes[i] = v.isBool() ? static_cast<int64_t>(v.toBool()) : v.toInt();
    }
    addresses.push_back(&boxes[i]);
  }
  for (const at::Tensor& result : results) {
    addresses.push_back(result.data_ptr());
  }
  if (g_api->launch(entry.launcher, addresses.data(),
                    static_cast<Py_ssize_t>(addresses.size())) < 0) {
    throw pybind11::error_already_set();  // the results (and their leases) die with them
  }
  return true;
}

// The Python kernel's arguments: positional ones, and keyword-only ones by name. A dtype
// argument is a torch.dtype (the stack holds its number).
std::pair<pybind11::tuple, pybind11::dict> python_arguments(const c10::FunctionSchema& schema,
                                                            const c10::IValue* args,
                                                            size_t n) {
  std::vector<pybind11::object> positional;
  pybind11::dict keywords;
  for (size_t i = 0; i < n; ++i) {
    const c10::Argument& argument = schema.arguments()[i];
    pybind11::object value;
    c10::TypePtr type = argument.real_type();
    if (auto optional = type->cast<c10::OptionalType>()) {
      type = optional->getElementType();
    }
    if (args[i].isInt() && type->kind() == c10::TypeKind::ScalarTypeType) {
      value = pybind11::reinterpret_borrow<pybind11::object>(reinterpret_cast<PyObject*>(
          torch::getTHPDtype(static_cast<c10::ScalarType>(args[i].toInt()))));
    } else {
      value = torch::jit::toPyObject(args[i]);
    }
    if (argument.kwarg_only()) {
      keywords[pybind11::str(argument.name())] = value;
    } else {
      positional.push_back(std::move(value));
    }
  }
  pybind11::tuple tuple(positional.size());
  for (size_t i = 0; i < positional.size(); ++i) {
    tuple[i] = positional[i];
  }
  return {tuple, keywords};
}

void front(const c10::OperatorHandle& handle, c10::DispatchKeySet, torch::jit::Stack* stack) {
  Op* op = nullptr;
  for (auto& candidate : ops()) {
    if (candidate->handle == handle) {
      op = candidate.get();
      break;
    }
  }
  TORCH_INTERNAL_ASSERT(op != nullptr, "hologram: no front kernel for ", handle.schema().name());
  const size_t n = handle.schema().arguments().size();
  const c10::IValue* args = &(*stack)[stack->size() - n];
  // The key is made in this thread's scratch vector (no allocation once it has grown) and
  // copied only for a miss, whose Python kernel may run other front kernels meanwhile.
  thread_local Key scratch;
  const bool keyed = make_key(args, n, scratch);
  pybind11::gil_scoped_acquire gil;
  std::vector<at::Tensor> results;
  if (keyed) {
    auto found = op->entries.find(scratch);
    if (found != op->entries.end() && run(found->second, args, results)) {
      ++g_hits;
      torch::jit::drop(*stack, n);
      for (int out : found->second.returned) {  // (None: a masked-off gradient)
        torch::jit::push(*stack, out < 0 ? at::Tensor() : results[out]);
      }
      return;
    }
  }
  ++g_misses;
  Pending pending{op, keyed ? scratch : Key(), args, n, keyed};
  auto [positional, keywords] = python_arguments(handle.schema(), args, n);
  pending.outer = g_pending;
  g_pending = &pending;
  PyObject* got = PyObject_Call(op->kernel, positional.ptr(), keywords.ptr());
  g_pending = pending.outer;
  if (got == nullptr) {
    clear_entry(pending.entry);
    throw pybind11::error_already_set();
  }
  pybind11::object owned = pybind11::reinterpret_steal<pybind11::object>(got);
  // The returned tensors (None: an undefined tensor, as an absent gradient), one or a
  // tuple of op->returns.
  const bool single = op->returns == 1;
  results.clear();  // (a filed call the pool refused may have made some)
  if (single ? !THPVariable_Check(got)
             : !(PyTuple_Check(got) &&
                 static_cast<size_t>(PyTuple_GET_SIZE(got)) == op->returns)) {
    clear_entry(pending.entry);
    TORCH_CHECK(false, "hologram: the kernel of ", handle.schema().name(), " returned ",
                Py_TYPE(got)->tp_name, ", not ",
                single ? "a tensor" : std::to_string(op->returns) + " tensors");
  }
  for (size_t i = 0; i < op->returns; ++i) {
    PyObject* item = single ? got : PyTuple_GET_ITEM(got, i);
    if (item == Py_None) {
      results.emplace_back();
    } else if (THPVariable_Check(item)) {
      results.push_back(THPVariable_Unpack(item));
    } else {
      clear_entry(pending.entry);
      TORCH_CHECK(false, "hologram: the kernel of ", handle.schema().name(), " returned ",
                  Py_TYPE(item)->tp_name, " among its results, not a tensor");
    }
  }
  // Filed only when each result the kernel returned is one the filed launch produced
  // (or None: a gradient its mask left out).
  bool same = pending.filed;
  pending.entry.returned.clear();
  for (size_t i = 0; same && i < results.size(); ++i) {
    int out = -1;
    if (results[i].defined()) {
      const auto at = std::find(pending.results.begin(), pending.results.end(),
                                results[i].unsafeGetTensorImpl());
      same = at != pending.results.end();
      out = static_cast<int>(at - pending.results.begin());
    }
    pending.entry.returned.push_back(out);
  }
  if (same) {
    if (op->entries.size() >= kMaxEntries) {
      for (auto& [key, entry] : op->entries) {
        clear_entry(entry);
      }
      op->entries.clear();
    }
    auto [slot, inserted] = op->entries.emplace(std::move(pending.key), pending.entry);
    if (!inserted) {
      clear_entry(slot->second);
      slot->second = pending.entry;
    }
    pending.entry.launcher = nullptr;  // moved into the table
    ++g_filed;
  } else {
    clear_entry(pending.entry);
  }
  torch::jit::drop(*stack, n);
  for (at::Tensor& result : results) {
    torch::jit::push(*stack, std::move(result));
  }
}

torch::Library& library() {
  // Never destroyed: its registrations last as long as the process.
  static auto* lib = new torch::Library(torch::Library::IMPL, "aten",
                                        c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  return *lib;
}

bool same_bits(double a, double b) {
  return std::memcmp(&a, &b, sizeof a) == 0;
}

// The argument position of the Python object `obj` (an operand the Python kernel launched
// with) among the pending call's arguments: the same tensor; for a Python number a Scalar
// argument of its type and value, or the next wrapped number of its type. -1: none.
int position(const Pending& pending, PyObject* obj, std::vector<bool>& used) {
  for (size_t i = 0; i < pending.nargs; ++i) {
    const c10::IValue& v = pending.args[i];
    if (!used[i] && !v.isTensor() && !THPVariable_Check(obj)) {
      // a number the kernel launched with, the Scalar argument of the same type and
      // value (the key holds the value, so every call of it passes that value)
      const bool match =
          (PyBool_Check(obj) && v.isBool() && (obj == Py_True) == v.toBool()) ||
          (PyLong_CheckExact(obj) && v.isInt() && PyLong_AsLongLong(obj) == v.toInt()) ||
          (PyFloat_CheckExact(obj) && v.isDouble() && same_bits(PyFloat_AS_DOUBLE(obj),
                                                                 v.toDouble()));
      if (match) {
        used[i] = true;
        return static_cast<int>(i);
      }
    }
    if (used[i] || !v.isTensor()) {
      continue;
    }
    const at::Tensor& t = pending.args[i].toTensor();
    bool match;
    if (THPVariable_Check(obj)) {
      match = THPVariable_Unpack(obj).unsafeGetTensorImpl() == t.unsafeGetTensorImpl();
    } else {
      const bool wrapped = t.unsafeGetTensorImpl()->is_wrapped_number();
      const c10::ScalarType type = t.scalar_type();
      match = wrapped && ((PyBool_Check(obj) && type == c10::ScalarType::Bool) ||
                          (PyLong_CheckExact(obj) && type == c10::ScalarType::Long) ||
                          (PyFloat_CheckExact(obj) && type == c10::ScalarType::Double));
    }
    if (match) {
      used[i] = true;
      return static_cast<int>(i);
    }
  }
  return -1;
}

}  // namespace

// Register `fn` (the op's Python kernel) behind a front kernel for `name` ("add.Tensor");
// 1 on success, 0 when the op's schema returns something other than tensors (then the
// caller registers `fn` itself), -1 with a Python error set.
extern "C" __attribute__((visibility("default"))) int hologram_torch_fast_register(
    const char* name, PyObject* fn) {
  try {
    std::string full(name);
    const auto dot = full.find('.');
    const std::string base = "aten::" + full.substr(0, dot);
    const std::string overload = dot == std::string::npos ? "" : full.substr(dot + 1);
    auto handle = c10::Dispatcher::singleton().findSchemaOrThrow(base.c_str(),
                                                                  overload.c_str());
    const auto& returns = handle.schema().returns();
    if (returns.empty()) {
      return 0;
    }
    for (const c10::Argument& r : returns) {
      if (r.type()->kind() != c10::TypeKind::TensorType) {
        return 0;
      }
    }
    Py_INCREF(fn);
    ops().push_back(std::make_unique<Op>(Op{handle, fn, returns.size(), {}}));
    library().impl(full.c_str(), torch::CppFunction::makeFromBoxedFunction<&front>());
    return 1;
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return -1;
  }
}

// A metadata-only op (a view, set_) is the CPU kernel on the device tensor: it only builds
// a TensorImpl sharing the storage. Served here, the call skips Python (~2-3 us a view).
void cpu_metadata(const c10::OperatorHandle& handle, c10::DispatchKeySet,
                  torch::jit::Stack* stack) {
  handle.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
}

// The commonest views, registered unboxed: PyTorch's own CPU kernels (they build a
// TensorImpl of the input's dispatch keys on its storage), called as the CPU calls them.
// The boxed redispatch costs ~1 µs a view more than the CPU's ~0.3 (arguments to a stack
// of IValues and back), and a training step makes hundreds (a GRU's transposes).
at::Tensor view_kernel(const at::Tensor& self, c10::SymIntArrayRef size) {
  return at::native::view(self, C10_AS_INTARRAYREF_SLOW(size));
}

at::Tensor as_strided_kernel(const at::Tensor& self, c10::SymIntArrayRef size,
                             c10::SymIntArrayRef stride,
                             std::optional<c10::SymInt> storage_offset) {
  std::optional<int64_t> offset;
  if (storage_offset.has_value()) {
    offset = storage_offset->guard_int(__FILE__, __LINE__);
  }
  return at::native::as_strided_tensorimpl(self, C10_AS_INTARRAYREF_SLOW(size),
                                           C10_AS_INTARRAYREF_SLOW(stride), offset);
}

at::Tensor reshape_alias_kernel(const at::Tensor& self, c10::SymIntArrayRef size,
                                c10::SymIntArrayRef stride) {
  return at::native::_reshape_alias(self, C10_AS_INTARRAYREF_SLOW(size),
                                    C10_AS_INTARRAYREF_SLOW(stride));
}

at::Tensor unsafe_view_kernel(const at::Tensor& self, c10::SymIntArrayRef size) {
  return at::native::_unsafe_view(self, C10_AS_INTARRAYREF_SLOW(size));
}

at::Tensor alias_kernel(const at::Tensor& self) {
  return at::native::alias(self);
}

at::Tensor unfold_kernel(const at::Tensor& self, int64_t dimension, int64_t size,
                         int64_t step) {
  return at::native::unfold(self, dimension, size, step);
}

// Point `tensor` (a device tensor) at `storage`, whose device it takes (hologram:N): torch's
// Python API makes device tensors on hologram:0 only, and set_ refuses a storage of another
// device. 1, or -1 with a Python error set.
extern "C" __attribute__((visibility("default"))) int hologram_torch_place(PyObject* tensor,
                                                                          PyObject* storage) {
  try {
    TORCH_CHECK(THPVariable_Check(tensor) && THPStorage_Check(storage),
                "hologram_torch_place(tensor, storage)");
    THPVariable_Unpack(tensor).unsafeGetTensorImpl()->set_storage_keep_dtype(
        THPStorage_Unpack(storage));
    return 1;
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return -1;
  }
}

// Register `name` ("view", "set_.source_Storage") as a metadata-only op: the CPU's kernel
// itself for the commonest views, else the boxed redispatch to it; 1, or -1 with a Python
// error set.
extern "C" __attribute__((visibility("default"))) int hologram_torch_metadata_register(
    const char* name) {
  try {
    const std::string op(name);
    if (op == "view") {
      library().impl(name, TORCH_FN(view_kernel));
    } else if (op == "as_strided") {
      library().impl(name, TORCH_FN(as_strided_kernel));
    } else if (op == "_reshape_alias") {
      library().impl(name, TORCH_FN(reshape_alias_kernel));
    } else if (op == "_unsafe_view") {
      library().impl(name, TORCH_FN(unsafe_view_kernel));
    } else if (op == "alias") {
      library().impl(name, TORCH_FN(alias_kernel));
    } else if (op == "unfold") {
      library().impl(name, TORCH_FN(unfold_kernel));
    } else {
      library().impl(name, torch::CppFunction::makeFromBoxedFunction<&cpu_metadata>());
    }
    return 1;
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return -1;
  }
}

// The pool core fresh results come from, and hologram._native's C API capsule: 1, or 0
// with a Python error set (a capsule of another version).
extern "C" __attribute__((visibility("default"))) int hologram_torch_fast_setup(
    PyObject* pool, PyObject* capsule) {
  auto* api = static_cast<const HologramNativeAPI*>(
      PyCapsule_GetPointer(capsule, "hologram._native.C_API"));
  if (api == nullptr) {
    return 0;
  }
  if (api->version != HOLOGRAM_NATIVE_API_VERSION) {
    PyErr_Format(PyExc_ImportError, "hologram._native's C API is version %d; the device's "
                 "front kernels were built for %d (reinstall hologram)", api->version,
                 HOLOGRAM_NATIVE_API_VERSION);
    return 0;
  }
  g_api = api;
  Py_INCREF(pool);
  Py_XSETREF(g_pool, pool);
  return 1;
}

// File the pending call on this thread: `launcher` run on `operands` (Python tensors and
// numbers, the program's operands in order) wrote `outs`, a tensor or a tuple of them in
// the launch's order: each an argument (written in place) or a fresh tensor; `node` is
// the launch-cache entry recorded execution records instead; `checks`, a tuple of
// (index, bound, dim, ignore) argument positions (see IndexCheck), what every call checks
// before it launches. 1: filed (committed if every result the kernel returns is one of
// `outs`, or None), 0: no pending call, or one whose arguments cannot express it.
extern "C" __attribute__((visibility("default"))) int hologram_torch_fast_file(
    PyObject* launcher, PyObject* node, PyObject* operands, PyObject* outs,
    PyObject* checks) {
  Pending* pending = g_pending;
  const bool several = PyTuple_Check(outs);
  if (pending == nullptr || !pending->keyed || !PyTuple_Check(operands) ||
      !(several || THPVariable_Check(outs)) || !PyTuple_Check(checks)) {
    return 0;
  }
  Entry entry;
  const auto nargs = static_cast<int>(pending->nargs);
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(checks); ++i) {
    IndexCheck check;
    if (!PyArg_ParseTuple(PyTuple_GET_ITEM(checks, i), "iiii", &check.index, &check.bound,
                          &check.dim, &check.ignore)) {
      PyErr_Clear();
      return 0;
    }
    const c10::IValue* args = pending->args;
    const bool ok = check.index >= 0 && check.index < nargs && args[check.index].isTensor() &&
                    check.bound >= 0 && check.bound < nargs &&
                    (check.dim < 0 ? args[check.bound].isInt()
                                   : args[check.bound].isTensor() &&
                                         check.dim < args[check.bound].toTensor().dim()) &&
                    check.ignore < nargs && (check.ignore < 0 || args[check.ignore].isInt());
    if (!ok) {
      return 0;
    }
    entry.checks.push_back(check);
  }
  const Py_ssize_t count = several ? PyTuple_GET_SIZE(outs) : 1;
  std::vector<bool> used(pending->nargs, false);
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(operands); ++i) {
    const int pos = position(*pending, PyTuple_GET_ITEM(operands, i), used);
    if (pos < 0) {
      return 0;
    }
    entry.operands.push_back(pos);
  }
  std::vector<const c10::TensorImpl*> produced;
  for (Py_ssize_t i = 0; i < count; ++i) {
    PyObject* item = several ? PyTuple_GET_ITEM(outs, i) : outs;
    if (!THPVariable_Check(item)) {
      return 0;
    }
    const at::Tensor& tensor = THPVariable_Unpack(item);
    Out out;
    std::vector<bool> any(pending->nargs, false);
    out.written = position(*pending, item, any);
    if (out.written < 0) {  // fresh: a dense block of its own, made again per call
      if (tensor.storage_offset() != 0 || !tensor.is_non_overlapping_and_dense() ||
          tensor.device().type() != c10::DeviceType::PrivateUse1) {
        return 0;
      }
      out.layout.sizes.assign(tensor.sizes().begin(), tensor.sizes().end());
      out.layout.strides.assign(tensor.strides().begin(), tensor.strides().end());
      out.layout.nbytes = static_cast<int64_t>(tensor.nbytes());
      out.layout.dtype = tensor.scalar_type();
    }
    entry.outs.push_back(std::move(out));
    produced.push_back(tensor.unsafeGetTensorImpl());
  }
  Py_INCREF(launcher);
  entry.launcher = launcher;
  Py_INCREF(node);
  entry.node = node;
  clear_entry(pending->entry);
  pending->entry = std::move(entry);
  pending->results = std::move(produced);
  pending->filed = true;
  return 1;
}

// Forget every filed call (their programs belong to the previous backend).
extern "C" __attribute__((visibility("default"))) void hologram_torch_fast_clear() {
  hologram_region::clear_filed();
  for (auto& op : ops()) {
    for (auto& [key, entry] : op->entries) {
      clear_entry(entry);
    }
    op->entries.clear();
  }
}

// Counters: calls served here, calls the Python kernels ran, calls filed; and the
// entries held now.
extern "C" __attribute__((visibility("default"))) PyObject* hologram_torch_fast_stats() {
  size_t entries = 0;
  for (auto& op : ops()) {
    entries += op->entries.size();
  }
  return Py_BuildValue("{s:L,s:L,s:L,s:n}", "hits", static_cast<long long>(g_hits),
                       "misses", static_cast<long long>(g_misses), "filed",
                       static_cast<long long>(g_filed), "entries",
                       static_cast<Py_ssize_t>(entries));
}
