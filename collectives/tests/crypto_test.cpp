// Checks the runtime's SHA-256, HMAC-SHA-256 and random source (collectives/src/crypto/). Built and run by
// tests/unit/test_crypto.py, one mode per run:
//   known-answers      FIPS 180-4 example vectors and RFC 4231 test cases 1-7; one "ok"/"FAIL" line each
//   interop            reads "KEYHEX MSGHEX" lines, prints "SHA256(MSG) HMAC(KEY, MSG)" in hex per line
//   draw               prints two 32-byte draws of random_bytes in hex
//   blocked ERRNO      makes the getrandom system call fail with ERRNO (a seccomp filter), then draws:
//                      prints "error: MESSAGE" and exits 0 when random_bytes reports the failure
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>

#include "crypto/sha256.h"

namespace {
int failures = 0;

void check(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "ok" : "FAIL", what.c_str());
  if (!ok) ++failures;
}

std::string hex(const uint8_t* data, size_t size) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < size; ++i) out += std::string{digits[data[i] >> 4], digits[data[i] & 15]};
  return out;
}

std::string unhex(const std::string& text) {
  std::string out;
  for (size_t i = 0; i + 1 < text.size(); i += 2) out += char(std::stoi(text.substr(i, 2), nullptr, 16));
  return out;
}

std::string sha_hex(const std::string& message) {
  const hpcdl::Digest d = hpcdl::sha256(message.data(), message.size());
  return hex(d.data(), d.size());
}

std::string hmac_hex(const std::string& key, const std::string& message) {
  const hpcdl::Digest d = hpcdl::hmac_sha256(key, message);
  return hex(d.data(), d.size());
}

int known_answers() {
  // FIPS 180-4 / NIST CSVS example messages (one block, two blocks, 896 bits, a million 'a', empty).
  check(sha_hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad", "sha256 abc");
  check(sha_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1",
        "sha256 448-bit message (padding spills into a second block)");
  check(sha_hex("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrs"
                "mnopqrstnopqrstu") == "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1",
        "sha256 896-bit message");
  check(sha_hex(std::string(1000000, 'a')) == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0",
        "sha256 one million 'a'");
  check(sha_hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", "sha256 empty");

  // RFC 4231, HMAC-SHA-256 test cases 1-7.
  const std::string block_key(131, '\xaa');
  struct Case {
    const char* what;
    std::string key, data, mac;
  } cases[] = {
      {"rfc4231 case 1", std::string(20, '\x0b'), "Hi There",
       "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"},
      {"rfc4231 case 2 (key shorter than the output)", "Jefe", "what do ya want for nothing?",
       "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"},
      {"rfc4231 case 3", std::string(20, '\xaa'), std::string(50, '\xdd'),
       "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"},
      {"rfc4231 case 4", unhex("0102030405060708090a0b0c0d0e0f10111213141516171819"), std::string(50, '\xcd'),
       "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b"},
      // Case 5 publishes only the first 128 bits (truncated output).
      {"rfc4231 case 5 (truncated to 128 bits)", std::string(20, '\x0c'), "Test With Truncation",
       "a3b6167473100ee06e0c796c2955552b"},
      {"rfc4231 case 6 (key longer than a block)", block_key,
       "Test Using Larger Than Block-Size Key - Hash Key First",
       "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"},
      {"rfc4231 case 7 (key and data longer than a block)", block_key,
       "This is a test using a larger than block-size key and a larger than block-size data. The key needs to "
       "be hashed before being used by the HMAC algorithm.",
       "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2"},
  };
  for (const Case& c : cases) check(hmac_hex(c.key, c.data).compare(0, c.mac.size(), c.mac) == 0, c.what);

  const hpcdl::Digest a = hpcdl::sha256("x", 1), b = hpcdl::sha256("y", 1);
  check(hpcdl::digest_equal(a.data(), a.data(), a.size()), "digest_equal accepts equal digests");
  hpcdl::Digest last = a;
  last[31] ^= 1;
  check(!hpcdl::digest_equal(a.data(), b.data(), a.size()) && !hpcdl::digest_equal(a.data(), last.data(), 32),
        "digest_equal refuses digests that differ (also in the last byte only)");
  return failures == 0 ? 0 : 1;
}

int interop() {
  std::string key, message;
  while (std::cin >> key >> message) {
    if (key == "-") key.clear();
    if (message == "-") message.clear();
    std::printf("%s %s\n", sha_hex(unhex(message)).c_str(), hmac_hex(unhex(key), unhex(message)).c_str());
  }
  return 0;
}

int draw() {
  for (int i = 0; i < 2; ++i) {
    uint8_t buf[32];
    hpcdl::Status st = hpcdl::random_bytes(buf, sizeof(buf));
    if (!st.is_ok()) {
      std::printf("error: %s\n", st.message.c_str());
      return 1;
    }
    std::printf("%s\n", hex(buf, sizeof(buf)).c_str());
  }
  return 0;
}

// Every getrandom system call of this process from now on fails with `err`, as under a container's
// seccomp profile that does not know the call (ENOSYS), refuses it (EPERM), or keeps interrupting it.
bool block_getrandom(int err) {
  struct sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_getrandom, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (uint32_t(err) & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  struct sock_fprog program = {static_cast<unsigned short>(sizeof(filter) / sizeof(filter[0])), filter};
  return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 &&
         prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program, 0, 0) == 0;
}

int blocked(int err) {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || __GLIBC_MINOR__ >= 41)
  std::printf("skip: this glibc may serve getrandom from the vDSO, which a seccomp filter does not see\n");
  return 0;
#endif
  if (!block_getrandom(err)) {
    std::printf("skip: cannot install a seccomp filter here (%s)\n", std::strerror(errno));
    return 0;
  }
  uint8_t probe;
  if (syscall(SYS_getrandom, &probe, 1, 0) != -1 || errno != err) {
    std::printf("FAIL the seccomp filter did not take effect\n");
    return 1;
  }
  uint8_t buf[32];
  hpcdl::Status st = hpcdl::random_bytes(buf, sizeof(buf));
  if (st.is_ok()) {
    std::printf("FAIL random_bytes reported success while getrandom fails\n");
    return 1;
  }
  std::printf("error: %s\n", st.message.c_str());
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "known-answers") return known_answers();
  if (mode == "interop") return interop();
  if (mode == "draw") return draw();
  if (mode == "blocked" && argc > 2) return blocked(std::atoi(argv[2]));
  std::fprintf(stderr, "usage: %s known-answers | interop | draw | blocked ERRNO\n", argv[0]);
  return 2;
}
