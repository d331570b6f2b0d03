"""Models: finding, fetching and loading them (loader.py), the loaded value (loaded.py), the
default per device (choice.py), the weights forms (quant.py, convert.py, runtime.py) and the
kernels that multiply them (kernels/). Import names from the module that defines them.
"""
