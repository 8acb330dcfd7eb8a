// SHA-256 and HMAC-SHA-256 (FIPS 180-4, RFC 2104): authenticates ranks at rendezvous and on data links.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "comm.h"

namespace hpcdl {

using Digest = std::array<uint8_t, 32>;

Digest sha256(const void* data, size_t size);
Digest hmac_sha256(const std::string& key, const std::string& message);
// Constant-time comparison, so that a forged MAC cannot be found byte by byte from response times.
bool digest_equal(const uint8_t* a, const uint8_t* b, size_t size);
// Fills `out` from the kernel's random source (getrandom). A kernel that cannot give random bytes (no
// getrandom, a seccomp profile refusing it, endless interruptions) is an error with a message, never a
// retry loop without end: nonces and secrets must not be made from anything weaker.
Status random_bytes(void* out, size_t size);

}  // namespace hpcdl
