# CMake toolchain file: cross-compile for aarch64 Linux with Debian's cross toolchain (g++-aarch64-linux-gnu),
# target libraries under /usr/aarch64-linux-gnu; programs run under qemu-aarch64 (qemu-user) where CMake
# needs to run one. Used by .ci/aarch64_check.sh:
#   cmake -S . -B build/aarch64 -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake ...
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

set(SPECDEC_AARCH64_SYSROOT /usr/aarch64-linux-gnu CACHE PATH "The aarch64 target's libraries (libc, libstdc++, libgomp)")
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64 -L ${SPECDEC_AARCH64_SYSROOT})

# Target libraries and headers from the cross toolchain's root first; packages (torch, pybind11) and the host
# Python interpreter from the paths given on the command line.
set(CMAKE_FIND_ROOT_PATH ${SPECDEC_AARCH64_SYSROOT})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)
