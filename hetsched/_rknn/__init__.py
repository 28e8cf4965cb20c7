"""The RKNN toolkit (rknn-toolkit2) seen from hetsched: its own environment and its worker process.

``env`` finds (and ``hetsched setup rknn`` makes) the toolkit's separate Python environment;
``client.ToolkitProcess`` runs the toolkit there as a worker process (``_worker_main``, which
never imports hetsched); ``prepare`` and ``cache`` get stage models ready for it and keep
what it built. Importable without the toolkit: nothing here imports ``rknn``.
"""
