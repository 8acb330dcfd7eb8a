"""Modulefiles: Lmod Lua and Environment Modules Tcl, in a Core / Compiler / MPI hierarchy, rendered from
``templates/modules/``; hpcdl's own modulefile ships in ``modulefiles/``."""
