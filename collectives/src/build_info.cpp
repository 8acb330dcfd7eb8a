// hpcdl_build_info / hpcdl_abi_version: what this build of the runtime can do, decided at compile time.
// Which MPI a job uses is decided at run time (hpcdl.common); the build only says which MPI families it
// has a shim for (see mpi/mpi_shim.h) and why any other is missing.
#include <string>

#include "hpcdl/c_api.h"
#include "kernels/reduce.h"

namespace {

#define HPCDL_STR2(x) #x
#define HPCDL_STR(x) HPCDL_STR2(x)

std::string json_escape(const std::string& in) {
  std::string out;
  for (char c : in) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

std::string make_build_info() {
  const std::string shims = HPCDL_MPI_SHIMS, missing = HPCDL_MPI_MISSING;
  // The kernels are compiled for baseline x86-64 and for AVX2/FMA/F16C; this is the set this CPU runs.
  std::string simd = hpcdl::kernel_isa();
  return std::string("{") + "\"version\":\"" + HPCDL_VERSION + "\"," + "\"abi\":" +
         std::to_string(HPCDL_ABI_VERSION) + "," + "\"compiler\":\"" + json_escape(HPCDL_COMPILER) + "\"," +
         "\"shm\":true,\"tcp\":true," + "\"mpi\":" + (shims.empty() ? "false" : "true") + "," +
         "\"mpi_shims\":\"" + shims + "\"," + "\"mpi_missing\":\"" + json_escape(missing) + "\"," +
         "\"cuda\":false,\"nccl\":false," + "\"simd\":\"" + simd + "\"}";
}

}  // namespace

extern "C" {

int hpcdl_abi_version(void) { return HPCDL_ABI_VERSION; }

const char* hpcdl_build_info(void) {
  static const std::string info = make_build_info();
  return info.c_str();
}

}  // extern "C"
