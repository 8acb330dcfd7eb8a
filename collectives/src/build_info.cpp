// hpcdl_build_info / hpcdl_abi_version: what this build of the runtime can do, decided at compile time.
#include <string>

#include "hpcdl/c_api.h"
#include "kernels/reduce.h"

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
  // The kernels are compiled for baseline x86-64 and for AVX2/FMA/F16C; this is the set this CPU runs.
  std::string simd = hpcdl::kernel_isa();
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
