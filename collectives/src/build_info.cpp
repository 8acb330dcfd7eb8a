// hpcdl_build_info / hpcdl_abi_version: what this build of the runtime can do, decided at compile time.
#include <string>

#include "hpcdl/c_api.h"

#ifdef HPCDL_HAVE_MPI
#include <mpi.h>
#endif

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
  std::string mpi = "false", vendor, version, reason = HPCDL_MPI_REASON;
#ifdef HPCDL_HAVE_MPI
  mpi = "true";
#if defined(OPEN_MPI)
  vendor = "Open MPI";
  version = HPCDL_STR(OMPI_MAJOR_VERSION) "." HPCDL_STR(OMPI_MINOR_VERSION) "." HPCDL_STR(OMPI_RELEASE_VERSION);
#elif defined(MPICH_VERSION)
  vendor = "MPICH";
  version = MPICH_VERSION;
#else
  vendor = "MPI";
  version = HPCDL_STR(MPI_VERSION) "." HPCDL_STR(MPI_SUBVERSION);
#endif
#endif
  std::string simd = "generic";
#if defined(__AVX512F__)
  simd = "avx512";
#elif defined(__AVX2__)
  simd = "avx2";
#elif defined(__SSE2__)
  simd = "sse2";
#elif defined(__ARM_NEON)
  simd = "neon";
#endif
  return std::string("{") + "\"version\":\"" + HPCDL_VERSION + "\"," + "\"abi\":" +
         std::to_string(HPCDL_ABI_VERSION) + "," + "\"compiler\":\"" + json_escape(HPCDL_COMPILER) + "\"," +
         "\"shm\":true,\"tcp\":true," + "\"mpi\":" + mpi + "," + "\"mpi_vendor\":\"" + json_escape(vendor) +
         "\"," + "\"mpi_version\":\"" + json_escape(version) + "\"," + "\"mpi_reason\":\"" +
         json_escape(reason) + "\"," + "\"cuda\":false,\"nccl\":false," + "\"simd\":\"" + simd + "\"}";
}

}  // namespace

extern "C" {

int hpcdl_abi_version(void) { return HPCDL_ABI_VERSION; }

const char* hpcdl_build_info(void) {
  static const std::string info = make_build_info();
  return info.c_str();
}

}  // extern "C"
