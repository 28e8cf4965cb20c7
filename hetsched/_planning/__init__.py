"""Planning: load an ONNX model, index its graph, cut it into units, cost them, place them.

Everything here is pure computation on a model and a device list (no threads, no I/O except
reading the model file and the CPU topology through :class:`hetsched.SysfsRoot`). The runtime
(:mod:`hetsched._runtime`) executes the :class:`~hetsched._planning.plan.Plan` built here.
"""
