"""CPU kernels: the C sources, their one header, and the ctypes side that builds and calls them."""
