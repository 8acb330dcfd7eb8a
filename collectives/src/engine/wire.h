// Byte-level encoding of the engine's control messages (little-endian host order: every rank of a job
// runs the same build on the same architecture).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace hpcdl {

class ByteWriter {
 public:
  template <typename T>
  void put(T value) {
    const auto* p = reinterpret_cast<const uint8_t*>(&value);
    bytes_.insert(bytes_.end(), p, p + sizeof(T));
  }
  void put_string(const std::string& s) {
    put<uint32_t>(static_cast<uint32_t>(s.size()));
    bytes_.insert(bytes_.end(), s.begin(), s.end());
  }
  void put_i64s(const std::vector<int64_t>& v) {
    put<uint32_t>(static_cast<uint32_t>(v.size()));
    for (int64_t x : v) put<int64_t>(x);
  }
  std::vector<uint8_t>& bytes() { return bytes_; }
  const std::vector<uint8_t>& bytes() const { return bytes_; }
  void clear() { bytes_.clear(); }  // keeps the capacity: a writer reused per cycle allocates once

 private:
  std::vector<uint8_t> bytes_;
};

// Reads what a ByteWriter wrote; every getter returns false (and stays failed) on truncated input.
class ByteReader {
 public:
  ByteReader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  template <typename T>
  bool get(T* value) {
    if (failed_ || size_ - pos_ < sizeof(T)) return fail();
    std::memcpy(value, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool get_string(std::string* s) {
    uint32_t n = 0;
    if (!get(&n) || size_ - pos_ < n) return fail();
    s->assign(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return true;
  }
  bool get_i64s(std::vector<int64_t>* v) {
    uint32_t n = 0;
    if (!get(&n) || (size_ - pos_) / sizeof(int64_t) < n) return fail();
    v->resize(n);
    for (uint32_t i = 0; i < n; ++i) get(&(*v)[i]);
    return !failed_;
  }
  bool done() const { return pos_ == size_; }
  bool failed() const { return failed_; }

 private:
  bool fail() {
    failed_ = true;
    return false;
  }
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
  bool failed_ = false;
};

}  // namespace hpcdl
