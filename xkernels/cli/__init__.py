"""The command-line programs, apart from the library they drive.

``python -m xkernels.bench`` / ``check`` / ``tune`` / ``npu_compile`` start them (each of those
modules only calls ``main`` here):

* ``bench`` (with ``bench_models`` for ``--model``): xkernels against PyTorch, with roofline context.
* ``check``: every op's cases against a float64 PyTorch reference.
* ``tune`` (with ``sweep_world`` for ``torchrun``, ``matmul_tables`` for matmul/linear rules):
  sweep configs and write tuning tables; ``--export-cache`` turns the autotune cache into tables.
* ``npu_compile`` (with ``compile_check``, the case list, and ``npu_chain``, the compile chain of one
  case): the offline Ascend compile check.

The library parts they share stay in the package: ``xkernels.harness`` (accuracy, timing, case
corpora), ``xkernels.sweep`` (plan and measure sweep items; autotune uses it too) and
``xkernels.tuning`` / ``xkernels.autotune``.
"""
