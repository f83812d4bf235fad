// The pending region of recorded device ops: hologram_torch/lazy.py's bookkeeping, in
// C++ so that recording an op costs well under a microsecond (docs/torch.md, "Recorded
// execution"). lazy.py decides everything else: when a region runs, its memo of fused
// programs, how results are staged.
//
// A region is what its ops need at the cut: per node its launch-cache entry, how its
// operands connect (a region input, a pending result, or a view of one), the addresses of
// its eager launch and its results; per result its address, its storage (weakly: a
// result whose storage died is a temporary, never written), the node that wrote it; per
// input its kind and layout; and per storage the pending write of it and whether the
// region reads it. An op reading a pending result through another view than a dense
// one's, or writing part of a storage a pending op writes, is a hazard: it is not
// recorded here, and lazy.record runs the region first. Everything runs under the GIL,
// which guards the region.

#include "region.h"

#include <ATen/MemoryOverlap.h>
#include <c10/core/Storage.h>
#include <c10/core/StorageImpl.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Storage.h>
#include <torch/csrc/autograd/python_variable.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <numeric>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace {

using Dims = std::vector<int64_t>;

// A tensor's view of its storage: its first element's address, sizes, strides, dtype.
struct View {
  int64_t address;
  Dims sizes, strides;
  int code;

  bool operator==(const View& o) const {
    return address == o.address && code == o.code && sizes == o.sizes &&
           strides == o.strides;
  }
  bool operator<(const View& o) const {
    return std::tie(address, code, sizes, strides) <
           std::tie(o.address, o.code, o.sizes, o.strides);
  }
};

View view_of(const at::Tensor& t) {
  return {reinterpret_cast<int64_t>(t.data_ptr()), t.sizes().vec(), t.strides().vec(),
          static_cast<int>(t.scalar_type())};
}

int64_t storage_key(const at::Tensor& t) {
  return reinterpret_cast<int64_t>(t.storage().data());
}

// The dimensions from outermost in memory, when the view fills its span densely
// (contiguous, channels_last, transposed); `dense` false otherwise.
Dims memory_order(const Dims& sizes, const Dims& strides, bool& dense) {
  Dims order(sizes.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return strides[a] > strides[b]; });
  int64_t step = 1;
  dense = true;
  for (auto d = order.rbegin(); d != order.rend(); ++d) {
    if (sizes[*d] > 1) {
      dense = dense && strides[*d] == step;
      step *= sizes[*d];
    }
  }
  return order;
}

// How an operand reaches the fused program: region input `index` ('i'), result `index`'s
// value ('v'), or a view of it ('w': offset, sizes, strides into its memory, which holds
// its dimensions in `order`).
struct Wire {
  char kind;
  int64_t index;
  int64_t offset = 0;
  Dims sizes, strides, order;
};

// The pending write of a storage.
struct Write {
  View view;
  int64_t result, offset, numel;
  bool contiguous, dense;
  Dims order;
};

// A region input: device memory ('m'), a CPU scalar's value ('c'), a number ('n'; `code`
// is then -1 bool, -2 int, -3 float, as lazy.py names them).
struct Input {
  char kind;
  int code;
  Dims sizes, strides;
};

struct Region {
  std::vector<PyObject*> nodes;  // strong references
  std::vector<std::vector<Wire>> wiring;
  std::vector<std::vector<int64_t>> launches, results;
  std::vector<int64_t> out_address, out_storage;
  std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> out_ref;
  std::vector<std::pair<int64_t, int64_t>> out_of;
  std::unordered_set<int64_t> superseded;  // results written over by a later node
  std::vector<Input> inputs;
  std::vector<int64_t> addresses;
  // what must live until the region has run
  std::vector<c10::Storage> keep_storages;
  std::vector<at::Tensor> keep_tensors;
  std::deque<int64_t> boxes;  // numbers' values (a deque: their addresses never move)
  std::map<View, int64_t> input_of;
  std::unordered_map<int64_t, std::vector<int64_t>> inputs_over;  // by storage
  std::unordered_set<int64_t> read;                               // storages
  std::unordered_map<int64_t, Write> written;                     // by storage

  ~Region() {
    for (PyObject* node : nodes) {
      Py_DECREF(node);
    }
  }
};

Region* g_region = new Region();  // replaced by take(); never destroyed at exit
bool g_on = false;
size_t g_max_nodes = 512;
int64_t g_recorded = 0;

// An operand: a tensor, or a number (kind -1 bool, -2 int, -3 float) with its bits.
struct Operand {
  at::Tensor tensor;
  int kind = 0;
  int64_t bits = 0;
};

bool alive(const Region& r, int64_t result) {
  return !r.out_ref[result].expired();
}

// How `t` (whose view is `view`) reads the pending write `w`; false: a hazard.
bool reading(const Write& w, const at::Tensor& t, const View& view, Wire& wire) {
  if (view == w.view) {
    wire = {'v', w.result};
    return true;
  }
  if (!w.dense || view.code != w.view.code) {
    return false;
  }
  const int64_t offset = t.storage_offset() - w.offset;
  int64_t last = offset;
  if (std::find(view.sizes.begin(), view.sizes.end(), 0) == view.sizes.end()) {
    for (size_t d = 0; d < view.sizes.size(); ++d) {
      last += (view.sizes[d] - 1) * view.strides[d];
    }
  }
  if (offset < 0 || last >= w.numel) {
    return false;
  }
  wire = {'w', w.result, offset, view.sizes, view.strides, w.order};
  return true;
}

// A number's box in `r`, and its address.
int64_t box(Region& r, int kind, int64_t bits) {
  r.boxes.push_back(0);
  int64_t* slot = &r.boxes.back();
  if (kind == -1) {
    *reinterpret_cast<bool*>(slot) = bits != 0;
  } else {
    *slot = bits;  // an int64, or a double's bits
  }
  return reinterpret_cast<int64_t>(slot);
}

int64_t new_input(Region& r, Input input, int64_t address) {
  r.inputs.push_back(std::move(input));
  r.addresses.push_back(address);
  return static_cast<int64_t>(r.inputs.size()) - 1;
}

// Record, or say why the region must run first ("size", "view", "overlapping write").
const char* record_operands(PyObject* entry, const std::vector<Operand>& operands,
                            const std::vector<at::Tensor>& outs, bool given) {
  Region& r = *g_region;
  if (r.nodes.size() >= g_max_nodes) {
    return "size";
  }
  // Hazards first: nothing is recorded when one is found.
  std::vector<Wire> pending(operands.size());
  std::vector<bool> is_pending(operands.size(), false);
  for (size_t i = 0; i < operands.size(); ++i) {
    const at::Tensor& t = operands[i].tensor;
    if (operands[i].kind != 0 || t.is_cpu()) {
      continue;
    }
    auto w = r.written.find(storage_key(t));
    if (w == r.written.end()) {
      continue;
    }
    if (!alive(r, w->second.result)) {
      r.written.erase(w);  // a dead storage's block, used again
      continue;
    }
    if (!reading(w->second, t, view_of(t), pending[i])) {
      return "view";
    }
    is_pending[i] = true;
  }
  if (given) {
    for (const at::Tensor& o : outs) {
      auto w = r.written.find(storage_key(o));
      if (w == r.written.end() || !alive(r, w->second.result) || w->second.view == view_of(o)) {
        continue;
      }
      // Another view of exactly the same memory (a reshape of a contiguous result,
      // written whole) replaces the pending write; any other overlap is a hazard.
      const Write& p = w->second;
      if (!(p.contiguous && o.is_contiguous() && o.storage_offset() == p.offset &&
            o.numel() == p.numel && static_cast<int>(o.scalar_type()) == p.view.code)) {
        return "overlapping write";
      }
    }
  }
  std::vector<Wire> wiring;
  std::vector<int64_t> addresses;
  for (size_t i = 0; i < operands.size(); ++i) {
    const Operand& op = operands[i];
    int64_t address;
    if (op.kind != 0) {
      address = box(r, op.kind, op.bits);
      wiring.push_back({'i', new_input(r, {'n', op.kind}, address)});
    } else if (op.tensor.is_cpu()) {  // a 0-d CPU tensor: its value now, not at the cut
      const at::Tensor& t = op.tensor;
      if (t.unsafeGetTensorImpl()->is_wrapped_number()) {
        int kind = 0;
        int64_t bits = 0;
        switch (t.scalar_type()) {
          case c10::ScalarType::Bool: kind = -1; bits = *t.const_data_ptr<bool>(); break;
          case c10::ScalarType::Long: kind = -2; bits = *t.const_data_ptr<int64_t>(); break;
          default: {
            kind = -3;
            const double value = t.item<double>();
            std::memcpy(&bits, &value, sizeof bits);
          }
        }
        address = box(r, kind, bits);
        wiring.push_back({'i', new_input(r, {'n', kind}, address)});
      } else {
        at::Tensor value = t.clone();
        address = reinterpret_cast<int64_t>(value.data_ptr());
        r.keep_tensors.push_back(value);
        wiring.push_back({'i', new_input(r, {'c', static_cast<int>(t.scalar_type())},
                                         address)});
      }
    } else if (is_pending[i]) {
      address = reinterpret_cast<int64_t>(op.tensor.data_ptr());
      wiring.push_back(std::move(pending[i]));
    } else {
      const at::Tensor& t = op.tensor;
      View view = view_of(t);
      const int64_t key = storage_key(t);
      address = view.address;
      auto found = r.input_of.find(view);
      int64_t index;
      if (found != r.input_of.end()) {
        index = found->second;
      } else {
        index = new_input(r, {'m', view.code, view.sizes, view.strides}, view.address);
        r.input_of.emplace(std::move(view), index);
        r.keep_storages.push_back(t.storage());
        r.inputs_over[key].push_back(index);
      }
      r.read.insert(key);
      wiring.push_back({'i', index});
    }
    addresses.push_back(address);
  }
  const int64_t node = static_cast<int64_t>(r.nodes.size());
  std::vector<int64_t> results;
  for (size_t j = 0; j < outs.size(); ++j) {
    const at::Tensor& o = outs[j];
    const int64_t key = storage_key(o);
    auto previous = r.written.find(key);
    if (previous != r.written.end() && alive(r, previous->second.result)) {
      r.superseded.insert(previous->second.result);
    }
    const int64_t k = static_cast<int64_t>(r.out_address.size());
    Write w{view_of(o), k, o.storage_offset(), o.numel(), o.is_contiguous(), false, {}};
    w.order = memory_order(w.view.sizes, w.view.strides, w.dense);
    r.out_address.push_back(w.view.address);
    r.out_ref.push_back(o.storage().getWeakStorageImpl());
    r.out_of.emplace_back(node, static_cast<int64_t>(j));
    r.out_storage.push_back(key);
    addresses.push_back(w.view.address);
    results.push_back(k);
    r.written[key] = std::move(w);
  }
  Py_INCREF(entry);
  r.nodes.push_back(entry);
  r.wiring.push_back(std::move(wiring));
  r.launches.push_back(std::move(addresses));
  r.results.push_back(std::move(results));
  ++g_recorded;
  return nullptr;
}

// --- Python's view of the region (lazy.py) ---------------------------------------------

PyObject* dims(const Dims& d) {
  PyObject* t = PyTuple_New(static_cast<Py_ssize_t>(d.size()));
  for (size_t i = 0; i < d.size(); ++i) {
    PyTuple_SET_ITEM(t, i, PyLong_FromLongLong(d[i]));
  }
  return t;
}

PyObject* ints(const std::vector<int64_t>& v) {
  return dims(v);
}

PyObject* view_tuple(const View& v) {
  return Py_BuildValue("(LNNi)", static_cast<long long>(v.address), dims(v.sizes),
                       dims(v.strides), v.code);
}

PyObject* wire_tuple(const Wire& w) {
  if (w.kind == 'w') {
    return Py_BuildValue("(sLLNNN)", "w", static_cast<long long>(w.index),
                         static_cast<long long>(w.offset), dims(w.sizes), dims(w.strides),
                         dims(w.order));
  }
  return Py_BuildValue("(NL)", PyUnicode_FromStringAndSize(&w.kind, 1),
                       static_cast<long long>(w.index));
}

PyObject* input_tuple(const Input& in) {
  if (in.kind == 'm') {
    return Py_BuildValue("(siNN)", "m", in.code, dims(in.sizes), dims(in.strides));
  }
  return Py_BuildValue("(Ni)", PyUnicode_FromStringAndSize(&in.kind, 1), in.code);
}

template <typename T, typename F>
PyObject* tuple_of(const std::vector<T>& items, F convert) {
  PyObject* t = PyTuple_New(static_cast<Py_ssize_t>(items.size()));
  for (size_t i = 0; i < items.size(); ++i) {
    PyTuple_SET_ITEM(t, i, convert(items[i]));
  }
  return t;
}

void free_region(PyObject* capsule) {
  delete static_cast<Region*>(PyCapsule_GetPointer(capsule, "hologram_torch.region"));
}

// How the region's inputs read the memory result `k` writes, for a result written over
// memory the region reads (staged, unless the fused program can write it in place): per
// input over its storage, (input, whether it is exactly the written tensor); false when
// the written tensor is not contiguous (the fused program writes a staged result
// contiguously, so it must stay staged).
using Aliases = std::vector<std::pair<int64_t, bool>>;

bool aliases_of(const Region& r, int64_t k, Aliases& aliases) {
  const int64_t key = r.out_storage[k];
  const View& view = r.written.at(key).view;
  int64_t step = 1;
  for (size_t d = view.sizes.size(); d-- > 0;) {
    if (view.strides[d] != step) {
      return false;
    }
    step *= std::max<int64_t>(view.sizes[d], 1);
  }
  for (int64_t i : r.inputs_over.at(key)) {
    const Input& in = r.inputs[i];
    aliases.emplace_back(i, r.addresses[i] == view.address && in.sizes == view.sizes &&
                                in.strides == view.strides);
  }
  return true;
}

// The words of a region's wiring: self-delimiting, so that with the live results and
// their aliases (appended by take) equal words are equal structures.
void wiring_words(const Region& r, std::vector<int64_t>& words) {
  auto push_dims = [&](const Dims& d) {
    words.push_back(static_cast<int64_t>(d.size()));
    words.insert(words.end(), d.begin(), d.end());
  };
  for (const std::vector<Wire>& ws : r.wiring) {
    words.push_back(static_cast<int64_t>(ws.size()));
    for (const Wire& w : ws) {
      words.push_back(w.kind);
      words.push_back(w.index);
      if (w.kind == 'w') {
        words.push_back(w.offset);
        push_dims(w.sizes);
        push_dims(w.strides);
        push_dims(w.order);
      }
    }
  }
}

PyObject* write_tuple(const Write& w) {
  PyObject* order = w.dense ? dims(w.order) : (Py_INCREF(Py_None), Py_None);
  return Py_BuildValue("(NLLLON)", view_tuple(w.view), static_cast<long long>(w.result),
                       static_cast<long long>(w.offset), static_cast<long long>(w.numel),
                       w.contiguous ? Py_True : Py_False, order);
}

// The pending region as Python values (None when empty), and a fresh one in its place:
// (entries, structure, live results (storage alive, not written over), per live result
// whether it is staged (its memory is read by the region) and how inputs alias it
// (aliases_of; () when not staged), the live results' addresses, the inputs' addresses,
// per staged result k: ((node, index), its write (view, result, offset, numel,
// contiguous, order), its storage), the region itself (a capsule holding what must live
// until it has run; `details` reads the rest from it)). The structure (wiring, live
// results, aliases) is one bytes object: with the entries, the region's memo key, built
// and hashed without the nested tuples of `details`.
PyObject* take(PyObject*, PyObject*) {
  Region* r = g_region;
  if (r->nodes.empty()) {
    Py_RETURN_NONE;
  }
  g_region = new Region();
  PyObject* capsule = PyCapsule_New(r, "hologram_torch.region", &free_region);
  if (capsule == nullptr) {
    delete r;
    return nullptr;
  }
  PyObject* entries = PyTuple_New(static_cast<Py_ssize_t>(r->nodes.size()));
  for (size_t i = 0; i < r->nodes.size(); ++i) {
    Py_INCREF(r->nodes[i]);
    PyTuple_SET_ITEM(entries, i, r->nodes[i]);
  }
  // The structure beyond the entries, as words: the wiring, then per live result its
  // index and whether it is staged (0 no, 1 over a non-contiguous write, 2 with its
  // aliases' count and (input, exact) pairs).
  std::vector<int64_t> words, live, live_address;
  wiring_words(*r, words);
  PyObject* staging = PyDict_New();
  PyObject* staged = PyList_New(0);
  PyObject* aliases = PyList_New(0);
  for (size_t k = 0; k < r->out_ref.size(); ++k) {
    if (r->superseded.count(static_cast<int64_t>(k))) {
      continue;
    }
    c10::intrusive_ptr<c10::StorageImpl> impl = r->out_ref[k].lock();
    if (!impl) {
      continue;
    }
    live.push_back(static_cast<int64_t>(k));
    live_address.push_back(r->out_address[k]);
    words.push_back(static_cast<int64_t>(k));
    const bool stage = r->read.count(r->out_storage[k]) != 0;
    PyList_Append(staged, stage ? Py_True : Py_False);
    Aliases over;
    PyObject* entry;
    if (!stage) {
      words.push_back(0);
      entry = PyTuple_New(0);
    } else if (!aliases_of(*r, static_cast<int64_t>(k), over)) {
      words.push_back(1);
      entry = (Py_INCREF(Py_None), Py_None);
    } else {
      words.push_back(2);
      words.push_back(static_cast<int64_t>(over.size()));
      for (const auto& [i, exact] : over) {
        words.push_back(i);
        words.push_back(exact);
      }
      entry = tuple_of(over, [](const std::pair<int64_t, bool>& a) {
        return Py_BuildValue("(LO)", static_cast<long long>(a.first),
                             a.second ? Py_True : Py_False);
      });
    }
    PyList_Append(aliases, entry);
    Py_DECREF(entry);
    if (!stage) {
      continue;
    }
    const auto& [node, index] = r->out_of[k];
    PyObject* key = PyLong_FromSsize_t(static_cast<Py_ssize_t>(k));
    PyObject* value = Py_BuildValue("((LL)NN)", static_cast<long long>(node),
                                    static_cast<long long>(index),
                                    write_tuple(r->written.at(r->out_storage[k])),
                                    THPStorage_Wrap(c10::Storage(std::move(impl))));
    PyDict_SetItem(staging, key, value);
    Py_DECREF(key);
    Py_DECREF(value);
  }
  PyObject* structure = PyBytes_FromStringAndSize(reinterpret_cast<const char*>(words.data()),
                                                  static_cast<Py_ssize_t>(words.size() * 8));
  PyObject* staged_tuple = PyList_AsTuple(staged);
  PyObject* aliases_tuple = PyList_AsTuple(aliases);
  Py_DECREF(staged);
  Py_DECREF(aliases);
  return Py_BuildValue("(NNNNNNNNN)", entries, structure, ints(live), staged_tuple,
                       aliases_tuple, ints(live_address), ints(r->addresses), staging, capsule);
}

// details(region): what a taken region's op-by-op run and its fused program's compile
// need beyond take's answer: (wiring, each op's launch addresses, each op's results,
// (node, index) of each result, inputs).
PyObject* details(PyObject*, PyObject* capsule) {
  auto* r = static_cast<Region*>(PyCapsule_GetPointer(capsule, "hologram_torch.region"));
  if (r == nullptr) {
    return nullptr;
  }
  PyObject* wiring = tuple_of(r->wiring, [](const std::vector<Wire>& ws) {
    return tuple_of(ws, wire_tuple);
  });
  PyObject* out_of = tuple_of(r->out_of, [](const std::pair<int64_t, int64_t>& p) {
    return Py_BuildValue("(LL)", static_cast<long long>(p.first),
                         static_cast<long long>(p.second));
  });
  return Py_BuildValue("(NNNNN)", wiring, tuple_of(r->launches, ints),
                       tuple_of(r->results, ints), out_of, tuple_of(r->inputs, input_tuple));
}

bool number(PyObject* obj, Operand& op) {
  if (PyBool_Check(obj)) {
    op.kind = -1;
    op.bits = obj == Py_True;
  } else if (PyLong_CheckExact(obj)) {
    op.kind = -2;
    op.bits = PyLong_AsLongLong(obj);
    if (op.bits == -1 && PyErr_Occurred()) {
      return false;
    }
  } else if (PyFloat_CheckExact(obj)) {
    op.kind = -3;
    const double value = PyFloat_AS_DOUBLE(obj);
    std::memcpy(&op.bits, &value, sizeof value);
  } else {
    PyErr_Format(PyExc_TypeError, "hologram lazy: an operand of type %s",
                 Py_TYPE(obj)->tp_name);
    return false;
  }
  return true;
}

bool operands_of(PyObject* tuple, std::vector<Operand>& operands) {
  operands.assign(PyTuple_GET_SIZE(tuple), Operand());
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(tuple); ++i) {
    PyObject* obj = PyTuple_GET_ITEM(tuple, i);
    if (THPVariable_Check(obj)) {
      operands[i].tensor = THPVariable_Unpack(obj);
    } else if (!number(obj, operands[i])) {
      return false;
    }
  }
  return true;
}

// record(entry, operands, outs, given): None once recorded, else the reason the region
// must run first.
PyObject* record_py(PyObject*, PyObject* const* args, Py_ssize_t n) {
  if (n != 4 || !PyTuple_Check(args[1]) || !PyTuple_Check(args[2])) {
    PyErr_SetString(PyExc_TypeError, "record(entry, operands, outs, given)");
    return nullptr;
  }
  std::vector<Operand> operands;
  if (!operands_of(args[1], operands)) {
    return nullptr;
  }
  std::vector<at::Tensor> outs;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(args[2]); ++i) {
    outs.push_back(THPVariable_Unpack(PyTuple_GET_ITEM(args[2], i)));
  }
  const char* why;
  try {
    why = record_operands(args[0], operands, outs, PyObject_IsTrue(args[3]) == 1);
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
  if (why == nullptr) {
    Py_RETURN_NONE;
  }
  return PyUnicode_FromString(why);
}

// Does writing `out` element by element while reading `operands` need more than a
// program can do (memory.unsafe_write's rule): `out` overlapping itself, or sharing
// memory with an operand other than element for element?
bool unsafe(const at::Tensor& out, const std::vector<Operand>& operands) {
  if (at::has_internal_overlap(out) != at::MemOverlap::No) {
    return true;
  }
  for (const Operand& op : operands) {
    const at::Tensor& t = op.tensor;
    if (op.kind != 0 || t.is_cpu() || t.is_same(out)) {
      continue;
    }
    const at::MemOverlapStatus status = at::get_overlap_status(out, t);
    if (status == at::MemOverlapStatus::Full) {
      if (t.sizes() != out.sizes() || t.strides() != out.strides()) {
        return true;
      }
    } else if (status != at::MemOverlapStatus::No) {
      return true;
    }
  }
  return false;
}

// A foreach op's rows: (entries, rows, outs, given), checked and parsed into `rows` and
// `outs`. 1 when parsed; 0 when a written tensor overlaps as memory.unsafe_write refuses
// (nothing parsed may then run); -1 with a Python error set.
int parse_rows(const char* usage, PyObject* const* args, Py_ssize_t n,
               std::vector<std::vector<Operand>>& rows, std::vector<at::Tensor>& outs) {
  if (n != 4 || !PyTuple_Check(args[0]) || !PyTuple_Check(args[1]) ||
      !PyTuple_Check(args[2]) || PyTuple_GET_SIZE(args[0]) != PyTuple_GET_SIZE(args[1]) ||
      PyTuple_GET_SIZE(args[1]) != PyTuple_GET_SIZE(args[2])) {
    PyErr_SetString(PyExc_TypeError, usage);
    return -1;
  }
  const bool given = PyObject_IsTrue(args[3]) == 1;
  const Py_ssize_t count = PyTuple_GET_SIZE(args[1]);
  rows.assign(count, {});
  outs.assign(count, at::Tensor());
  try {
    for (Py_ssize_t i = 0; i < count; ++i) {
      if (!operands_of(PyTuple_GET_ITEM(args[1], i), rows[i])) {
        return -1;
      }
      outs[i] = THPVariable_Unpack(PyTuple_GET_ITEM(args[2], i));
      if (given && unsafe(outs[i], rows[i])) {
        return 0;
      }
    }
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return -1;
  }
  return 1;
}

// record_rows(entries, rows, outs, given): record each row (a tuple of operands) of a
// foreach op writing its out, in order. None once all are recorded; ("unsafe", -1), with
// nothing recorded, when a written tensor overlaps as memory.unsafe_write refuses; else
// (reason, i): rows before i are recorded, the region must run before row i.
PyObject* record_rows(PyObject*, PyObject* const* args, Py_ssize_t n) {
  std::vector<std::vector<Operand>> rows;
  std::vector<at::Tensor> outs;
  const int parsed = parse_rows("record_rows(entries, rows, outs, given)", args, n, rows, outs);
  if (parsed <= 0) {
    return parsed < 0 ? nullptr : Py_BuildValue("(si)", "unsafe", -1);
  }
  const bool given = PyObject_IsTrue(args[3]) == 1;
  try {
    for (size_t i = 0; i < rows.size(); ++i) {
      const char* why = record_operands(PyTuple_GET_ITEM(args[0], i), rows[i], {outs[i]},
                                        given);
      if (why != nullptr) {
        return Py_BuildValue("(sn)", why, static_cast<Py_ssize_t>(i));
      }
    }
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
  Py_RETURN_NONE;
}

// launch_rows(entries, rows, outs, given): a foreach op's rows run now, op by op (recorded
// execution off): entries[i].launch(addresses) on row i's operands (tensors' data, numbers
// boxed as runner.run boxes them) and outs[i]. None once all ran; ("unsafe", -1), with
// nothing run, when a written tensor overlaps as memory.unsafe_write refuses. The entries
// are what file_rows filed for the rows' signature: every check but the overlaps held.
PyObject* launch_rows(PyObject*, PyObject* const* args, Py_ssize_t n) {
  std::vector<std::vector<Operand>> rows;
  std::vector<at::Tensor> outs;
  const int parsed = parse_rows("launch_rows(entries, rows, outs, given)", args, n, rows, outs);
  if (parsed <= 0) {
    return parsed < 0 ? nullptr : Py_BuildValue("(si)", "unsafe", -1);
  }
  const Py_ssize_t count = static_cast<Py_ssize_t>(rows.size());
  for (Py_ssize_t i = 0; i < count; ++i) {
    const std::vector<Operand>& row = rows[i];
    std::vector<int64_t> boxes(row.size());  // the numbers, where the kernel reads them
    PyObject* addresses = PyTuple_New(static_cast<Py_ssize_t>(row.size()) + 1);
    if (addresses == nullptr) {
      return nullptr;
    }
    for (size_t j = 0; j < row.size(); ++j) {
      // (a bool box's first byte is the bool: little-endian, as every target here)
      boxes[j] = row[j].bits;
      void* at = row[j].kind == 0 ? row[j].tensor.data_ptr() : &boxes[j];
      PyTuple_SET_ITEM(addresses, static_cast<Py_ssize_t>(j),
                       PyLong_FromVoidPtr(at));
    }
    PyTuple_SET_ITEM(addresses, static_cast<Py_ssize_t>(row.size()),
                     PyLong_FromVoidPtr(outs[i].data_ptr()));
    PyObject* launch = PyObject_GetAttrString(PyTuple_GET_ITEM(args[0], i), "launch");
    PyObject* done = launch == nullptr ? nullptr : PyObject_CallOneArg(launch, addresses);
    Py_XDECREF(launch);
    Py_DECREF(addresses);
    if (done == nullptr) {
      return nullptr;
    }
    Py_DECREF(done);
  }
  Py_RETURN_NONE;
}

// Foreach calls' rows' entries, by signature: the op (a number lazy.py gives it), then per
// row and operand a tensor's device, dtype, sizes and strides or a number's kind.
using RowsKey = std::vector<int64_t>;

std::unordered_map<RowsKey, PyObject*, hologram_region::WordsHash> g_rows;  // strong values
constexpr size_t kMaxRows = 4096;

// The signature of `rows` (a tuple of operand tuples) for op `op`; false (no error set)
// for an operand that is neither a tensor nor a number.
bool rows_key(PyObject* op, PyObject* rows, RowsKey& key) {
  key.clear();
  key.push_back(PyLong_AsLongLong(op));
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(rows); ++i) {
    PyObject* row = PyTuple_GET_ITEM(rows, i);
    if (!PyTuple_Check(row)) {
      return false;
    }
    key.push_back(-1);  // a row's start
    for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(row); ++j) {
      PyObject* obj = PyTuple_GET_ITEM(row, j);
      if (THPVariable_Check(obj)) {
        const at::Tensor& t = THPVariable_Unpack(obj);
        key.push_back(static_cast<int64_t>(t.device().type()));
        key.push_back(static_cast<int64_t>(t.scalar_type()));
        key.push_back(t.dim());
        key.insert(key.end(), t.sizes().begin(), t.sizes().end());
        key.insert(key.end(), t.strides().begin(), t.strides().end());
      } else if (PyBool_Check(obj)) {
        key.push_back(-2);
      } else if (PyLong_CheckExact(obj)) {
        key.push_back(-3);
      } else if (PyFloat_CheckExact(obj)) {
        key.push_back(-4);
      } else {
        return false;
      }
    }
  }
  return true;
}

// rows_entries(op, rows): the entries filed for this signature, or None.
PyObject* rows_entries(PyObject*, PyObject* const* args, Py_ssize_t n) {
  thread_local RowsKey key;
  if (n != 2 || !PyTuple_Check(args[1]) || !rows_key(args[0], args[1], key)) {
    Py_RETURN_NONE;
  }
  auto found = g_rows.find(key);
  if (found == g_rows.end()) {
    Py_RETURN_NONE;
  }
  Py_INCREF(found->second);
  return found->second;
}

// file_rows(op, rows, entries): rows_entries serves this signature from now on.
PyObject* file_rows(PyObject*, PyObject* const* args, Py_ssize_t n) {
  RowsKey key;
  if (n != 3 || !PyTuple_Check(args[1]) || !PyTuple_Check(args[2]) ||
      !rows_key(args[0], args[1], key)) {
    Py_RETURN_NONE;
  }
  if (g_rows.size() >= kMaxRows) {
    for (auto& [k, entries] : g_rows) {
      Py_DECREF(entries);
    }
    g_rows.clear();
  }
  Py_INCREF(args[2]);
  auto [slot, inserted] = g_rows.emplace(std::move(key), args[2]);
  if (!inserted) {
    Py_DECREF(slot->second);
    slot->second = args[2];
  }
  Py_RETURN_NONE;
}

PyObject* set_recording(PyObject*, PyObject* on) {
  g_on = PyObject_IsTrue(on) == 1;
  Py_RETURN_NONE;
}

PyObject* set_max_nodes(PyObject*, PyObject* n) {
  const Py_ssize_t value = PyLong_AsSsize_t(n);
  if (value < 1) {
    if (!PyErr_Occurred()) {
      PyErr_SetString(PyExc_ValueError, "the bound must be positive");
    }
    return nullptr;
  }
  g_max_nodes = static_cast<size_t>(value);
  Py_RETURN_NONE;
}

PyObject* pending(PyObject*, PyObject*) {
  return PyLong_FromSize_t(g_region->nodes.size());
}

// The pending ops' entries, in order.
PyObject* peek(PyObject*, PyObject*) {
  const Region& r = *g_region;
  PyObject* entries = PyList_New(static_cast<Py_ssize_t>(r.nodes.size()));
  for (size_t i = 0; i < r.nodes.size(); ++i) {
    Py_INCREF(r.nodes[i]);
    PyList_SET_ITEM(entries, i, r.nodes[i]);
  }
  return entries;
}

PyObject* recorded(PyObject*, PyObject*) {
  return PyLong_FromLongLong(g_recorded);
}

// touched(storage address, writes_only): does the pending region write (or read) it?
PyObject* touched(PyObject*, PyObject* const* args, Py_ssize_t n) {
  if (n != 2) {
    PyErr_SetString(PyExc_TypeError, "touched(storage, writes_only)");
    return nullptr;
  }
  const int64_t key = PyLong_AsLongLong(args[0]);
  if (key == -1 && PyErr_Occurred()) {
    return nullptr;
  }
  const Region& r = *g_region;
  const bool hit = r.written.count(key) || (PyObject_IsTrue(args[1]) != 1 && r.read.count(key));
  return PyBool_FromLong(hit);
}

// The dtype of each code the region uses (c10's scalar types).
PyObject* dtypes(PyObject*, PyObject*) {
  PyObject* table = PyDict_New();
  for (int code = 0; code < static_cast<int>(c10::ScalarType::NumOptions); ++code) {
    PyObject* dtype;
    try {
      dtype = reinterpret_cast<PyObject*>(
          torch::getTHPDtype(static_cast<c10::ScalarType>(code)));
    } catch (const std::exception&) {
      continue;
    }
    if (dtype == nullptr) {
      PyErr_Clear();
      continue;
    }
    PyObject* key = PyLong_FromLong(code);
    PyDict_SetItem(table, key, dtype);
    Py_DECREF(key);
  }
  return table;
}

PyMethodDef kMethods[] = {
    {"record", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&record_py)),
     METH_FASTCALL, nullptr},
    {"record_rows",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&record_rows)),
     METH_FASTCALL, nullptr},
    {"launch_rows",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&launch_rows)),
     METH_FASTCALL, nullptr},
    {"rows_entries",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&rows_entries)),
     METH_FASTCALL, nullptr},
    {"file_rows", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&file_rows)),
     METH_FASTCALL, nullptr},
    {"take", &take, METH_NOARGS, nullptr},
    {"details", &details, METH_O, nullptr},
    {"set_recording", &set_recording, METH_O, nullptr},
    {"set_max_nodes", &set_max_nodes, METH_O, nullptr},
    {"pending", &pending, METH_NOARGS, nullptr},
    {"peek", &peek, METH_NOARGS, nullptr},
    {"recorded", &recorded, METH_NOARGS, nullptr},
    {"touched", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&touched)),
     METH_FASTCALL, nullptr},
    {"dtypes", &dtypes, METH_NOARGS, nullptr},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

namespace hologram_region {

bool recording() {
  return g_on;
}

void clear_filed() {
  for (auto& [key, entries] : g_rows) {
    Py_DECREF(entries);
  }
  g_rows.clear();
}

bool record(PyObject* entry, const std::vector<c10::IValue>& operands,
            const std::vector<at::Tensor>& outs, bool given) {
  std::vector<Operand> ops(operands.size());
  for (size_t i = 0; i < operands.size(); ++i) {  // (kinds and bits as number() gives them)
    const c10::IValue& v = operands[i];
    if (v.isTensor()) {
      ops[i].tensor = v.toTensor();
    } else if (v.isBool()) {
      ops[i].kind = -1;
      ops[i].bits = v.toBool();
    } else if (v.isInt()) {
      ops[i].kind = -2;
      ops[i].bits = v.toInt();
    } else if (v.isDouble()) {
      ops[i].kind = -3;
      const double value = v.toDouble();
      std::memcpy(&ops[i].bits, &value, sizeof value);
    } else {
      return false;
    }
  }
  return record_operands(entry, ops, outs, given) == nullptr;
}

}  // namespace hologram_region

// The region's functions for hologram_torch/lazy.py, by name: a dict, or NULL with a
// Python error set.
extern "C" __attribute__((visibility("default"))) PyObject* hologram_torch_region_functions() {
  PyObject* functions = PyDict_New();
  for (PyMethodDef* def = kMethods; def->ml_name != nullptr; ++def) {
    PyObject* fn = PyCFunction_New(def, nullptr);
    if (fn == nullptr || PyDict_SetItemString(functions, def->ml_name, fn) < 0) {
      Py_XDECREF(fn);
      Py_DECREF(functions);
      return nullptr;
    }
    Py_DECREF(fn);
  }
  return functions;
}
