"""Launches the ops keep for a Dispatcher to run from C: after a first call
with arrays of a signature (types, dtypes, shapes, devices), an op's later
calls like it run the mlirgpu.LaunchPlan of its launch (docs/design/dispatch.md,
"LaunchPlan") and skip the op's Python code. Each op has a Dispatcher whose
misses are its Python path; that path registers its launch with `keep`."""
from ..runtime import backend
from .arrays import capturing, plan_stream

__all__ = ["keep", "STREAMS_KEPT"]

# Streams an op keeps LaunchPlans for, per kind of call (the mma.sync GEMM keeps its workspaces, which
# its plans hold, for as many).
STREAMS_KEPT = 8


def keep(dispatcher, plans, args, stream, make):
    """Has later calls of `dispatcher` with arguments like `args` (those of
    the launch just made, on `stream`) launch from C: registers its
    LaunchPlan, which a call runs while the kernel's traced globals and the
    backend stay as they are.

    `plans` holds what `make` made for one kind of call, by stream: making
    a plan costs a trace's checks, so it is made once per stream (the
    STREAMS_KEPT most recent). `make(source)` gives what
    Specialization.launch_plan does, (plan, guards, owner), for the
    LaunchPlan's stream `source` (arrays.plan_stream), or None where this
    launch cannot run from C. Nothing is kept on the CPU backend, nor while
    torch captures a CUDA graph: a capture's workspaces are the graph's own
    (arrays.Workspaces), not a plan's to keep."""
    if backend.current().name != "cuda" or capturing(args[0]):
        return
    made = plans.get(stream)
    if made is None:
        source = plan_stream(args[0])
        # None for this call only (A padded into a copy, say): the next may have one.
        made = None if source is False else make(source)
        if made is None:
            return
        if len(plans) >= STREAMS_KEPT:
            plans.clear()
        plans[stream] = made
    plan, guards, owner = made
    try:
        dispatcher.register(args, plan, guards + ((vars(backend), "_current", backend.current(), None),), owner)
    except ValueError:
        pass    # arguments the dispatcher cannot read (a host array): the Python path serves them each time
