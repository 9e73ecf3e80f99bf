"""CUDA's driver API and NCCL through ctypes, as JAX, vLLM and Python tools reach them: the libraries
(whichever libcuda.so.1 and libnccl.so.2 the library path finds, the emulator's in the tests), NCCL's
unique id, and a check that ends the program on an error. For the test programs written in Python."""
import ctypes
import sys

NCCL_FLOAT32 = 7
NCCL_BFLOAT16 = 9
NCCL_SUM = 0

cuda = ctypes.CDLL("libcuda.so.1")
nccl = ctypes.CDLL("libnccl.so.2")


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


def check(result, call):
    if result != 0:
        sys.exit(f"{call} failed: {result}")
