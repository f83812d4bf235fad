// The pending region of recorded device ops (hologram_torch/lazy.py; region.cpp records,
// ops.cpp's front kernels call it).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <Python.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace hologram_region {

// FNV-1a over a key's words: the hash of the native tables keyed by call signatures.
struct WordsHash {
  size_t operator()(const std::vector<int64_t>& key) const noexcept {
    uint64_t h = 1469598103934665603ull;
    for (int64_t word : key) {
      h = (h ^ static_cast<uint64_t>(word)) * 1099511628211ull;
    }
    return static_cast<size_t>(h);
  }
};

// Is recorded execution on (and not paused by a running region)?
bool recording();

// Record a launch of `entry` (a launch-cache entry of hologram_torch/aten/runner.py) on
// `operands` (device tensors; CPU 0-d tensors: wrapped numbers and scalars; numbers: bool,
// int or double, as lazy.record takes Python numbers) writing `outs` (fresh results, or
// `given` tensors written in place). False, with nothing recorded, when the region must
// run first (a hazard, its size bound) or an operand is of another kind: the caller then
// records through Python (lazy.record), which runs it. Called with the GIL held.
bool record(PyObject* entry, const std::vector<c10::IValue>& operands,
            const std::vector<at::Tensor>& outs, bool given);

// Forget the foreach signatures filed (their entries belong to the previous backend).
void clear_filed();

}  // namespace hologram_region
