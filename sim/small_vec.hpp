// A vector of trivially copyable values with inline room for N: program ops hold a few ids each, and
// one heap allocation per list dominated the simulator's time. The inline values and the heap pointer share
// their bytes (a list of three or four ints takes 24 bytes, not 32): a step's ops are walked many times, and
// the smaller they are, the more of them stay in cache.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <type_traits>
#include <vector>

namespace hbmsim::sim {

template <class T, std::uint32_t N>
class SmallVec {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  SmallVec() = default;
  SmallVec(std::initializer_list<T> xs) { assign(xs.begin(), xs.end()); }
  SmallVec(const SmallVec& o) { assign(o.begin(), o.end()); }
  SmallVec(SmallVec&& o) noexcept { steal(o); }
  SmallVec& operator=(const SmallVec& o) {
    if (this != &o) { size_ = 0; assign(o.begin(), o.end()); }
    return *this;
  }
  SmallVec& operator=(SmallVec&& o) noexcept {
    if (this != &o) { release(); steal(o); }
    return *this;
  }
  SmallVec& operator=(std::initializer_list<T> xs) { size_ = 0; assign(xs.begin(), xs.end()); return *this; }
  SmallVec& operator=(const std::vector<T>& xs) { size_ = 0; assign(xs.data(), xs.data() + xs.size()); return *this; }
  ~SmallVec() { release(); }

  void push_back(T x) {
    if (size_ == cap_) grow(cap_ * 2);
    data()[size_++] = x;
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
  void clear() { size_ = 0; }
  // Entry i becomes a[i] + (a[i] - b[i]) (a and b of one size): a list of ids moved on by the step from b to a.
  void assign_stepped(const SmallVec& a, const SmallVec& b) {
    if (a.size_ > cap_) grow(a.size_);
    T* out = data();
    const T *x = a.data(), *y = b.data();
    for (std::uint32_t i = 0; i < a.size_; ++i) out[i] = 2 * x[i] - y[i];
    size_ = a.size_;
  }

 private:
  bool on_heap() const { return cap_ > N; }
  // The values live in `bytes_` (an array of bytes provides storage for them) or behind the pointer it holds.
  T* local() { return reinterpret_cast<T*>(bytes_); }
  const T* local() const { return reinterpret_cast<const T*>(bytes_); }
  T* heap() const {
    T* h;
    std::memcpy(&h, bytes_, sizeof h);
    return h;
  }
  void set_heap(T* h) { std::memcpy(bytes_, &h, sizeof h); }

  void assign(const T* first, const T* last) {
    auto n = static_cast<std::uint32_t>(last - first);
    if (n > cap_) grow(n);
    std::copy(first, last, data());
    size_ = n;
  }
  void grow(std::uint32_t cap) {
    T* h = new T[cap];
    std::memcpy(h, data(), size_ * sizeof(T));
    if (on_heap()) delete[] heap();
    set_heap(h);
    cap_ = cap;
  }
  void release() {
    if (on_heap()) delete[] heap();
    cap_ = N;
    size_ = 0;
  }
  void steal(SmallVec& o) {
    size_ = o.size_;
    cap_ = o.cap_;
    std::memcpy(bytes_, o.bytes_, sizeof bytes_);  // the inline values, or the pointer to o's
    o.cap_ = N;
    o.size_ = 0;
  }

  std::uint32_t size_ = 0, cap_ = N;
  alignas(T*) alignas(T) unsigned char bytes_[std::max(sizeof(T) * N, sizeof(T*))];
};

}  // namespace hbmsim::sim
