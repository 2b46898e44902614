"""The collectives of `conflux` (NumPy) and `conflux.torch`, made from one table.

OPS names every collective once: the ABI entry point it calls, the parameters it takes after its
input, whether its input is one tensor or a group of them, whether it also works in place, and how
its out-of-place result is made. Each one exists as four functions (two when it has no in-place
form): `name(...)` blocks and returns the result, `name_async(...)` returns a Handle whose wait()
returns it, and `name_` / `name_async_` work in place and return the input itself.

install() writes these functions into the module of one array library. The library supplies an
Adapter (how it checks, describes, allocates and copies a tensor) and the docstrings; nothing else
differs. Each function is compiled from its parameter list, as dataclasses compiles __init__, so it
has its own signature and keyword names (`array` in one library, `tensor` in the other) and costs
a caller no more than a hand-written wrapper.
"""
import linecache
from typing import Callable, NamedTuple

from . import _capi
from . import _core

# ---- how the out-of-place result is made ----
LIKE = "like"      # the input's shape and dtype: the binding allocates it, the ABI writes it
COPY = "copy"      # the input's shape: a copy of the input, then the in-place collective on it
ROWS = "rows"      # along dim 0, known after negotiation: the engine allocates it, the binding
#                    copies it into a new tensor (a lone input needs a dim 0)
SPLITS = "rows+splits"  # ROWS, returned with the rows every rank sent this one


class Op(NamedTuple):
    name: str        # "allreduce": also the label of its handles and of its error messages
    entry: str       # the cfx_* function of conflux._capi
    params: tuple    # the parameters after the input, in signature order (keys of PARAMS)
    grouped: bool    # a list of inputs, negotiated and completed together
    inplace: bool    # has the in-place forms
    result: str      # LIKE, COPY, ROWS or SPLITS


REQUIRED = object()

# parameter: (default, how the ABI gets it: formatted with the parameter's name); `name` is
# always the ABI's first argument, before the tensor description.
PARAMS = {
    "name": (None, None),
    "op": (_core.Average, "check_op({0})"),
    "root_rank": (REQUIRED, "check_root({0})"),
    "splits": (None, "check_splits({0})"),
    "prescale_factor": (1.0, 'check_scale({0}, "{0}")'),
    "postscale_factor": (1.0, 'check_scale({0}, "{0}")'),
    "compression": (_core.Compression.none, "check_compression({0})"),
}
_REDUCE = ("op", "name", "prescale_factor", "postscale_factor")
# Only the lone allreduce has per-call options in the ABI (cfx_allreduce_async_opts).
_ALLREDUCE = _REDUCE + ("compression",)
_NAME = ("name",)
_ROOT = ("root_rank", "name")
_SPLITS = ("splits", "name")

# Every op has a blocking and an async form (forms()).
OPS = (
    #  name                    ABI entry (cfx_py_*: the binding's)  params      grouped inplace result
    Op("allreduce",             "cfx_py_allreduce_async",            _ALLREDUCE, False,  True,   LIKE),
    Op("grouped_allreduce",     "cfx_grouped_allreduce_async",       _REDUCE,    True,   True,   LIKE),
    Op("allgather",             "cfx_allgather_async",               _NAME,      False,  False,  ROWS),
    Op("grouped_allgather",     "cfx_grouped_allgather_async",       _NAME,      True,   False,  ROWS),
    Op("broadcast",             "cfx_broadcast_async",               _ROOT,      False,  True,   COPY),
    Op("alltoall",              "cfx_alltoall_async",                _SPLITS,    False,  False,  SPLITS),
    Op("reducescatter",         "cfx_reducescatter_async",           _REDUCE,    False,  False,  ROWS),
    Op("grouped_reducescatter", "cfx_grouped_reducescatter_async",   _REDUCE,    True,   False,  ROWS),
)


def forms(op):
    """The public names of op's functions."""
    if op.inplace:
        return (op.name, op.name + "_", op.name + "_async", op.name + "_async_")
    return (op.name, op.name + "_async")


NAMES = tuple(name for op in OPS for name in forms(op))


class Adapter(NamedTuple):
    """What an array library supplies. `what` is the op's name, for error messages."""
    nouns: tuple           # the input parameter's name, lone and grouped: ("array", "arrays")
    inplace: Callable      # (x, what) -> x, or a view of its memory, checked for writing in place
    input: Callable        # (x, what) -> a contiguous tensor of x's values (x itself if it is)
    copy: Callable         # (x, what) -> a new contiguous tensor of x's values
    describe: Callable     # (t) -> the ABI's tuple (address, dtype, shape[, device, stream])
    output_like: Callable  # (t) -> (a new tensor for t's LIKE result, the address of its memory)
    ndim: Callable         # (t) -> t's number of dimensions
    output: Callable       # (handle, index, t) -> output `index` of a completed handle, as a new
    #                        tensor (t: the input it belongs to)
    as_splits: Callable    # (list of ints) -> received splits, as the library returns them
    autograd: dict         # op name -> the autograd Function its blocking out-of-place form
    #                        applies when differentiable(x, what) says x needs a gradient
    differentiable: Callable
    native: Callable = None  # the lone allreduce in native code (conflux._torch_native.allreduce):
    #                        (form, name, x, op, prescale, postscale, compression, ctx address) ->
    #                        the result, or None to take the Python path (_NATIVE)


# The bodies of the async forms (the blocking ones wait at the end: _blocking). Their globals
# (_namespace) are the adapter's fields, _core's submit and argument checks, and per op ENTRY
# (the ABI function), WHAT (the op's name) and AUTOGRAD. In the templates {x} is the input
# parameter, {params} the other parameters, {base} the op's name, {abi} the ABI's arguments after
# the tensor description(s) and output address(es).
_ASYNC = {
    (LIKE, False): """\
    t = input({x}, WHAT)
    out, address = output_like(t)
    return submit(ENTRY, (check_name(name), describe(t), address{abi}), (t, out),
                  lambda h: out, WHAT, name)
""",
    (LIKE, True): """\
    ts = [input(x, WHAT) for x in {x}]
    made = [output_like(t) for t in ts]
    outs = [out for out, _ in made]
    return submit(ENTRY, (check_name(name), [describe(t) for t in ts], [a for _, a in made]{abi}),
                  (ts, outs), lambda h: list(outs), WHAT, name)
""",
    (COPY, False): """\
    return {base}_async_(copy({x}, WHAT), {params})
""",
    (ROWS, False): """\
    t = input({x}, WHAT)
    if ndim(t) == 0:
        raise ValueError(WHAT + " needs at least one dimension (got a scalar)")
    return submit(ENTRY, (check_name(name), describe(t){abi}), t, lambda h: output(h, 0, t),
                  WHAT, name)
""",
    (ROWS, True): """\
    ts = [input(x, WHAT) for x in {x}]
    return submit(ENTRY, (check_name(name), [describe(t) for t in ts]{abi}), ts,
                  lambda h: [output(h, i, t) for i, t in enumerate(ts)], WHAT, name)
""",
    (SPLITS, False): """\
    t = input({x}, WHAT)
    if ndim(t) == 0:
        raise ValueError(WHAT + " needs at least one dimension (got a scalar)")
    return submit(ENTRY, (check_name(name), describe(t){abi}), t,
                  lambda h: (output(h, 0, t), as_splits(h.splits(0))), WHAT, name)
""",
}
# In place: the ABI's output address is None (LIKE), the result is the input itself.
_ASYNC_INPLACE = {
    False: """\
    t = inplace({x}, WHAT)
    return submit(ENTRY, (check_name(name), describe(t){none}{abi}), t, lambda h: {x}, WHAT,
                  name)
""",
    True: """\
    xs = list({x})
    ts = [inplace(x, WHAT) for x in xs]
    return submit(ENTRY, (check_name(name), [describe(t) for t in ts]{none}{abi}), ts,
                  lambda h: list(xs), WHAT, name)
""",
}
# The fast path (conflux._capi_native.cfx_py_run / cfx_py_submit: one call into C, which submits
# and, blocking, waits with the GIL released and releases the handle) for the lone allreduce and
# broadcast started through _core.submit. {fast} is the request's four values after the output
# address: three numbers, then the compression as the caller gave it (C converts it: a Python call
# less on every allreduce). The context comes last in the call, so bad arguments are reported
# before a missing init(), as through submit.
_FAST_KIND = {"allreduce": _capi._capi_native.CFX_PY_ALLREDUCE,
              "broadcast": _capi._capi_native.CFX_PY_BROADCAST}
_FAST = {
    LIKE: """\
    t = input({x}, WHAT)
    out, address = output_like(t)
    run(KIND, check_name(name), describe(t), address{fast}, context(), (t, out))
    return out
""",
    COPY: """\
    t = copy({x}, WHAT)
    run(KIND, check_name(name), describe(inplace(t, WHAT)), None{fast}, context(), t)
    return t
""",
}
_FAST_INPLACE = """\
    t = inplace({x}, WHAT)
    run(KIND, check_name(name), describe(t), None{fast}, context(), t)
    return {x}
"""
_FAST_ASYNC = {
    LIKE: """\
    t = input({x}, WHAT)
    out, address = output_like(t)
    ctx = context()
    return Handle(ctx, start(KIND, check_name(name), describe(t), address{fast}, ctx), (t, out),
                  lambda h: out, WHAT, name)
""",
}
_FAST_ASYNC_INPLACE = """\
    t = inplace({x}, WHAT)
    ctx = context()
    return Handle(ctx, start(KIND, check_name(name), describe(t), None{fast}, ctx), t,
                  lambda h: {x}, WHAT, name)
"""
_DIFFERENTIABLE = """\
    if differentiable({x}, WHAT):
        return AUTOGRAD.apply({x}, {params})
"""
# The lone allreduce where the adapter has it in native code: the plain case in one call, anything
# else (the native call returns None, as it does without a live context) through the Python body
# that follows. A blocking call still pending after the native call's first wait comes back as
# (handle id, keep, result): a Handle waits for the rest. {form}: 0 in place, 1 a new tensor.
_NATIVE = """\
    ctx = native_context()
    r = native({form}, name, {x}, op, prescale_factor, postscale_factor, compression, ctx.address)
    if r is not None:
        if r.__class__ is tuple:
            return wait(Handle(ctx, r[0], r[1], lambda h, v=r[2]: v, WHAT, name))
        return r
"""
_NATIVE_START = """\
    ctx = native_context()
    r = native(2, name, {x}, op, prescale_factor, postscale_factor, compression, ctx.address)
    if r is not None:
        return Handle(ctx, r, {x}, lambda h: {x}, WHAT, name)
"""


def _blocking(body):
    """The blocking form of an async body: its last `return X` becomes `return wait(X)`. (Not a
    call of the async function: that would cost every blocking call one more Python call.)"""
    head, _, last = ("\n" + body).rpartition("\n    return ")
    return (head + "\n    return wait(" + last.rstrip("\n") + ")\n")[1:]


def _functions(op, adapter, fast):
    """{public name: body template} of op's functions; `fast`: the fast path's where it has them."""
    fast = fast and not op.grouped and op.name in _FAST_KIND
    native = fast and op.name == "allreduce" and adapter.native is not None
    body = _ASYNC[op.result, op.grouped]
    blocking = _FAST[op.result] if fast else _blocking(body)
    out = {op.name + "_async": _FAST_ASYNC.get(op.result, body) if fast else body,
           op.name: (_NATIVE.replace("{form}", "1") if native else "") +
           (_DIFFERENTIABLE if op.name in adapter.autograd else "") + blocking}
    if op.inplace:
        body = _ASYNC_INPLACE[op.grouped]
        out[op.name + "_async_"] = (_NATIVE_START if native else "") + (_FAST_ASYNC_INPLACE if fast else body)
        out[op.name + "_"] = (_NATIVE.replace("{form}", "0") if native else "") + \
            (_FAST_INPLACE if fast else _blocking(body))
    return out


def _namespace(op, adapter, module, submit):
    """The globals of op's functions."""
    ns = dict(adapter._asdict(), __name__=module, ENTRY=getattr(_capi, op.entry), WHAT=op.name,
              AUTOGRAD=adapter.autograd.get(op.name), submit=submit, wait=_core.Handle.wait,
              KIND=_FAST_KIND.get(op.name), run=_capi._capi_native.cfx_py_run, native=adapter.native,
              start=_capi._capi_native.cfx_py_submit, context=_core.fast_context,
              native_context=_core.native_context,
              Handle=_core.Handle,
              check_name=_core.check_name, check_op=_core.check_op, check_root=_core.check_root,
              check_splits=_core.check_splits, check_scale=_core.check_scale,
              check_compression=_core.check_compression)
    ns.update(("DEFAULT_" + p, PARAMS[p][0]) for p in op.params)
    return ns


def install(module_globals, adapter, docs, submit=_core.submit):
    """Defines the functions of every op of OPS in the module whose globals are `module_globals`,
    with docstrings from `docs` (as define takes them). `submit` (as _core.submit) starts a
    collective: the process sets' functions pass one that submits to their own context."""
    module = module_globals["__name__"]
    for op in OPS:
        x = adapter.nouns[op.grouped]
        abi = [", " + PARAMS[p][1].format(p) for p in op.params if PARAMS[p][1]]
        numbers = [", " + PARAMS[p][1].format(p) for p in op.params
                   if PARAMS[p][1] and p != "compression"]
        fields = dict(
            x=x, base=op.name, params=", ".join(op.params),
            none=", None" if op.result == LIKE else "", abi="".join(abi),
            fast="".join(numbers + [", 0.0"] * (3 - len(numbers)) +
                         [", compression" if "compression" in op.params else ", 0"]))
        signature = ", ".join([x] + [p if PARAMS[p][0] is REQUIRED else "%s=DEFAULT_%s" % (p, p)
                                     for p in op.params])
        sources = {name: "def %s(%s):\n%s" % (name, signature, body.format(**fields))
                   for name, body in _functions(op, adapter, submit is _core.submit).items()}
        ns = _namespace(op, adapter, module, submit)
        clash = (set(op.params) | {x}) & set(ns)
        if clash:  # a parameter would hide the helper of that name from the body
            raise AssertionError("%s: parameters named like helpers: %s" % (op.name, sorted(clash)))
        define(module_globals, "<%s.%s, made by conflux._ops>" % (module, op.name), sources, ns,
               docs)


def define(module_globals, filename, sources, ns, docs):
    """Compiles `sources` ({name: the source of def name(...)}) with the globals `ns` and puts the
    functions into `module_globals`. `filename` names them in tracebacks; it is kept in linecache,
    so that tracebacks and inspect.getsource show the code. docs[name] is a docstring as it reads
    without the indentation of a def's body (that is added to every line after the first, as in
    a def written in a module); a name without one gets None."""
    source = "\n\n".join(sources.values())
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(source, filename, "exec"), ns)
    for name in sources:
        doc = docs.get(name)
        ns[name].__doc__ = None if doc is None else doc.replace("\n", "\n    ")
        module_globals[name] = ns[name]
