"""Check a binary wheel of hpcdl against its target: its tag, and what its shared objects need of the system.

Reads the ELF files inside the wheel directly (no binutils): the libraries each one needs (DT_NEEDED), the
symbol versions it needs from them (.gnu.version_r) and the symbols it exports (.dynsym). A wheel passes when
- its tag names every CPython it carries a ``_hotpath`` for, and the manylinux platform of the target glibc;
- it carries the runtime and both MPI shims;
- no shared object needs a glibc symbol version newer than the target, nor libstdc++/libgcc_s (the C++
  runtime is linked in statically) nor any libmpi (MPI is loaded at run time);
- the runtime and the shims export hpcdl's C ABI only, ``_hotpath`` its module init only.

``python scripts/wheel_check.py WHEEL --glibc 2.28 --pythons cp39 cp310 ...`` prints what it read and exits
1 with the reasons when the wheel does not pass (scripts/build-wheels.sh runs it after auditwheel).
"""

from __future__ import annotations

import argparse
import re
import struct
import sys
import zipfile
from dataclasses import dataclass, field

SYSTEM_LIBRARIES = {  # what manylinux lets a wheel take from the system, and all hpcdl may take
    "libc.so.6",
    "libm.so.6",
    "libpthread.so.0",
    "libdl.so.2",
    "librt.so.1",
    "ld-linux-x86-64.so.2",
    "ld-linux-aarch64.so.1",
}
SHT_DYNAMIC, SHT_DYNSYM, SHT_VERNEED = 6, 11, 0x6FFFFFFE
DT_NEEDED, DT_NULL = 1, 0


@dataclass
class Elf:
    needed: list[str] = field(default_factory=list)
    versions: dict[str, list[str]] = field(default_factory=dict)  # library -> versions needed from it
    exported: list[str] = field(default_factory=list)  # defined, default-visibility global/weak symbols


def _string(data: bytes, at: int) -> str:
    return data[at : data.index(b"\0", at)].decode()


def read_elf(data: bytes) -> Elf:
    """DT_NEEDED, version needs and exported symbols of a 64-bit little-endian ELF shared object."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    shoff, shentsize, shnum = struct.unpack_from("<Q", data, 0x28)[0], *struct.unpack_from("<HH", data, 0x3A)
    sections = []
    for i in range(shnum):
        _, kind, _, _, offset, size, link, _, _, entsize = struct.unpack_from(
            "<IIQQQQIIQQ", data, shoff + i * shentsize
        )
        sections.append((kind, offset, size, link, entsize))

    def strtab(index: int) -> bytes:
        _, offset, size, _, _ = sections[index]
        return data[offset : offset + size]

    elf = Elf()
    for kind, offset, size, link, entsize in sections:
        if kind == SHT_DYNAMIC:
            names = strtab(link)
            for at in range(offset, offset + size, 16):
                tag, value = struct.unpack_from("<qQ", data, at)
                if tag == DT_NULL:
                    break
                if tag == DT_NEEDED:
                    elf.needed.append(_string(names, value))
        elif kind == SHT_VERNEED:
            names, at = strtab(link), offset
            while True:
                _, count, file, aux, following = struct.unpack_from("<HHIII", data, at)
                versions = elf.versions.setdefault(_string(names, file), [])
                entry = at + aux
                for _ in range(count):
                    _, _, _, name, next_aux = struct.unpack_from("<IHHII", data, entry)
                    versions.append(_string(names, name))
                    entry += next_aux
                if not following:
                    break
                at += following
        elif kind == SHT_DYNSYM:
            names = strtab(link)
            for at in range(offset + entsize, offset + size, entsize):
                name, info, other, shndx = struct.unpack_from("<IBBH", data, at)
                binding, visibility = info >> 4, other & 3
                if shndx != 0 and binding in (1, 2) and visibility == 0:
                    elf.exported.append(_string(names, name))
    return elf


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split("."))


def check(path: str, glibc: str, pythons: list[str]) -> list[str]:
    """What is wrong with the wheel at `path` (empty when it passes)."""
    problems = []
    name = path.rsplit("/", 1)[-1]
    match = re.fullmatch(r"hpcdl-[^-]+-(?P<py>[^-]+)-(?P<abi>[^-]+)-(?P<plat>[^-]+)\.whl", name)
    if not match:
        return [f"{name} is not a binary wheel file name of hpcdl"]
    arch = "aarch64" if match["plat"].endswith("aarch64") else "x86_64"
    platform = f"manylinux_{glibc.replace('.', '_')}_{arch}"
    if match["plat"] != platform:
        problems.append(f"platform tag {match['plat']}, expected {platform}")
    for kind in ("py", "abi"):
        if sorted(match[kind].split(".")) != sorted(pythons):
            problems.append(f"{kind} tag {match[kind]}, expected {'.'.join(pythons)}")
    with zipfile.ZipFile(path) as wheel:
        objects = {n: wheel.read(n) for n in wheel.namelist() if n.endswith(".so")}
    for required in ("hpcdl/_collectives.so", "hpcdl/_mpi_openmpi.so", "hpcdl/_mpi_mpich.so"):
        if required not in objects:
            problems.append(f"{required} is missing")
    for tag in pythons:
        want = f"hpcdl/common/_hotpath.cpython-{tag[2:]}-{arch}-linux-gnu.so"
        if want not in objects:
            problems.append(f"{want} is missing, so the wheel cannot serve {tag}")
    limit = _version(glibc)
    for member, data in sorted(objects.items()):
        elf = read_elf(data)
        for library in elf.needed:
            if library not in SYSTEM_LIBRARIES:
                problems.append(f"{member} needs {library}, which is not part of the target system")
        for library, versions in elf.versions.items():
            for version in versions:
                if version.startswith("GLIBC_") and re.fullmatch(r"GLIBC_[0-9.]+", version):
                    if _version(version[6:]) > limit:
                        problems.append(f"{member} needs {version} from {library} (target glibc {glibc})")
                elif not version.startswith("GLIBC_"):
                    problems.append(f"{member} needs {version} from {library}")
        prefix = "PyInit_" if "/_hotpath" in member else "hpcdl_"
        leaked = [s for s in elf.exported if not s.startswith(prefix)]
        if leaked:
            problems.append(f"{member} exports {len(leaked)} symbols beyond {prefix}*, e.g. {leaked[:3]}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("wheel")
    parser.add_argument("--glibc", default="2.28")
    parser.add_argument("--pythons", nargs="+", required=True)
    args = parser.parse_args(argv)
    problems = check(args.wheel, args.glibc, args.pythons)
    for problem in problems:
        print(f"wheel_check: {problem}", file=sys.stderr)
    if not problems:
        print(f"wheel_check: {args.wheel} fits glibc {args.glibc}, {' '.join(args.pythons)}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
