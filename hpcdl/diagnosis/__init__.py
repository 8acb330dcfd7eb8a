"""Explaining what went wrong in a job, from what its ranks left behind: their last traceback (which rank
failed by its own error, and which only because another one had failed), and their flight-recorder dumps
(which rank is behind, at which operation).

Standard library only, and nothing from the rest of hpcdl: the launcher, the ranks and the ``hpcdl debug``
commands all read these facts from here.
"""
