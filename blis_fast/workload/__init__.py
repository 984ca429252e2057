"""Workload side: spec model, synthesis (distribution, presets), generation, trace v2 export.

Modules: ``spec`` (dataclasses, validation), ``synthesis`` (CLI flags / presets -> spec),
``generator`` (spec -> :class:`~blis_fast.workload.request_table.RequestTable`),
``trace_v2`` (``--trace-output`` files).
"""
