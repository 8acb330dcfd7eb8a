"""``hpcdl run``: host lists, rank placement, local / ssh / mpirun spawning, the job's rendezvous,
prefixed output and failure propagation. ``hpcdl.runner.launch.launch(LaunchSpec(...))`` is the
command as a library call.

Kept free of imports: ``python -m hpcdl.runner.mpi_rank`` starts on every rank under ``--mpi``.
"""
