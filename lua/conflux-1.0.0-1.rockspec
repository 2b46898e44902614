-- Conflux for Lua 5.4. Builds the whole library with CMake (the Lua module links libconflux.so) and
-- installs conflux.lua and conflux_core.so into the rocks tree:
--   luarocks make lua/conflux-1.0.0-1.rockspec        (from a source checkout)
-- Needs a C compiler, CMake >= 3.25, SWIG 4 and Open MPI (libopenmpi-dev) for multi-process jobs.
rockspec_format = "3.0"
package = "conflux"
version = "1.0.0-1"
source = {
  url = "git+https://example.invalid/conflux.git",  -- replace with the project's repository
  tag = "v1.0.0",
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
  type = "cmake",
  variables = {
    CMAKE_BUILD_TYPE = "Release",
    CMAKE_INSTALL_PREFIX = "$(PREFIX)",
    CONFLUX_LUA_CMOD_DIR = "$(LIBDIR)",
    CONFLUX_LUA_LMOD_DIR = "$(LUADIR)",
    CONFLUX_WITH_LUA = "ON",
    CONFLUX_WITH_JAVA = "OFF",
    CONFLUX_WITH_PYTHON = "OFF",
    BUILD_TESTING = "OFF",
    LUA_INCLUDE_DIR = "$(LUA_INCDIR)",
  },
}
test = {
  type = "command",
  command = "busted --lua=lua5.4 --no-auto-insulate --lpath=lua/?.lua lua/spec",
}
