"""What `make` builds before any run, so that no run pays for it: the compiled kernels (`python -m
compaction.prebuild.kernels`, into the caches beside their modules) and the driver JVM's class-data-sharing archive
(`python -m compaction.prebuild.cds`). Build tools, at the top of the package: they import the library to exercise
it, and nothing kcompact runs imports them."""
