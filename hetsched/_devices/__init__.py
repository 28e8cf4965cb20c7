"""Device resolution: device specs (``"big"``, ``"cpu:0-3"``, ``"npu"``, ``"gpu"``) to :class:`Device` objects.

``resolve`` (specs on the host's ``/`` and the entry point :func:`resolve_devices`), ``board`` (specs
on a board root: a twin's tree), ``jetson`` (a real Jetson Orin's GPU and DLA cores). Above the
planner, the backends (it asks them whether they can run here) and ``_estimators`` (a board
root's simulated devices); the planner and the runtime only see the devices it returns.
"""
