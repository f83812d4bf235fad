// PrivateUse1 hooks of the hologram device, in C++ (hologram_torch/native.py builds and
// loads this file; docs/distributed.md describes why).
//
// torch's Python device interface (torch._C._acc.PrivateUse1Hooks) forwards only
// is_built, is_available and has_primary_context to Python. Paths of torch's C++ core
// that allocate pinned host memory for the device (DDP's reducer with
// find_unused_parameters or static_graph, torch.empty(pin_memory=True)) ask the hooks for
// a pinned-memory allocator, which the Python interface cannot provide. On host memory
// (the cpu backend) "pinned" memory is ordinary host memory from the CPU allocator's
// functions; on a GPU's memory (cuda) it is page-locked memory from the driver
// (cuMemHostAlloc, whose functions Python hands over when the GPU starts:
// hologram_torch_page_lock), so copies from it run asynchronously at the bus's speed. The
// allocator remembers its blocks so that is_pinned() is true for exactly the memory it
// handed out (as for CUDA, where pin_memory() copies and an ordinary CPU tensor is not
// pinned).

#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <utility>

namespace {

// The GPU driver's functions for page-locked host memory (CUresult is an int).
struct PageLocking {
  int (*alloc)(void**, size_t, unsigned int);  // cuMemHostAlloc
  int (*free)(void*);                          // cuMemFreeHost
  int (*set_current)(void*);                   // cuCtxSetCurrent
  void* context;                               // the driver's (primary) context
};
constexpr unsigned int kPortable = 1;  // CU_MEMHOSTALLOC_PORTABLE: pinned for every context
std::atomic<const PageLocking*> page_locking{nullptr};

class PinnedAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    void* data = nullptr;
    const PageLocking* locking = page_locking.load();
    if (nbytes != 0 && locking != nullptr) {
      // (a context is current per thread: DataLoader pins on a thread of its own)
      int status = locking->set_current(locking->context);
      if (status == 0) {
        status = locking->alloc(&data, nbytes, kPortable);
      }
      TORCH_CHECK(status == 0, "pin_memory: the GPU driver could not page-lock ", nbytes,
                  " bytes of host memory (CUresult ", status, ")");
    } else if (nbytes != 0) {
      data = c10::alloc_cpu(nbytes);
    }
    if (data != nullptr) {
      std::lock_guard<std::mutex> guard(mutex_);
      blocks_[reinterpret_cast<std::uintptr_t>(data)] = {nbytes, locking};
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
    return address < block->first + block->second.first;
  }

  static PinnedAllocator& instance() {
    // Never destroyed: tensors may be freed while the process exits.
    static auto* allocator = new PinnedAllocator();
    return *allocator;
  }

 private:
  static void release(void* data) {
    const PageLocking* locking = nullptr;
    {
      PinnedAllocator& self = instance();
      std::lock_guard<std::mutex> guard(self.mutex_);
      auto block = self.blocks_.find(reinterpret_cast<std::uintptr_t>(data));
      if (block != self.blocks_.end()) {
        locking = block->second.second;
        self.blocks_.erase(block);
      }
    }
    if (locking != nullptr) {
      locking->set_current(locking->context);
      locking->free(data);
    } else {
      c10::free_cpu(data);
    }
  }

  mutable std::mutex mutex_;
  // start address -> (bytes, the driver that page-locked it, or null: the CPU allocator's)
  std::map<std::uintptr_t, std::pair<size_t, const PageLocking*>> blocks_;
};

// The devices (hologram_torch_set_device_count) and each thread's current one, which
// torch's device guards set and the device's Python side reads and sets
// (hologram_torch_current_device, hologram_torch_set_current_device).
std::atomic<c10::DeviceIndex> device_count{1};
thread_local c10::DeviceIndex current_device = 0;

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
    // (several devices share the host's memory: a pointer does not say which; the
    // current one)
    return {c10::DeviceType::PrivateUse1, current_device};
  }
};

// The device guard: what torch's Python guard (torch._C._acc.DeviceGuard) answers, without
// its call into Python for the device type, which every op taking a guard made (a linear
// layer's forward: about 30 calls, each taking the GIL). The devices hologram:0 to
// hologram:<count - 1>, the current one per thread; each one's stream is the default
// stream, on which work is complete when the host sees it (events and stream queries
// answer "done").
struct HologramGuard final : public c10::impl::DeviceGuardImplInterface {
  static constexpr c10::DeviceType kType = c10::DeviceType::PrivateUse1;

  c10::DeviceType type() const override {
    return kType;
  }
  c10::Device exchangeDevice(c10::Device device) const override {
    c10::Device old = getDevice();
    setDevice(device);
    return old;
  }
  c10::Device getDevice() const override {
    return {kType, current_device};
  }
  void setDevice(c10::Device device) const override {
    TORCH_CHECK(device.index() < device_count.load(),
                "Invalid device ordinal: hologram:", static_cast<int>(device.index()),
                " (there are ", static_cast<int>(device_count.load()), " hologram devices)");
    if (device.index() >= 0) {
      current_device = device.index();
    }
  }
  void uncheckedSetDevice(c10::Device device) const noexcept override {
    if (device.index() >= 0) {
      current_device = device.index();
    }
  }
  c10::Stream getStream(c10::Device /*device*/) const noexcept override {
    return c10::Stream(c10::Stream::DEFAULT, getDevice());
  }
  c10::Stream getNewStream(c10::Device /*device*/, int /*priority*/) const override {
    return c10::Stream(c10::Stream::DEFAULT, getDevice());
  }
  c10::Stream exchangeStream(c10::Stream /*stream*/) const noexcept override {
    return c10::Stream(c10::Stream::DEFAULT, getDevice());
  }
  c10::DeviceIndex deviceCount() const noexcept override {
    return device_count.load();
  }
  void record(void** /*event*/, const c10::Stream& /*stream*/,
              const c10::DeviceIndex /*device_index*/,
              const c10::EventFlag /*flag*/) const override {}
  void block(void* /*event*/, const c10::Stream& /*stream*/) const override {}
  bool queryEvent(void* /*event*/) const override {
    return true;
  }
  void destroyEvent(void* /*event*/,
                    const c10::DeviceIndex /*device_index*/) const noexcept override {}
  bool queryStream(const c10::Stream& /*stream*/) const override {
    return true;
  }
  void synchronizeStream(const c10::Stream& /*stream*/) const override {}
};

}  // namespace

// From now on, pinned memory is page-locked through these driver functions (all null:
// ordinary host memory again). Each set lives as long as the process: blocks handed out
// with it are freed with it.
extern "C" __attribute__((visibility("default"))) void hologram_torch_page_lock(
    void* alloc, void* free, void* set_current, void* context) {
  if (alloc == nullptr) {
    page_locking.store(nullptr);
    return;
  }
  page_locking.store(new PageLocking{
      reinterpret_cast<int (*)(void**, size_t, unsigned int)>(alloc),
      reinterpret_cast<int (*)(void*)>(free), reinterpret_cast<int (*)(void*)>(set_current),
      context});
}

extern "C" __attribute__((visibility("default"))) void hologram_torch_set_device_count(
    int count) {
  device_count.store(static_cast<c10::DeviceIndex>(count));
}

extern "C" __attribute__((visibility("default"))) int hologram_torch_current_device() {
  return current_device;
}

extern "C" __attribute__((visibility("default"))) void hologram_torch_set_current_device(
    int index) {
  current_device = static_cast<c10::DeviceIndex>(index);
}

// 1: these hooks are registered (now or by an earlier call); 0: other hooks were
// registered first (torch accepts one registration per process); -1: torch refused.
extern "C" __attribute__((visibility("default"))) int hologram_torch_register_hooks() {
  static auto* hooks = new HologramHooks();  // lives as long as the process
  static auto* guard = new HologramGuard();
  try {
    // First: torch's Python guard is then not registered (it keeps the first one).
    if (!c10::impl::hasDeviceGuardImpl(c10::DeviceType::PrivateUse1)) {
      c10::impl::registerDeviceGuard(c10::DeviceType::PrivateUse1, guard);
    }
    if (at::isPrivateUse1HooksRegistered()) {
      return &at::detail::getPrivateUse1Hooks() == hooks ? 1 : 0;
    }
    at::RegisterPrivateUse1HooksInterface(hooks);
    return 1;
  } catch (...) {
    return -1;
  }
}
