/* loops_lua.c - bench/lang's C loops for Lua: require "cfx_bench_loops" (bench-only).
 *   allreduce(ctx_address, n) -> a table of n times (us)            (cfx._address() of the context)
 *   gradset(set_address, count, n) -> step times, ready times (us)  (cfx._address(gs))
 * On failure: nil, status, the C message. */
#include <lauxlib.h>
#include <lua.h>
#include <stdlib.h>

#include "loops.h"

static int fail(lua_State *L, int st)
{
    lua_pushnil(L);
    lua_pushinteger(L, st);
    lua_pushstring(L, cfx_last_error());
    return 3;
}

static void push_times(lua_State *L, const double *t, lua_Integer n)
{
    lua_createtable(L, n > 0 && n < INT32_MAX ? (int)n : 0, 0);
    for (lua_Integer i = 0; i < n; i++) {
        lua_pushnumber(L, (lua_Number)t[i]);
        lua_rawseti(L, -2, i + 1);
    }
}

static int allreduce(lua_State *L)
{
    void *ctx = (void *)(intptr_t)luaL_checkinteger(L, 1);
    lua_Integer n = luaL_checkinteger(L, 2);
    double *t = malloc(((size_t)(n > 0 ? n : 0) + 1) * sizeof *t);
    if (!t) return luaL_error(L, "out of memory");
    int st = cfx_bench_allreduce_loop(ctx, n, t);
    if (st != 0) {
        free(t);
        return fail(L, st);
    }
    push_times(L, t, n);
    free(t);
    return 1;
}

static int gradset(lua_State *L)
{
    void *set = (void *)(intptr_t)luaL_checkinteger(L, 1);
    int32_t count = (int32_t)luaL_checkinteger(L, 2);
    lua_Integer n = luaL_checkinteger(L, 3);
    double *t = malloc(((size_t)(n > 0 ? n : 0) * 2 + 1) * sizeof *t);
    if (!t) return luaL_error(L, "out of memory");
    int st = cfx_bench_gradset_loop(set, count, n, t, t + (n > 0 ? n : 0));
    if (st != 0) {
        free(t);
        return fail(L, st);
    }
    push_times(L, t, n);
    push_times(L, t + n, n);
    free(t);
    return 2;
}

int luaopen_cfx_bench_loops(lua_State *L);
int luaopen_cfx_bench_loops(lua_State *L)
{
    static const luaL_Reg fns[] = {{"allreduce", allreduce}, {"gradset", gradset}, {NULL, NULL}};
    luaL_newlib(L, fns);
    return 1;
}
