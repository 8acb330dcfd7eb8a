-- -*- lua -*-
-- hpcdl/0.1.0: written by hpcdl 0.1.0. Regenerate with `hpcdl module write`.
-- Every value below is a Lua string literal made by hpcdl's one escaping function (the `lua` filter).
help("hpcdl 0.1.0: distributed deep learning on HPC clusters.\nCommands: hpcdl run, hpcdl submit, hpcdl check-build, hpcdl stack; Python: import hpcdl.torch as hvd\nThis modulefile finds the installation it ships with (site-packages/hpcdl/modulefiles).\nOrigin: shipped inside the hpcdl package\n")
whatis("Name: hpcdl")
whatis("Version: 0.1.0")
whatis("Description: distributed deep learning on HPC clusters (collectives, Horovod-compatible PyTorch API, launcher)")
-- <site-packages>/hpcdl/modulefiles/hpcdl/<version>.lua in an install, <tree>/modulefiles/hpcdl/... in a checkout
local package_dir = myFileName():gsub("/modulefiles/hpcdl/[^/]+$", "")
local site, prefix
if isFile(pathJoin(package_dir, "__init__.py")) then
    site = package_dir:gsub("/hpcdl$", "")
    prefix = site:gsub("/lib/python[^/]+/site%-packages$", "")
else
    site = package_dir
    prefix = package_dir
end
setenv("HPCDL_HOME", prefix)
if isFile(pathJoin(prefix, "bin", "hpcdl")) then
    prepend_path("PATH", pathJoin(prefix, "bin"))
end
-- a venv or Python installation has its own python, which finds its packages; a --prefix tree needs PYTHONPATH
if not isFile(pathJoin(prefix, "pyvenv.cfg")) and not isFile(pathJoin(prefix, "bin", "python3")) then
    prepend_path("PYTHONPATH", site)
end
