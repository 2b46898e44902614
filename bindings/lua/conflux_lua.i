/*
 * conflux_lua.i - the Lua 5.4 part of the SWIG interface, included from conflux.i's SWIGLUA block.
 *
 * It builds the low-level C module `conflux_core` (swig -module conflux_core) that lua/conflux.lua
 * wraps into the module users `require "conflux"`; users never call it directly.
 * - Queries without out-parameters (cfx_rank, cfx_version_string, cfx_shutdown, ...) and the enum
 *   constants are wrapped by SWIG as they are; the context is a SWIG pointer userdata.
 * - Everything that moves data or handles is a hand-written lua_CFunction (%native): typed arrays
 *   (userdata "conflux.array" owning its elements, so collectives run on them zero-copy) and the
 *   collectives on them. cfx_handle (uint64_t) travels as a Lua integer (same 64 bits).
 * - Shared tensor memory (cfx_alloc) reaches Lua only as typed arrays whose elements lie in a
 *   cfx_alloc block ("conflux.shared_array", freed by __gc or shared_array_free); no raw pointer
 *   ever does, so cfx_alloc / cfx_free are not wrapped.
 * - Failures return `nil, status, message`; conflux.lua raises the structured error, so that the
 *   mapping lives in one place and error levels point at the user's call.
 * - Nothing runs on the background thread: completion is observed by poll/wait on the Lua thread.
 */

%ignore cfx_tensor;
%ignore cfx_init_options;
%ignore cfx_init_options_init;
%ignore cfx_init;
%ignore cfx_poll;
%ignore cfx_wait;
%ignore cfx_handle_status;
%ignore cfx_handle_message;
%ignore cfx_handle_release;
%ignore cfx_handle_output_count;
%ignore cfx_handle_output;
%ignore cfx_handle_output_copy;
%ignore cfx_handle_splits;
%ignore cfx_handle_join_rank;
%ignore cfx_allreduce_async;
%ignore cfx_allreduce_options; /* per-call options: allreduce's compression argument */
%ignore cfx_allreduce_options_init;
%ignore cfx_allreduce_async_opts;
%ignore CFX_ALLREDUCE_OPTIONS_VERSION;
%ignore CFX_COMPRESSION_COUNT;
%ignore cfx_grouped_allreduce_async;
%ignore cfx_allgather_async;
%ignore cfx_grouped_allgather_async;
%ignore cfx_broadcast_async;
%ignore cfx_alltoall_async;
%ignore cfx_reducescatter_async;
%ignore cfx_grouped_reducescatter_async;
%ignore cfx_barrier_async;
%ignore cfx_join_async;
%ignore cfx_alloc;
%ignore cfx_free;
%ignore cfx_is_shared; /* arrays know where their elements are (array_state) */
%ignore cfx_gradset_options; /* gradient sets: the gradset_* natives below */
%ignore cfx_gradset_options_init;
%ignore cfx_gradset_create;
%ignore cfx_gradset_add;
%ignore cfx_gradset_commit;
%ignore cfx_gradset_data;
%ignore cfx_gradset_ready;
%ignore cfx_gradset_wait;
%ignore cfx_gradset_free;
%ignore cfx_context_create_subset; /* the subset native below */
/* elastic worlds: elastic_init, reform and membership_pending below (options by name, an
 * out-parameter); cfx_membership_round and cfx_member_id are wrapped as they are */
%ignore CFX_REFORM_OPTIONS_VERSION;
%ignore cfx_reform_options;
%ignore cfx_reform_options_init;
%ignore cfx_elastic_init;
%ignore cfx_context_reform;
%ignore cfx_membership_pending;
/* the public rendezvous store (cfx_store_*, since 1.4): served by launchers (the Python drivers
 * of conflux.spark and conflux.ray); not wrapped for Lua */
%ignore cfx_store_serve;
%ignore cfx_store_connect;
%ignore cfx_store_port;
%ignore cfx_store_set;
%ignore cfx_store_get;
%ignore cfx_store_event_kind;
%ignore CFX_STORE_EVENT_NONE;
%ignore CFX_STORE_EVENT_SET;
%ignore CFX_STORE_EVENT_CLOSED;
%ignore CFX_STORE_EVENT_VERSION;
%ignore cfx_store_event;
%ignore cfx_store_next_event;
%ignore cfx_store_free;

%{
#include <limits.h>
#include <math.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>
#include "kernels/half.h" /* the engine's element conversions (capi/src) */

#define CFXL_ARRAY "conflux.array"
/* The same type with its elements in shared tensor memory: its own metatable, so that only these
 * carry a __gc (a finalizer would make the GC keep every private array one cycle longer). */
#define CFXL_SHARED "conflux.shared_array"

/* A typed array of `n` elements of `dtype`: in one Lua-owned userdata, right after this header
 * (never moved), or in a cfx_alloc block. `data` is NULL only for a freed shared array. */
typedef struct cfxl_array {
    void *data;
    int64_t n;
    int32_t dtype;
    int32_t elem;
} cfxl_array;

static void *cfxl_data(cfxl_array *a) { return a->data; }

static int cfxl_fail(lua_State *L, cfx_status s, const char *msg) {
    lua_pushnil(L);
    lua_pushinteger(L, (lua_Integer)s);
    lua_pushstring(L, msg && msg[0] ? msg : cfx_status_string(s));
    return 3;
}

static int cfxl_fail_last(lua_State *L, cfx_status s) { return cfxl_fail(L, s, cfx_last_error()); }

static cfx_context *cfxl_ctx(lua_State *L, int idx) {
    void *p = NULL;
    if (!SWIG_IsOK(SWIG_ConvertPtr(L, idx, &p, SWIGTYPE_p_cfx_context, 0)) || p == NULL)
        luaL_argerror(L, idx, "conflux context expected");
    return (cfx_context *)p;
}

/* The array at idx, private or shared, or NULL; a freed shared array too. */
static cfxl_array *cfxl_test_array(lua_State *L, int idx) {
    cfxl_array *a = (cfxl_array *)luaL_testudata(L, idx, CFXL_ARRAY);
    return a ? a : (cfxl_array *)luaL_testudata(L, idx, CFXL_SHARED);
}

/* The usable array at idx; raises for anything else, a freed shared array included. */
static cfxl_array *cfxl_check_array(lua_State *L, int idx) {
    cfxl_array *a = cfxl_test_array(L, idx);
    if (!a) luaL_typeerror(L, idx, CFXL_ARRAY);
    if (!a->data) luaL_argerror(L, idx, "the shared array was freed");
    return a;
}

static cfx_handle cfxl_check_handle(lua_State *L, int idx) {
    return (cfx_handle)luaL_checkinteger(L, idx);
}

/* float16 / bfloat16 elements convert with the engine's own functions (kernels/half.h:
 * half_to_float, float_to_half, bhalf_to_float, float_to_bhalf), so a stored value is the value the
 * engine reduces. */

/* Pushes element i (0-based). */
static void cfxl_push_elem(lua_State *L, const cfxl_array *a, int64_t i) {
    const unsigned char *p = (const unsigned char *)a->data + i * a->elem;
    switch (a->dtype) {
    case CFX_UINT8: lua_pushinteger(L, *(const uint8_t *)p); break;
    case CFX_INT8: lua_pushinteger(L, *(const int8_t *)p); break;
    case CFX_UINT16: lua_pushinteger(L, *(const uint16_t *)p); break;
    case CFX_INT16: lua_pushinteger(L, *(const int16_t *)p); break;
    case CFX_INT32: lua_pushinteger(L, *(const int32_t *)p); break;
    case CFX_INT64: lua_pushinteger(L, (lua_Integer) * (const int64_t *)p); break;
    case CFX_FLOAT16: lua_pushnumber(L, half_to_float(*(const uint16_t *)p)); break;
    case CFX_BFLOAT16: lua_pushnumber(L, bhalf_to_float(*(const uint16_t *)p)); break;
    case CFX_FLOAT32: lua_pushnumber(L, *(const float *)p); break;
    case CFX_FLOAT64: lua_pushnumber(L, *(const double *)p); break;
    case CFX_BOOL: lua_pushboolean(L, *(const uint8_t *)p != 0); break;
    default: lua_pushnil(L); break;
    }
}

/* Stores the value at stack index `v` as element i; 0 on success, else an error message. */
static const char *cfxl_set_elem(lua_State *L, cfxl_array *a, int64_t i, int v) {
    unsigned char *p = (unsigned char *)cfxl_data(a) + i * a->elem;
    int isint = 0;
    lua_Integer k = 0;
    lua_Number x = 0;
    if (a->dtype == CFX_BOOL) {
        if (lua_isboolean(L, v)) {
            *p = (uint8_t)lua_toboolean(L, v);
            return NULL;
        }
    }
    if (a->dtype <= CFX_INT64 || a->dtype == CFX_BOOL) {
        k = lua_tointegerx(L, v, &isint);
        if (!isint) return "an integer (or a float with an exact integer value) expected";
    } else {
        x = lua_tonumberx(L, v, &isint);
        if (!isint) return "a number expected";
    }
    switch (a->dtype) {
    case CFX_UINT8: *(uint8_t *)p = (uint8_t)k; break;
    case CFX_INT8: *(int8_t *)p = (int8_t)k; break;
    case CFX_UINT16: *(uint16_t *)p = (uint16_t)k; break;
    case CFX_INT16: *(int16_t *)p = (int16_t)k; break;
    case CFX_INT32: *(int32_t *)p = (int32_t)k; break;
    case CFX_INT64: *(int64_t *)p = (int64_t)k; break;
    case CFX_BOOL: *(uint8_t *)p = k != 0; break;
    case CFX_FLOAT16: *(uint16_t *)p = float_to_half((float)x); break;
    case CFX_BFLOAT16: *(uint16_t *)p = float_to_bhalf((float)x); break;
    case CFX_FLOAT32: *(float *)p = (float)x; break;
    case CFX_FLOAT64: *(double *)p = (double)x; break;
    default: return "unknown dtype";
    }
    return NULL;
}

/* A new zeroed array on the stack, its elements in the userdata, or with `shared` in a cfx_alloc
 * block. NULL with nothing pushed for a bad dtype or size (*st stays CFX_OK); NULL with the
 * cfx_alloc status in *st (its message in cfx_last_error()) and a dead array pushed when the pool
 * has no room. */
static cfxl_array *cfxl_new(lua_State *L, int32_t dtype, int64_t n, int shared, cfx_status *st) {
    size_t elem = cfx_dtype_size((cfx_dtype)dtype), header = sizeof(cfxl_array);
    cfxl_array *a;
    *st = CFX_OK;
    if (elem == 0 || n < 0 || (uint64_t)n > (SIZE_MAX - header) / elem) return NULL;
    a = (cfxl_array *)lua_newuserdatauv(L, header + (shared ? 0 : (size_t)n * elem), 0);
    a->data = shared ? NULL : (void *)(a + 1);
    a->n = n;
    a->dtype = dtype;
    a->elem = (int32_t)elem;
    /* the metatable (and so __gc) before the block: a Lua error below cannot leak it */
    luaL_setmetatable(L, shared ? CFXL_SHARED : CFXL_ARRAY);
    if (shared) {
        *st = cfx_alloc((size_t)n * elem, &a->data);
        if (*st != CFX_OK) return NULL;
    }
    memset(cfxl_data(a), 0, (size_t)n * elem);
    return a;
}

static cfxl_array *cfxl_new_array(lua_State *L, int32_t dtype, int64_t n) {
    cfx_status st;
    return cfxl_new(L, dtype, n, 0, &st);
}

/* Elements 1..a->n of the table at `tidx` into `a`. 0, or -1 with the error message pushed. */
static int cfxl_from_table(lua_State *L, cfxl_array *a, int tidx) {
    int64_t i;
    for (i = 0; i < a->n; i++) {
        const char *err;
        lua_geti(L, tidx, (lua_Integer)(i + 1));
        err = cfxl_set_elem(L, a, i, -1);
        if (err) {
            lua_pushfstring(L, "element %I: %s, got %s", (lua_Integer)(i + 1), err, luaL_typename(L, -1));
            return -1;
        }
        lua_pop(L, 1);
    }
    return 0;
}

/* array_new / shared_array_new (dtype, n | table) -> array | nil, status, message */
static int cfxl_make_array(lua_State *L, int shared) {
    int32_t dtype = (int32_t)luaL_checkinteger(L, 1);
    int64_t n;
    cfxl_array *a;
    cfx_status st;
    int fromtable = lua_istable(L, 2);
    if (fromtable) n = (int64_t)luaL_len(L, 2);
    else n = (int64_t)luaL_checkinteger(L, 2);
    if (cfx_dtype_size((cfx_dtype)dtype) == 0)
        return cfxl_fail(L, CFX_ERR_INVALID_ARGUMENT, "unknown dtype");
    if (n < 0) return cfxl_fail(L, CFX_ERR_INVALID_ARGUMENT, "negative array length");
    a = cfxl_new(L, dtype, n, shared, &st);
    if (!a) return st != CFX_OK ? cfxl_fail_last(L, st) : cfxl_fail(L, CFX_ERR_OUT_OF_MEMORY, "array too large");
    if (fromtable && cfxl_from_table(L, a, 2) != 0)
        return cfxl_fail(L, CFX_ERR_INVALID_ARGUMENT, lua_tostring(L, -1));
    return 1;
}

static int cfxl_array_new(lua_State *L) { return cfxl_make_array(L, 0); }
static int cfxl_shared_array_new(lua_State *L) { return cfxl_make_array(L, 1); }

/* shared_array_free(a) -> true | nil, status, message. The array is unusable afterwards. */
static int cfxl_shared_array_free(lua_State *L) {
    cfxl_array *a = (cfxl_array *)luaL_checkudata(L, 1, CFXL_SHARED);
    cfx_status s;
    if (!a->data) return cfxl_fail(L, CFX_ERR_INVALID_ARGUMENT, "the shared array was already freed");
    s = cfx_free(a->data);
    if (s != CFX_OK) return cfxl_fail_last(L, s);
    a->data = NULL;
    lua_pushboolean(L, 1);
    return 1;
}

/* __gc of shared arrays. Collectives in flight keep their arrays reachable (conflux.lua). */
static int cfxl_shared_array_gc(lua_State *L) {
    cfxl_array *a = (cfxl_array *)luaL_checkudata(L, 1, CFXL_SHARED);
    if (a->data) cfx_free(a->data);
    a->data = NULL;
    return 0;
}

static int64_t cfxl_check_index(lua_State *L, cfxl_array *a, int idx) {
    lua_Integer i = luaL_checkinteger(L, idx);
    if (i < 1 || i > a->n)
        luaL_error(L, "conflux.array index %I out of range 1..%I", i, (lua_Integer)a->n);
    return (int64_t)(i - 1);
}

static int cfxl_array_index(lua_State *L) {
    cfxl_array *a = cfxl_check_array(L, 1);
    if (lua_type(L, 2) == LUA_TSTRING) {  /* a method */
        luaL_getmetatable(L, CFXL_ARRAY);
        lua_getfield(L, -1, "methods");
        lua_pushvalue(L, 2);
        lua_rawget(L, -2);
        return 1;
    }
    {
        /* like a table: out of range (or a non-integer key) reads nil, so ipairs() works */
        int isint = 0;
        lua_Integer i = lua_tointegerx(L, 2, &isint);
        if (isint && i >= 1 && i <= a->n) cfxl_push_elem(L, a, (int64_t)(i - 1));
        else lua_pushnil(L);
    }
    return 1;
}

static int cfxl_array_newindex(lua_State *L) {
    cfxl_array *a = cfxl_check_array(L, 1);
    int64_t i = cfxl_check_index(L, a, 2);
    const char *err = cfxl_set_elem(L, a, i, 3);
    if (err) return luaL_error(L, "conflux.array: %s, got %s", err, luaL_typename(L, 3));
    return 0;
}

static int cfxl_array_len(lua_State *L) {
    lua_pushinteger(L, (lua_Integer)cfxl_check_array(L, 1)->n);
    return 1;
}

static int cfxl_array_tostring(lua_State *L) {
    cfxl_array *a = cfxl_test_array(L, 1);
    int shared = luaL_testudata(L, 1, CFXL_SHARED) != NULL;
    if (!a) luaL_typeerror(L, 1, CFXL_ARRAY);
    lua_pushfstring(L, "conflux.array(%s, %I%s)", cfx_dtype_name((cfx_dtype)a->dtype), (lua_Integer)a->n,
                    !shared ? "" : a->data ? ", shared" : ", freed");
    return 1;
}

static int cfxl_array_dtype(lua_State *L) {
    lua_pushstring(L, cfx_dtype_name((cfx_dtype)cfxl_check_array(L, 1)->dtype));
    return 1;
}

/* a:totable([t]) -> t: elements 1..n into t (a new table when absent). */
static int cfxl_array_totable(lua_State *L) {
    cfxl_array *a = cfxl_check_array(L, 1);
    int64_t i;
    if (lua_istable(L, 2)) lua_settop(L, 2);
    else {
        lua_settop(L, 1);
        lua_createtable(L, a->n > INT32_MAX ? 0 : (int)a->n, 0);
    }
    for (i = 0; i < a->n; i++) {
        cfxl_push_elem(L, a, i);
        lua_seti(L, 2, (lua_Integer)(i + 1));
    }
    return 1;
}

/* a:fill(v) -> a */
static int cfxl_array_fill(lua_State *L) {
    cfxl_array *a = cfxl_check_array(L, 1);
    int64_t i;
    const char *err;
    luaL_checkany(L, 2);
    if (a->n == 0) {
        lua_settop(L, 1);
        return 1;
    }
    err = cfxl_set_elem(L, a, 0, 2);
    if (err) return luaL_error(L, "conflux.array: %s, got %s", err, luaL_typename(L, 2));
    for (i = 1; i < a->n; i++)
        memcpy((unsigned char *)cfxl_data(a) + i * a->elem, cfxl_data(a), (size_t)a->elem);
    lua_settop(L, 1);
    return 1;
}

/* a:tobytes() -> the raw elements as a string (native byte order). */
static int cfxl_array_tobytes(lua_State *L) {
    cfxl_array *a = cfxl_check_array(L, 1);
    lua_pushlstring(L, (const char *)cfxl_data(a), (size_t)(a->n * a->elem));
    return 1;
}

/* a:copy() -> a new array with the same elements. */
static int cfxl_array_copy(lua_State *L) {
    cfxl_array *a = cfxl_check_array(L, 1);
    cfxl_array *b = cfxl_new_array(L, a->dtype, a->n);
    if (!b) return luaL_error(L, "conflux.array: out of memory");
    memcpy(cfxl_data(b), cfxl_data(a), (size_t)(a->n * a->elem));
    return 1;
}

static int cfxl_is_array(lua_State *L) {
    lua_pushboolean(L, cfxl_test_array(L, 1) != NULL);
    return 1;
}

/* array_state(x) -> "private" | "shared" | "freed" (a freed shared array) | nil (not an array) */
static int cfxl_array_state(lua_State *L) {
    cfxl_array *a = cfxl_test_array(L, 1);
    if (!a) lua_pushnil(L);
    else if (!luaL_testudata(L, 1, CFXL_SHARED)) lua_pushliteral(L, "private");
    else if (a->data) lua_pushliteral(L, "shared");
    else lua_pushliteral(L, "freed");
    return 1;
}

static void cfxl_register_array(lua_State *L) {
    static const luaL_Reg meta[] = {{"__index", cfxl_array_index}, {"__newindex", cfxl_array_newindex},
                                    {"__len", cfxl_array_len}, {"__tostring", cfxl_array_tostring},
                                    {NULL, NULL}};
    static const luaL_Reg methods[] = {{"dtype", cfxl_array_dtype}, {"totable", cfxl_array_totable},
                                       {"fill", cfxl_array_fill}, {"tobytes", cfxl_array_tobytes},
                                       {"copy", cfxl_array_copy}, {NULL, NULL}};
    const char *names[] = {CFXL_ARRAY, CFXL_SHARED};
    int i;
    luaL_newlib(L, methods);  /* one table: __index looks methods up in CFXL_ARRAY's */
    for (i = 0; i < 2; i++) {
        if (luaL_newmetatable(L, names[i])) {
            luaL_setfuncs(L, meta, 0);
            lua_pushvalue(L, -2);
            lua_setfield(L, -2, "methods");
            if (i == 1) {
                lua_pushcfunction(L, cfxl_shared_array_gc);
                lua_setfield(L, -2, "__gc");
            }
        }
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
}

/* compression_names() -> { name = code, ... }: the names every binding accepts (bind.h). */
static int cfxl_compression_names(lua_State *L) {
    lua_createtable(L, 0, CFX_COMPRESSION_COUNT);
    for (int i = 0; i < CFX_COMPRESSION_COUNT; i++) {
        lua_pushinteger(L, i);
        lua_setfield(L, -2, cfx_bind_compression_names[i]);
    }
    return 1;
}

/* ---- context ---- */

/* Sets the fields of the struct at `base` (fields[0..count): bind.h) from the table at `idx` (nil:
 * none), by name: numbers >= 0, true/false for 1/0. CFX_OK, or the status with the message in
 * `msg` naming the option (`kind`: "init", "reform"). */
static cfx_status cfxl_set_options(lua_State *L, int idx, void *base, const cfx_bind_field *fields,
                                   size_t count, const char *kind, char *msg, size_t msg_size) {
    if (lua_isnoneornil(L, idx)) return CFX_OK;
    luaL_checktype(L, idx, LUA_TTABLE);
    lua_pushnil(L);
    while (lua_next(L, idx) != 0) {
        double v;
        cfx_status s;
        if (lua_type(L, -2) != LUA_TSTRING) {
            lua_pop(L, 2);
            snprintf(msg, msg_size, "%s option names must be strings", kind);
            return CFX_ERR_INVALID_ARGUMENT;
        }
        if (lua_isboolean(L, -1)) {
            v = lua_toboolean(L, -1) ? 1.0 : 0.0;
        } else if (lua_isnumber(L, -1)) {
            v = (double)lua_tonumber(L, -1);
        } else {
            snprintf(msg, msg_size, "%s option %s must be a number, not %s", kind,
                     lua_tostring(L, -2), luaL_typename(L, -1));
            lua_pop(L, 2);
            return CFX_ERR_INVALID_ARGUMENT;
        }
        s = cfx_bind_set_field(base, fields, count, kind, lua_tostring(L, -2), v, msg, msg_size);
        lua_pop(L, 1);
        if (s != CFX_OK) {
            lua_pop(L, 1);
            return s;
        }
    }
    return CFX_OK;
}

/* The context made by a call that returned `s` (pass the context only after that call: the
 * order of a call's arguments is unspecified). */
static int cfxl_push_ctx(lua_State *L, cfx_status s, cfx_context *ctx) {
    if (s != CFX_OK) return cfxl_fail_last(L, s);
    SWIG_NewPointerObj(L, ctx, SWIGTYPE_p_cfx_context, 0);
    return 1;
}

/* init(options) -> ctx | nil, status, message. options: nil or a table of cfx_init_options fields
 * by name (cfx_bind_init_option: numbers >= 0, true/false for 1/0; the transport as its code). */
static int cfxl_init(lua_State *L) {
    cfx_init_options o;
    cfx_context *ctx = NULL;
    char msg[512];
    cfx_status s = cfx_init_options_init(&o, CFX_INIT_OPTIONS_VERSION);
    if (s != CFX_OK) return cfxl_fail_last(L, s);
    s = cfxl_set_options(L, 1, &o, cfx_bind_init_fields, CFX_BIND_INIT_FIELD_COUNT, "init", msg, sizeof msg);
    if (s != CFX_OK) return cfxl_fail(L, s, msg);
    s = cfx_init(&o, &ctx);
    return cfxl_push_ctx(L, s, ctx);
}

/* The reform options of the table at idx (nil: the defaults, CFX_ELASTIC_* or built-in) into *o;
 * CFX_OK or the status, the message in msg. */
static cfx_status cfxl_reform_options(lua_State *L, int idx, cfx_reform_options *o, char *msg,
                                      size_t msg_size) {
    cfx_status s = cfx_reform_options_init(o, CFX_REFORM_OPTIONS_VERSION);
    if (s != CFX_OK) {
        snprintf(msg, msg_size, "%s", cfx_last_error());
        return s;
    }
    return cfxl_set_options(L, idx, o, cfx_bind_reform_fields, CFX_BIND_REFORM_FIELD_COUNT, "reform",
                            msg, msg_size);
}

/* elastic_init(reform_options, init_options) -> ctx | nil, status, message (cfx_elastic_init):
 * reform_options a table of cfx_reform_options fields by name (min_size, max_size, timeout_s,
 * settle_s), init_options as for init; either may be nil. */
static int cfxl_elastic_init(lua_State *L) {
    cfx_init_options io;
    cfx_reform_options ro;
    cfx_context *ctx = NULL;
    char msg[512];
    cfx_status s = cfx_init_options_init(&io, CFX_INIT_OPTIONS_VERSION);
    if (s != CFX_OK) return cfxl_fail_last(L, s);
    s = cfxl_reform_options(L, 1, &ro, msg, sizeof msg);
    if (s == CFX_OK)
        s = cfxl_set_options(L, 2, &io, cfx_bind_init_fields, CFX_BIND_INIT_FIELD_COUNT, "init", msg, sizeof msg);
    if (s != CFX_OK) return cfxl_fail(L, s, msg);
    s = cfx_elastic_init(&io, &ro, &ctx);
    return cfxl_push_ctx(L, s, ctx);
}

/* reform(ctx, reform_options) -> true | nil, status, message (cfx_context_reform). */
static int cfxl_reform(lua_State *L) {
    cfx_context *ctx = cfxl_ctx(L, 1);
    cfx_reform_options ro;
    char msg[512];
    cfx_status s = cfxl_reform_options(L, 2, &ro, msg, sizeof msg);
    if (s != CFX_OK) return cfxl_fail(L, s, msg);
    s = cfx_context_reform(ctx, &ro);
    if (s != CFX_OK) return cfxl_fail_last(L, s);
    lua_pushboolean(L, 1);
    return 1;
}

/* membership_pending(ctx) -> n | nil, status, message (cfx_membership_pending). */
static int cfxl_membership_pending(lua_State *L) {
    int n = 0;
    cfx_status s = cfx_membership_pending(cfxl_ctx(L, 1), &n);
    if (s != CFX_OK) return cfxl_fail_last(L, s);
    lua_pushinteger(L, n);
    return 1;
}

/* subset(ctx, ranks) -> the subset's context | false (this rank is not listed) | nil, status,
 * message. ranks: a sequence of integers, the same on every rank (cfx_context_create_subset). */
static int cfxl_subset(lua_State *L) {
    cfx_context *ctx = cfxl_ctx(L, 1);
    cfx_context *out = NULL;
    lua_Integer n, i;
    int *ranks;
    cfx_status s;
    luaL_checktype(L, 2, LUA_TTABLE);
    n = luaL_len(L, 2);
    ranks = malloc((size_t)(n > 0 ? n : 1) * sizeof *ranks);
    if (!ranks) return cfxl_fail(L, CFX_ERR_OUT_OF_MEMORY, "subset: out of memory");
    for (i = 1; i <= n; i++) {
        int isnum = 0;
        lua_Integer v;
        lua_geti(L, 2, i);
        v = lua_tointegerx(L, -1, &isnum);
        lua_pop(L, 1);
        if (!isnum || v < INT_MIN || v > INT_MAX) {
            free(ranks);
            return luaL_argerror(L, 2, "ranks must be integers");
        }
        ranks[i - 1] = (int)v;
    }
    s = cfx_context_create_subset(ctx, ranks, (size_t)n, &out);
    free(ranks);
    if (s != CFX_OK) return cfxl_fail_last(L, s);
    if (!out) {
        lua_pushboolean(L, 0);
        return 1;
    }
    SWIG_NewPointerObj(L, out, SWIGTYPE_p_cfx_context, 0);
    return 1;
}

/* ---- collectives: (ctx, name|nil, array, ...) -> handle | nil, status, message ---- */

static cfx_tensor cfxl_tensor(cfxl_array *a, int64_t *shape) {
    cfx_tensor t;
    shape[0] = a->n;
    t.data = a->n ? cfxl_data(a) : NULL;
    t.shape = shape;
    t.ndim = 1;
    t.dtype = a->dtype;
    t.device = CFX_DEVICE_CPU;
    t.stream = NULL;
    return t;
}

static int cfxl_push_handle(lua_State *L, cfx_status s, cfx_handle h) {
    if (s != CFX_OK) return cfxl_fail_last(L, s);
    lua_pushinteger(L, (lua_Integer)h);
    return 1;
}

/* allreduce(ctx, name, array, op [, prescale, postscale [, compression]]) -> handle | nil, status,
 * message */
static int cfxl_allreduce(lua_State *L) {
    cfx_context *ctx = cfxl_ctx(L, 1);
    const char *name = luaL_optstring(L, 2, NULL);
    cfxl_array *a = cfxl_check_array(L, 3);
    int op = (int)luaL_checkinteger(L, 4);
    double pre = luaL_optnumber(L, 5, 1.0), post = luaL_optnumber(L, 6, 1.0);
    int32_t compression = (int32_t)luaL_optinteger(L, 7, CFX_COMPRESSION_NONE);
    int64_t shape[1];
    cfx_tensor t = cfxl_tensor(a, shape);
    cfx_handle h = 0;
    cfx_status s = cfx_bind_allreduce_async(ctx, name, &t, NULL, op, pre, post, compression, &h);
    return cfxl_push_handle(L, s, h);
}

static int cfxl_allgather(lua_State *L) {
    cfx_context *ctx = cfxl_ctx(L, 1);
    const char *name = luaL_optstring(L, 2, NULL);
    cfxl_array *a = cfxl_check_array(L, 3);
    int64_t shape[1];
    cfx_tensor t = cfxl_tensor(a, shape);
    cfx_handle h = 0;
    cfx_status s = cfx_allgather_async(ctx, name, &t, &h);
    return cfxl_push_handle(L, s, h);
}

static int cfxl_broadcast(lua_State *L) {
    cfx_context *ctx = cfxl_ctx(L, 1);
    const char *name = luaL_optstring(L, 2, NULL);
    cfxl_array *a = cfxl_check_array(L, 3);
    int root = (int)luaL_checkinteger(L, 4);
    int64_t shape[1];
    cfx_tensor t = cfxl_tensor(a, shape);
    cfx_handle h = 0;
    cfx_status s = cfx_broadcast_async(ctx, name, &t, root, &h);
    return cfxl_push_handle(L, s, h);
}

static int cfxl_alltoall(lua_State *L) {
    cfx_context *ctx = cfxl_ctx(L, 1);
    const char *name = luaL_optstring(L, 2, NULL);
    cfxl_array *a = cfxl_check_array(L, 3);
    int64_t shape[1], *splits = NULL;
    size_t n = 0, i;
    cfx_tensor t = cfxl_tensor(a, shape);
    cfx_handle h = 0;
    cfx_status s;
    if (lua_istable(L, 4)) {
        n = (size_t)luaL_len(L, 4);
        splits = (int64_t *)lua_newuserdatauv(L, (n ? n : 1) * sizeof *splits, 0);  /* freed by the GC */
        for (i = 0; i < n; i++) {
            int ok = 0;
            lua_geti(L, 4, (lua_Integer)(i + 1));
            splits[i] = (int64_t)lua_tointegerx(L, -1, &ok);
            lua_pop(L, 1);
            if (!ok) return cfxl_fail(L, CFX_ERR_INVALID_ARGUMENT, "splits must be integers");
        }
    } else if (!lua_isnoneornil(L, 4)) {
        return luaL_argerror(L, 4, "table of split sizes or nil expected");
    }
    s = cfx_alltoall_async(ctx, name, &t, splits, n, &h);
    return cfxl_push_handle(L, s, h);
}

static int cfxl_reducescatter(lua_State *L) {
    cfx_context *ctx = cfxl_ctx(L, 1);
    const char *name = luaL_optstring(L, 2, NULL);
    cfxl_array *a = cfxl_check_array(L, 3);
    int op = (int)luaL_checkinteger(L, 4);
    double pre = luaL_optnumber(L, 5, 1.0), post = luaL_optnumber(L, 6, 1.0);
    int64_t shape[1];
    cfx_tensor t = cfxl_tensor(a, shape);
    cfx_handle h = 0;
    cfx_status s = cfx_reducescatter_async(ctx, name, &t, (cfx_reduce_op)op, pre, post, &h);
    return cfxl_push_handle(L, s, h);
}

static int cfxl_barrier(lua_State *L) {
    cfx_handle h = 0;
    cfx_status s = cfx_barrier_async(cfxl_ctx(L, 1), &h);
    return cfxl_push_handle(L, s, h);
}

static int cfxl_join(lua_State *L) {
    cfx_handle h = 0;
    cfx_status s = cfx_join_async(cfxl_ctx(L, 1), &h);
    return cfxl_push_handle(L, s, h);
}

/* ---- handles ---- */

/* poll(ctx, h) -> done (boolean) | nil, status, message */
static int cfxl_poll(lua_State *L) {
    int done = 0;
    cfx_status s = cfx_poll(cfxl_ctx(L, 1), cfxl_check_handle(L, 2), &done);
    if (s != CFX_OK) return cfxl_fail_last(L, s);
    lua_pushboolean(L, done);
    return 1;
}

/* wait(ctx, h [, timeout_s]) -> status, message (the collective's; CFX_ERR_TIMEOUT if still pending) */
static int cfxl_wait(lua_State *L) {
    cfx_context *ctx = cfxl_ctx(L, 1);
    cfx_handle h = cfxl_check_handle(L, 2);
    double timeout = luaL_optnumber(L, 3, -1.0);
    cfx_status s = cfx_wait(ctx, h, timeout);
    const char *msg;
    lua_pushinteger(L, (lua_Integer)s);
    if (s == CFX_OK) msg = "";
    else if (s == CFX_ERR_TIMEOUT || s == CFX_ERR_STALE_HANDLE) msg = cfx_last_error();
    else {
        msg = cfx_handle_message(ctx, h);
        if (!msg || !msg[0]) msg = cfx_last_error();
    }
    lua_pushstring(L, msg && msg[0] ? msg : cfx_status_string(s));
    return 2;
}

static int cfxl_release(lua_State *L) {
    lua_pushinteger(L, (lua_Integer)cfx_handle_release(cfxl_ctx(L, 1), cfxl_check_handle(L, 2)));
    return 1;
}

/* run(ctx, kind, name, data, arg, prescale, postscale, compression, dtype) -> true | nil, status,
 * message: the blocking allreduce (kind 0, arg = op) or broadcast (kind 1, arg = root) of
 * conflux.lua in one call: submit, wait, copy a table's result back, release. `data` is an array
 * (dtype, when not nil, must be its dtype) or a table (converted to dtype, float64 when nil; up to
 * CFXL_RUN_STACK bytes on the C stack, so the lone small call allocates nothing). No handle
 * outlives the call, so the Lua side tracks nothing. */
#define CFXL_RUN_STACK 512
static int cfxl_run(lua_State *L) {
    cfx_context *ctx = cfxl_ctx(L, 1);
    int kind = (int)luaL_checkinteger(L, 2);
    const char *name = luaL_optstring(L, 3, NULL);
    int arg = (int)luaL_checkinteger(L, 5);
    double pre = luaL_optnumber(L, 6, 1.0), post = luaL_optnumber(L, 7, 1.0);
    int32_t compression = (int32_t)luaL_optinteger(L, 8, CFX_COMPRESSION_NONE);
    int32_t dtype = (int32_t)luaL_optinteger(L, 9, -1);
    _Alignas(64) unsigned char stack[CFXL_RUN_STACK];
    cfxl_array staged, *a = cfxl_test_array(L, 4);
    int64_t shape[1], i;
    cfx_tensor t;
    cfx_handle h = 0;
    cfx_status s;
    if (a) {
        if (!a->data) return cfxl_fail(L, CFX_ERR_INVALID_ARGUMENT, "the shared array was freed");
        if (dtype >= 0 && dtype != a->dtype) {
            lua_pushfstring(L, "the array holds %s, not %s", cfx_dtype_name((cfx_dtype)a->dtype),
                            cfx_dtype_name((cfx_dtype)dtype));
            return cfxl_fail(L, CFX_ERR_INVALID_ARGUMENT, lua_tostring(L, -1));
        }
    } else if (lua_istable(L, 4)) {
        staged.dtype = dtype >= 0 ? dtype : CFX_FLOAT64;
        staged.elem = (int32_t)cfx_dtype_size((cfx_dtype)staged.dtype);
        staged.n = (int64_t)luaL_len(L, 4);
        if (staged.elem == 0) return cfxl_fail(L, CFX_ERR_INVALID_ARGUMENT, "unknown dtype");
        if ((uint64_t)staged.n > SIZE_MAX / 2 / (uint64_t)staged.elem)
            return cfxl_fail(L, CFX_ERR_OUT_OF_MEMORY, "table too large");
        if (staged.n * staged.elem <= CFXL_RUN_STACK) staged.data = stack;
        else staged.data = lua_newuserdatauv(L, (size_t)(staged.n * staged.elem), 0); /* the GC frees it */
        if (cfxl_from_table(L, &staged, 4) != 0)
            return cfxl_fail(L, CFX_ERR_INVALID_ARGUMENT, lua_tostring(L, -1));
        a = &staged;
    } else {
        lua_pushfstring(L, "data must be a conflux.array or a table of numbers, got %s", luaL_typename(L, 4));
        return cfxl_fail(L, CFX_ERR_INVALID_ARGUMENT, lua_tostring(L, -1));
    }
    t = cfxl_tensor(a, shape);
    {
        cfx_bind_request r = {kind == 1 ? CFX_BIND_BROADCAST : CFX_BIND_ALLREDUCE, name, &t, NULL,
                              arg, pre, post, compression};
        cfx_status waited;
        s = cfx_bind_run(ctx, &r, -1.0, &h, &waited);
        if (s == CFX_OK) s = waited;
    }
    if (s != CFX_OK) return cfxl_fail_last(L, s); /* cfx_bind_run leaves the collective's message */
    if (a == &staged) {
        for (i = 0; i < a->n; i++) {
            cfxl_push_elem(L, a, i);
            lua_seti(L, 4, (lua_Integer)(i + 1));
        }
    }
    lua_pushboolean(L, 1);
    return 1;
}

/* output(ctx, h, index) -> new array holding output `index` | nil, status, message */
static int cfxl_output(lua_State *L) {
    cfx_context *ctx = cfxl_ctx(L, 1);
    cfx_handle h = cfxl_check_handle(L, 2);
    size_t index = (size_t)luaL_optinteger(L, 3, 0);
    cfx_tensor t;
    int64_t n = 1;
    int32_t i;
    cfxl_array *a;
    cfx_status s = cfx_handle_output(ctx, h, index, &t);
    if (s != CFX_OK) return cfxl_fail_last(L, s);
    for (i = 0; i < t.ndim; i++) n *= t.shape[i];
    a = cfxl_new_array(L, t.dtype, n);
    if (!a) return cfxl_fail(L, CFX_ERR_OUT_OF_MEMORY, "output too large");
    if (n > 0) memcpy(cfxl_data(a), t.data, (size_t)(n * a->elem));
    return 1;
}

/* splits(ctx, h, index) -> table of per-rank row counts | nil, status, message */
static int cfxl_splits(lua_State *L) {
    cfx_context *ctx = cfxl_ctx(L, 1);
    cfx_handle h = cfxl_check_handle(L, 2);
    size_t index = (size_t)luaL_optinteger(L, 3, 0);
    const int64_t *sp = NULL;
    int n = cfx_size(ctx), i;
    cfx_status s = cfx_handle_splits(ctx, h, index, &sp);
    if (s != CFX_OK) return cfxl_fail_last(L, s);
    lua_createtable(L, n, 0);
    for (i = 0; i < n; i++) {
        lua_pushinteger(L, (lua_Integer)sp[i]);
        lua_seti(L, -2, i + 1);
    }
    return 1;
}

static int cfxl_join_rank(lua_State *L) {
    int r = -1;
    cfx_status s = cfx_handle_join_rank(cfxl_ctx(L, 1), cfxl_check_handle(L, 2), &r);
    if (s != CFX_OK) return cfxl_fail_last(L, s);
    lua_pushinteger(L, r);
    return 1;
}

/* ---- gradient sets ----
 * userdata "conflux.gradset" (cfx_gradset *); its user value is a table index -> the gradient's
 * array (borrowed: the caller's; owned: after commit, a header-only "conflux.array" whose elements
 * are the set's storage and whose user value is the set, so the set lives while any view does).
 * Before commit an owned entry is {dtype, n}. free and __gc detach every view (its data NULL, so
 * it raises "freed" instead of touching released memory) before cfx_gradset_free. */
#define CFXL_GRADSET "conflux.gradset"

typedef struct cfxl_gradset {
    cfx_gradset *set;
    int owned;
} cfxl_gradset;

static cfxl_gradset *cfxl_check_gradset(lua_State *L, int idx) {
    cfxl_gradset *g = (cfxl_gradset *)luaL_checkudata(L, idx, CFXL_GRADSET);
    if (!g->set) luaL_argerror(L, idx, "the gradient set was freed");
    return g;
}

/* gradset_new(ctx, name, op, bucket_bytes, accumulate_steps, prescale, postscale, owned,
 * compression, error_feedback) -> set | nil, status, message */
static int cfxl_gradset_new(lua_State *L) {
    cfx_context *ctx = cfxl_ctx(L, 1);
    const char *name = luaL_checkstring(L, 2);
    cfx_gradset_options o;
    cfxl_gradset *g;
    cfx_status s = cfx_gradset_options_init(&o, CFX_GRADSET_OPTIONS_VERSION);
    if (s != CFX_OK) return cfxl_fail_last(L, s);
    o.op = (int32_t)luaL_optinteger(L, 3, o.op);
    o.bucket_bytes = (int64_t)luaL_optinteger(L, 4, o.bucket_bytes);
    o.accumulate_steps = (int32_t)luaL_optinteger(L, 5, o.accumulate_steps);
    o.prescale = luaL_optnumber(L, 6, o.prescale);
    o.postscale = luaL_optnumber(L, 7, o.postscale);
    o.owned = lua_isnoneornil(L, 8) ? 1 : lua_toboolean(L, 8);
    o.compression = (int32_t)luaL_optinteger(L, 9, o.compression);
    o.error_feedback = lua_toboolean(L, 10);
    g = (cfxl_gradset *)lua_newuserdatauv(L, sizeof *g, 1);
    g->set = NULL;
    g->owned = o.owned;
    luaL_setmetatable(L, CFXL_GRADSET); /* __gc before the set exists: nothing can leak */
    lua_newtable(L);
    lua_setiuservalue(L, -2, 1);
    s = cfx_gradset_create(ctx, name, &o, &g->set);
    if (s != CFX_OK) return cfxl_fail_last(L, s);
    return 1;
}

/* gradset_add(set, name, dtype, shape (table of ints), array | nil) -> index (1-based) | nil, status,
 * message. Owned sets take no array; borrowed sets need one of exactly the shape's element count. */
static int cfxl_gradset_add(lua_State *L) {
    cfxl_gradset *g = cfxl_check_gradset(L, 1);
    const char *name = luaL_checkstring(L, 2);
    int32_t dtype = (int32_t)luaL_checkinteger(L, 3), index = -1;
    int64_t shape[CFX_MAX_NDIM], n = 1;
    lua_Integer nd, i;
    cfxl_array *a = NULL;
    cfx_tensor t;
    cfx_status s;
    luaL_checktype(L, 4, LUA_TTABLE);
    nd = luaL_len(L, 4);
    if (nd > CFX_MAX_NDIM) return cfxl_fail(L, CFX_ERR_INVALID_ARGUMENT, "too many dimensions");
    for (i = 0; i < nd; i++) {
        int isnum;
        lua_geti(L, 4, i + 1);
        shape[i] = (int64_t)lua_tointegerx(L, -1, &isnum);
        lua_pop(L, 1);
        if (!isnum) return cfxl_fail(L, CFX_ERR_INVALID_ARGUMENT, "shape entries must be integers");
        n *= shape[i];
    }
    if (!lua_isnoneornil(L, 5)) {
        a = cfxl_check_array(L, 5);
        if (g->owned)
            return cfxl_fail(L, CFX_ERR_INVALID_ARGUMENT,
                             "the set owns its storage: add takes a shape and dtype, not an array");
        if (a->dtype != dtype || a->n != n)
            return cfxl_fail(L, CFX_ERR_INVALID_ARGUMENT,
                             "the array's dtype or length does not match the gradient's");
    } else if (!g->owned) {
        return cfxl_fail(L, CFX_ERR_INVALID_ARGUMENT, "a borrowed set (owned = false) needs an array");
    }
    t.data = a && a->n ? cfxl_data(a) : NULL;
    t.shape = nd ? shape : NULL;
    t.ndim = (int32_t)nd;
    t.dtype = dtype;
    t.device = CFX_DEVICE_CPU;
    t.stream = NULL;
    s = cfx_gradset_add(g->set, name, &t, &index);
    if (s != CFX_OK) return cfxl_fail_last(L, s);
    lua_getiuservalue(L, 1, 1);
    if (a) {
        lua_pushvalue(L, 5);
    } else {
        lua_createtable(L, 2, 0);
        lua_pushinteger(L, dtype);
        lua_seti(L, -2, 1);
        lua_pushinteger(L, (lua_Integer)n);
        lua_seti(L, -2, 2);
    }
    lua_seti(L, -2, (lua_Integer)index + 1);
    lua_pushinteger(L, (lua_Integer)index + 1);
    return 1;
}

/* gradset_commit(set) -> true | nil, status, message; owned sets get their views. */
static int cfxl_gradset_commit(lua_State *L) {
    cfxl_gradset *g = cfxl_check_gradset(L, 1);
    lua_Integer i, n;
    cfx_status s = cfx_gradset_commit(g->set);
    if (s != CFX_OK) return cfxl_fail_last(L, s);
    lua_getiuservalue(L, 1, 1);
    n = luaL_len(L, -1);
    for (i = 1; g->owned && i <= n; i++) {
        cfxl_array *v;
        void *data = NULL;
        lua_geti(L, -1, i);
        if (!lua_istable(L, -1)) { lua_pop(L, 1); continue; }
        lua_geti(L, -1, 1);
        lua_geti(L, -2, 2);
        v = (cfxl_array *)lua_newuserdatauv(L, sizeof *v, 1);
        v->dtype = (int32_t)lua_tointeger(L, -3);
        v->n = (int64_t)lua_tointeger(L, -2);
        v->elem = (int32_t)cfx_dtype_size((cfx_dtype)v->dtype);
        s = cfx_gradset_data(g->set, (int32_t)(i - 1), &data);
        if (s != CFX_OK) return cfxl_fail_last(L, s);
        v->data = data;
        luaL_setmetatable(L, CFXL_ARRAY);
        lua_pushvalue(L, 1);
        lua_setiuservalue(L, -2, 1);
        lua_seti(L, -5, i);  /* views[i] = view */
        lua_pop(L, 3);
    }
    lua_pushboolean(L, 1);
    return 1;
}

/* gradset_array(set, i) -> the gradient's array (owned: nil before commit) */
static int cfxl_gradset_array(lua_State *L) {
    cfxl_check_gradset(L, 1);
    lua_getiuservalue(L, 1, 1);
    lua_geti(L, -1, luaL_checkinteger(L, 2));
    if (lua_istable(L, -1)) lua_pushnil(L);
    return 1;
}

/* gradset_ready(set, i) -> true | nil, status, message (i 1-based) */
static int cfxl_gradset_ready(lua_State *L) {
    cfxl_gradset *g = cfxl_check_gradset(L, 1);
    cfx_status s = cfx_gradset_ready(g->set, (int32_t)(luaL_checkinteger(L, 2) - 1));
    if (s != CFX_OK) return cfxl_fail_last(L, s);
    lua_pushboolean(L, 1);
    return 1;
}

/* gradset_wait(set [, timeout_s]) -> status, message */
static int cfxl_gradset_wait(lua_State *L) {
    cfxl_gradset *g = cfxl_check_gradset(L, 1);
    cfx_status s = cfx_gradset_wait(g->set, luaL_optnumber(L, 2, -1.0));
    lua_pushinteger(L, (lua_Integer)s);
    lua_pushstring(L, s == CFX_OK ? "" : cfx_last_error());
    return 2;
}

/* gradset_free(set): detaches the views and frees the set; a freed set is a no-op (also __gc). */
static int cfxl_gradset_free(lua_State *L) {
    cfxl_gradset *g = (cfxl_gradset *)luaL_checkudata(L, 1, CFXL_GRADSET);
    if (!g->set) return 0;
    if (g->owned) {
        lua_Integer i, n;
        lua_getiuservalue(L, 1, 1);
        n = luaL_len(L, -1);
        for (i = 1; i <= n; i++) {
            cfxl_array *v;
            lua_geti(L, -1, i);
            v = (cfxl_array *)luaL_testudata(L, -1, CFXL_ARRAY);
            if (v) v->data = NULL;
            lua_pop(L, 1);
        }
        lua_pop(L, 1);
    }
    cfx_gradset_free(g->set);
    g->set = NULL;
    return 0;
}

static void cfxl_register_gradset(lua_State *L) {
    if (luaL_newmetatable(L, CFXL_GRADSET)) {
        lua_pushcfunction(L, cfxl_gradset_free);
        lua_setfield(L, -2, "__gc");
    }
    lua_pop(L, 1);
}

/* Wall-clock seconds (C11 timespec_get), for timing loops in Lua (os.clock is CPU time). */
static int cfxl_clock(lua_State *L) {
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    lua_pushnumber(L, (lua_Number)ts.tv_sec + (lua_Number)ts.tv_nsec * 1e-9);
    return 1;
}
/* address(ctx | gradient set) -> the C pointer as an integer, for native code that calls the C ABI
 * on this binding's objects (bench/lang's loops). */
static int cfxl_address(lua_State *L) {
    cfxl_gradset *g = (cfxl_gradset *)luaL_testudata(L, 1, CFXL_GRADSET);
    void *p = g ? (void *)g->set : (void *)cfxl_ctx(L, 1);
    lua_pushinteger(L, (lua_Integer)(intptr_t)p);
    return 1;
}
%}

%native(array_new) int cfxl_array_new(lua_State *L);
%native(shared_array_new) int cfxl_shared_array_new(lua_State *L);
%native(shared_array_free) int cfxl_shared_array_free(lua_State *L);
%native(array_state) int cfxl_array_state(lua_State *L);
%native(address) int cfxl_address(lua_State *L);
%native(is_array) int cfxl_is_array(lua_State *L);
%native(init) int cfxl_init(lua_State *L);
%native(subset) int cfxl_subset(lua_State *L);
%native(elastic_init) int cfxl_elastic_init(lua_State *L);
%native(reform) int cfxl_reform(lua_State *L);
%native(membership_pending) int cfxl_membership_pending(lua_State *L);
%native(allreduce) int cfxl_allreduce(lua_State *L);
%native(run) int cfxl_run(lua_State *L);
%native(compression_names) int cfxl_compression_names(lua_State *L);
%native(allgather) int cfxl_allgather(lua_State *L);
%native(broadcast) int cfxl_broadcast(lua_State *L);
%native(alltoall) int cfxl_alltoall(lua_State *L);
%native(reducescatter) int cfxl_reducescatter(lua_State *L);
%native(barrier) int cfxl_barrier(lua_State *L);
%native(join) int cfxl_join(lua_State *L);
%native(poll) int cfxl_poll(lua_State *L);
%native(wait) int cfxl_wait(lua_State *L);
%native(release) int cfxl_release(lua_State *L);
%native(output) int cfxl_output(lua_State *L);
%native(splits) int cfxl_splits(lua_State *L);
%native(join_rank) int cfxl_join_rank(lua_State *L);
%native(clock) int cfxl_clock(lua_State *L);
%native(gradset_new) int cfxl_gradset_new(lua_State *L);
%native(gradset_add) int cfxl_gradset_add(lua_State *L);
%native(gradset_commit) int cfxl_gradset_commit(lua_State *L);
%native(gradset_array) int cfxl_gradset_array(lua_State *L);
%native(gradset_ready) int cfxl_gradset_ready(lua_State *L);
%native(gradset_wait) int cfxl_gradset_wait(lua_State *L);
%native(gradset_free) int cfxl_gradset_free(lua_State *L);

/* The array metatable exists as soon as the module is loaded. */
%init %{
  cfxl_register_array(L);
  cfxl_register_gradset(L);
%}
