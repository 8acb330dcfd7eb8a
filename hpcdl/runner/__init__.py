"""``hpcdl run``: host lists, rank placement, local / ssh / scheduler-launcher (srun, flux run, PALS mpiexec,
aprun, jsrun, blaunch) / mpirun spawning, the job's rendezvous (also the one batch scripts host), prefixed
output and failure propagation. ``hpcdl.runner.launch.launch(LaunchSpec(...))`` is the command as a library
call.

Kept free of imports: ``python -m hpcdl.runner.mpi_rank`` and ``hpcdl.runner.step_agent`` start on every rank.
"""
