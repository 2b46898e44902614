-- Conflux for Lua 5.4. From a source checkout (the folder of CMakeLists.txt):
--   luarocks --lua-version=5.4 make lua/conflux-1.4.0-1.rockspec [--tree DIR]
-- builds libconflux and the Lua module with CMake (in build.luarocks/) and installs conflux.lua and
-- conflux_core.so into the tree; libconflux.so.<ABI> stays in the rock's own folder, where
-- conflux_core.so finds it (its RUNPATH). Needs a C compiler, CMake >= 3.25, SWIG 4, Lua 5.4 headers
-- and Open MPI (libopenmpi-dev) for multi-process jobs; CONFLUX_CMAKE_ARGS (environment) adds CMake
-- options (e.g. "-DCONFLUX_WITH_CUDA=OFF"). The version is CMake's project version (a test checks
-- that this file's name and version match it).
rockspec_format = "3.0"
package = "conflux"
version = "1.4.0-1"
source = {
  url = "git+https://localhost/conflux.git",  -- the project's repository
  tag = "v1.4.0",
}
description = {
  summary = "Data-parallel training collectives (allreduce, allgather, broadcast, ...) for Lua",
  detailed = [[
Conflux agrees with the other workers of a job on which tensors are ready, fuses them and reduces
them over Open MPI. This rock is its Lua 5.4 binding: collectives on tables and on zero-copy typed
arrays, async handles, structured errors.]],
  license = "Apache-2.0",
  labels = { "mpi", "distributed", "machine-learning" },
}
dependencies = { "lua >= 5.4, < 5.5" }
build_dependencies = {}
build = {
  -- "command", not "cmake": only the Lua module and the library are installed (cmake --install
  -- --component), the library outside the folders luarocks deploys into the tree.
  type = "command",
  build_command = [[
cmake -S . -B build.luarocks -DCMAKE_BUILD_TYPE=Release "-DCMAKE_INSTALL_PREFIX=$(PREFIX)" \
  -DCMAKE_INSTALL_LIBDIR=native "-DCONFLUX_LUA_CMOD_DIR=$(LIBDIR)" "-DCONFLUX_LUA_LMOD_DIR=$(LUADIR)" \
  "-DLUA_INCLUDE_DIR=$(LUA_INCDIR)" -DCONFLUX_WITH_LUA=ON -DCONFLUX_WITH_JAVA=OFF \
  -DCONFLUX_WITH_PYTHON=OFF -DBUILD_TESTING=OFF $CONFLUX_CMAKE_ARGS &&
cmake --build build.luarocks --target cfx_lua]],
  install_command = [[
cmake --install build.luarocks --component lua && cmake --install build.luarocks --component runtime]],
}
test = {
  type = "command",
  command = "busted --lua=lua5.4 --no-auto-insulate --lpath=lua/?.lua lua/spec",
}
