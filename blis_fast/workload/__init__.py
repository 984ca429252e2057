"""Workload side: spec model and loading, synthesis, generation, trace v2 export, convert/compose.

Modules:

* ``spec`` - WorkloadSpec dataclasses, each field with its yaml.v3 tag: the one statement of
  the schema (WL-4.3/4.4);
* ``validate`` - ``validate_spec``, the reference's checks in its order (WL-4.5, DELTA-55);
* ``spec_yaml`` - strict YAML loading (``load_workload_spec``), yaml.v3 semantics, decoder
  table derived from ``spec`` (WL-4.1/4.2);
* ``synthesis`` - CLI flags / presets / ``--concurrency`` -> spec (WL-2, DELTA-29);
* ``expand`` - cohorts, inference-perf and ServeGen expansions (WL-7, WL-8, DELTA-53/57);
* ``samplers`` - length, arrival and think-time samplers built from a spec (WL-5.2/5.3,
  DELTA-59); their draws are the kernels of ``blis_fast.kernels.generation.samplers``;
* ``generator`` - ``generate_requests`` / ``generate_workload`` (-> RequestTable, session
  blueprints, follow-up budget) and the WL-1.2-1.4 precedence helpers; the generation kernel
  itself (a merge of lazily advanced client streams) is ``blis_fast.kernels.generation.generation``
  (layouts in ``kernels.generation_layout``);
* ``scenarios`` - the built-in scenario specs (WL-8.3);
* ``request_table`` - the RequestTable contract;
* ``trace_v2`` - ``--trace-output`` files;
* ``convert`` - ``blis convert`` / ``blis compose`` conversions; ``cli`` their click commands;
* ``yaml_writer`` - yaml.v3's ``Marshal`` of the workload structs and of one string.
"""
