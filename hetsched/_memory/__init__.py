"""Memory below the runtime, shared with the backends and the vendor toolkits' clients.

* ``shared``: where the buffer pools' shareable (memfd / dma-buf) slabs lie, so a worker
  process can be handed ``(fd, offset)`` instead of a copy (``locate_shared``; the RKNN
  toolkit's client asks, the runtime's pools register);
* ``cuda``: cuda-python's runtime module, loaded lazily, its errors, and the pools' host
  mappings registered with CUDA (``HOST_MAPPINGS``; the runtime's pools add and remove,
  the TensorRT backend asks for device addresses).

Nothing here imports the runtime, a backend or a toolkit: they all import this.
"""
