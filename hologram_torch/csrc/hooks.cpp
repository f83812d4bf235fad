// PrivateUse1 hooks of the hologram device, in C++ (hologram_torch/native.py builds and
// loads this file; docs/distributed.md describes why).
//
// torch's Python device interface (torch._C._acc.PrivateUse1Hooks) forwards only
// is_built, is_available and has_primary_context to Python. Paths of torch's C++ core
// that allocate pinned host memory for the device (DDP's reducer with
// find_unused_parameters or static_graph, torch.empty(pin_memory=True)) ask the hooks for
// a pinned-memory allocator, which the Python interface cannot provide. The device's
// memory is host memory, so "pinned" memory is ordinary host memory: it comes from the
// CPU allocator's functions, and this allocator remembers its blocks so that
// is_pinned() is true for exactly the memory it handed out (as for CUDA, where
// pin_memory() copies and an ordinary CPU tensor is not pinned).

#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/impl/alloc_cpu.h>

#include <cstdint>
#include <map>
#include <mutex>

namespace {

class PinnedAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    void* data = nbytes == 0 ? nullptr : c10::alloc_cpu(nbytes);
    if (data != nullptr) {
      std::lock_guard<std::mutex> guard(mutex_);
      blocks_[reinterpret_cast<std::uintptr_t>(data)] = nbytes;
    }
    return {data, data, &release, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override {
    return &release;
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  // Is `data` inside a block this allocator handed out (a view's pointer too)?
  bool owns(const void* data) const {
    const auto address = reinterpret_cast<std::uintptr_t>(data);
    std::lock_guard<std::mutex> guard(mutex_);
    auto block = blocks_.upper_bound(address);
    if (block == blocks_.begin()) {
      return false;
    }
    --block;
    return address < block->first + block->second;
  }

  static PinnedAllocator& instance() {
    // Never destroyed: tensors may be freed while the process exits.
    static auto* allocator = new PinnedAllocator();
    return *allocator;
  }

 private:
  static void release(void* data) {
    {
      PinnedAllocator& self = instance();
      std::lock_guard<std::mutex> guard(self.mutex_);
      self.blocks_.erase(reinterpret_cast<std::uintptr_t>(data));
    }
    c10::free_cpu(data);
  }

  mutable std::mutex mutex_;
  std::map<std::uintptr_t, size_t> blocks_;  // start address -> bytes
};

// The answers the Python hooks gave (hologram_torch/device.py), plus the allocator and
// the device of a pointer. Generators stay torch's defaults: the device has none (random
// ops draw from the CPU generator).
struct HologramHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override {
    return true;
  }

  bool isAvailable() const override {
    return true;
  }

  bool hasPrimaryContext(c10::DeviceIndex /*device_index*/) const override {
    return true;
  }

  at::Allocator* getPinnedMemoryAllocator() const override {
    return &PinnedAllocator::instance();
  }

  bool isPinnedPtr(const void* data) const override {
    return PinnedAllocator::instance().owns(data);
  }

  at::Device getDeviceFromPtr(void* /*data*/) const override {
    return {c10::DeviceType::PrivateUse1, 0};  // one device: hologram:0
  }
};

}  // namespace

// 1: these hooks are registered (now or by an earlier call); 0: other hooks were
// registered first (torch accepts one registration per process); -1: torch refused.
extern "C" __attribute__((visibility("default"))) int hologram_torch_register_hooks() {
  static auto* hooks = new HologramHooks();  // lives as long as the process
  try {
    if (at::isPrivateUse1HooksRegistered()) {
      return &at::detail::getPrivateUse1Hooks() == hooks ? 1 : 0;
    }
    at::RegisterPrivateUse1HooksInterface(hooks);
    return 1;
  } catch (...) {
    return -1;
  }
}
