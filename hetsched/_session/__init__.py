"""The session layer (layer 4 in docs/architecture.md): what an application drives.

One module per concept; nothing is imported here, so ``import hetsched`` stays lazy
(hetsched/__init__.py names the module that defines each public class):

* ``_session``: :class:`~hetsched.Session`, the public calls (``run``, ``map``, ``profile``,
  ``replan``, ``statistics``);
* ``_lifecycle``: opening and closing a session, planning and installing its plans;
* ``_core``: the session core, which admits, checks feeds, submits and delivers requests and
  keeps their counters; ``_feeds`` (feed checks), ``_delivery`` (:class:`~hetsched.Outputs`),
  ``_stream`` (``Session.map``'s :class:`~hetsched.ResultStream`);
* ``_setup``: what opening and re-planning build (model index, topology, compiled stages);
* ``_adapt`` / ``_replan``: re-planning while serving (the monitor, failover's re-plans) and its
  pure triggers (:class:`~hetsched.Replanning`);
* ``_statistics``: :class:`~hetsched.SessionStatistics`, energy figures, the board sampler;
* ``_profiling``: measuring every unit on every device (``Session.profile``);
* ``_governed``: :class:`~hetsched.GovernorHooks`, a governor driven by a session's events;
* ``_trace`` / ``_trace_writer`` / ``_trace_counters``: ``Session(trace=PATH)``;
* ``_sync``: :class:`~hetsched.SyncSession`; ``_ort_session`` / ``_ort_meta``: onnxruntime's
  surface (:class:`~hetsched.InferenceSession`).
"""
