// A vector of trivially copyable values with inline room for N: program ops hold a few ids each, and
// one heap allocation per list dominated the simulator's time.
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
  T* data() { return heap_ ? heap_ : inline_; }
  const T* data() const { return heap_ ? heap_ : inline_; }
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
  void assign(const T* first, const T* last) {
    auto n = static_cast<std::uint32_t>(last - first);
    if (n > cap_) grow(n);
    std::copy(first, last, data());
    size_ = n;
  }
  void grow(std::uint32_t cap) {
    T* h = new T[cap];
    std::memcpy(h, data(), size_ * sizeof(T));
    delete[] heap_;
    heap_ = h;
    cap_ = cap;
  }
  void release() {
    delete[] heap_;
    heap_ = nullptr;
    cap_ = N;
    size_ = 0;
  }
  void steal(SmallVec& o) {
    size_ = o.size_;
    if (o.heap_) {
      heap_ = o.heap_;
      cap_ = o.cap_;
      o.heap_ = nullptr;
      o.cap_ = N;
    } else {
      std::copy(o.inline_, o.inline_ + o.size_, inline_);
    }
    o.size_ = 0;
  }

  T* heap_ = nullptr;
  std::uint32_t size_ = 0, cap_ = N;
  T inline_[N];
};

}  // namespace hbmsim::sim
