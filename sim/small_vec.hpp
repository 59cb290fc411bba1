// A vector of trivially copyable values with inline room for N: program ops hold a few ids each, and
// one heap allocation per list dominated the simulator's time. A list is four bytes of size and then either
// its values or a pointer to them (sharing the same bytes): with N = 3 ints it takes 16 bytes, so that an op
// with three lists fits in 96. A step's ops are walked many times, and the smaller they are, the more of
// them stay in cache. The capacity is not stored: a list longer than N lives on the heap in room for
// bit_ceil(size) values, so it is full exactly when its size is a power of two.
#pragma once
#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <type_traits>
#include <vector>

namespace hbmsim::sim {

template <class T, std::uint32_t N>
class SmallVec {
  static_assert(std::is_trivially_copyable_v<T>);
  static_assert(N >= 1);

 public:
  SmallVec() = default;
  SmallVec(std::initializer_list<T> xs) { assign(xs.begin(), xs.end()); }
  SmallVec(const SmallVec& o) {
    if (o.on_heap()) {
      assign(o.begin(), o.end());
    } else {  // the whole inline room: a copy of constant size compiles to a few moves, not a call
      std::memcpy(bytes_, o.bytes_, sizeof bytes_);
      size_ = o.size_;
    }
  }
  SmallVec(SmallVec&& o) noexcept { steal(o); }
  SmallVec& operator=(const SmallVec& o) {
    if (this != &o) assign(o.begin(), o.end());
    return *this;
  }
  SmallVec& operator=(SmallVec&& o) noexcept {
    if (this != &o) {
      release();
      steal(o);
    }
    return *this;
  }
  SmallVec& operator=(std::initializer_list<T> xs) { assign(xs.begin(), xs.end()); return *this; }
  SmallVec& operator=(const std::vector<T>& xs) { assign(xs.data(), xs.data() + xs.size()); return *this; }
  ~SmallVec() { release(); }

  void push_back(T x) {
    if (size_ < N) {
      local()[size_++] = x;
      return;
    }
    if (size_ == N) {  // the inline room is full: to the heap
      T* h = new T[std::bit_ceil(N + 1)];
      std::memcpy(h, local(), N * sizeof(T));
      set_heap(h);
    } else if (std::has_single_bit(size_)) {  // the heap room is full: double it
      T* h = new T[2 * size_];
      T* old = heap();
      std::memcpy(h, old, size_ * sizeof(T));
      delete[] old;
      set_heap(h);
    }
    heap()[size_++] = x;
  }
  T* data() { return on_heap() ? heap() : local(); }
  const T* data() const { return on_heap() ? heap() : local(); }
  T* begin() { return data(); }
  T* end() { return data() + size_; }
  const T* begin() const { return data(); }
  const T* end() const { return data() + size_; }
  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  T& operator[](std::size_t i) { return data()[i]; }
  const T& operator[](std::size_t i) const { return data()[i]; }
  T& back() { return data()[size_ - 1]; }
  void clear() { release(); }
  // Entry i becomes v[i] + (v[i] - before[i]) (before of this size): a copied list of ids moved on by the step
  // its model took from `before`.
  void step_on(const SmallVec& before) {
    using U = std::make_unsigned_t<T>;  // wraps where a slot past the size holds stale values
    if (!on_heap()) {  // every inline slot at once: a fixed count the compiler unrolls, no branch per entry
      T* out = local();
      const T* y = before.local();
      for (std::uint32_t i = 0; i < N; ++i) out[i] = static_cast<T>(2 * static_cast<U>(out[i]) - static_cast<U>(y[i]));
      return;
    }
    T* out = heap();
    const T* y = before.heap();
    for (std::uint32_t i = 0; i < size_; ++i) out[i] = 2 * out[i] - y[i];
  }

 private:
  bool on_heap() const { return size_ > N; }
  // The values live in `bytes_` (an array of bytes provides storage for them) or behind the pointer it holds
  // (read and written with memcpy: it needs no alignment there).
  T* local() { return reinterpret_cast<T*>(bytes_); }
  const T* local() const { return reinterpret_cast<const T*>(bytes_); }
  T* heap() const {
    T* h;
    std::memcpy(&h, bytes_, sizeof h);
    return h;
  }
  void set_heap(T* h) { std::memcpy(bytes_, &h, sizeof h); }

  // [first, last) must not lie in this list.
  void assign(const T* first, const T* last) {
    const auto n = static_cast<std::uint32_t>(last - first);
    if (on_heap() && n > N && std::bit_ceil(n) <= std::bit_ceil(size_)) {  // fits the room it has
      std::copy(first, last, heap());
      size_ = n;
      return;
    }
    release();
    if (n > N) set_heap(new T[std::bit_ceil(n)]);
    size_ = n;
    std::copy(first, last, data());
  }
  void release() {
    if (on_heap()) delete[] heap();
    size_ = 0;
  }
  void steal(SmallVec& o) {
    size_ = o.size_;
    std::memcpy(bytes_, o.bytes_, sizeof bytes_);  // the inline values, or the pointer to o's
    o.size_ = 0;
  }

  std::uint32_t size_ = 0;
  alignas(T) unsigned char bytes_[std::max(sizeof(T) * N, sizeof(T*))] = {};  // zeroed: copies take all of it
};

}  // namespace hbmsim::sim
