// The runtime's settings as handed over by hpcdl.common: "key=value" lines. The runtime reads no
// environment variables itself; resolution (argument > HPCDL_* > HOROVOD_* > default) happens in Python.
#pragma once

#include <map>
#include <set>
#include <string>

namespace hpcdl {

class Options {
 public:
  static Options parse(const char* text);

  bool has(const std::string& key) const { return values_.count(key) != 0; }
  std::string get(const std::string& key, const std::string& fallback = "") const;
  long long get_int(const std::string& key, long long fallback) const;
  double get_double(const std::string& key, double fallback) const;
  bool get_bool(const std::string& key, bool fallback) const;
  // The log level is info or more verbose (hpcdl run --verbose): the runtime says what it chose.
  bool logs_info() const;
  void set(const std::string& key, const std::string& value) { values_[key] = value; }

 private:
  std::map<std::string, std::string> values_;
};

}  // namespace hpcdl
