"""Tools on top of the library: benchmarks, footprint, profiling, analysis, the transfer study."""
