/*
 * conflux.i - the one SWIG interface of Conflux, shared by Python, Java and Lua.
 *
 * The common part (below) wraps the public header. Each language adds its typemaps, exception
 * mapping and helpers in its own file, included from its block here; a language block is owned by
 * that binding, the common part by all of them (keep it small and language-neutral).
 */
%module conflux

%{
#include "conflux/conflux.h"
#include "bind.h"
%}

%include <stdint.i>

#if defined(SWIGPYTHON)
%include "python/conflux_python.i"
#elif defined(SWIGJAVA)
%include "java/conflux_java.i"
#elif defined(SWIGLUA)
%include "lua/conflux_lua.i"
#endif

%include "conflux/conflux.h"
