"""Run by python_stacks_tests with the path of the probe library: a thread sleeps in
save_checkpoint() while the main thread calls the probe through ctypes (which lets go of the GIL),
once from a thread of the probe's own and once from the calling thread. Prints one JSON object: what
the stacks must show (the lines marked below) and what the probe took."""
import ctypes
import json
import os
import sys
import threading
import time


def marked_line(marker):
    with open(__file__) as source:
        for number, text in enumerate(source, 1):
            if text.rstrip().endswith("# " + marker):
                return number
    raise LookupError(marker)


sleeping = threading.Event()


def save_checkpoint():
    sleeping.set()
    time.sleep(120)  # SLEEP


def call_probe(probe, from_calling_thread):
    buffer = ctypes.create_string_buffer(16 << 20)
    length = probe.ncclguard_python_stacks_probe(from_calling_thread, buffer, len(buffer))  # PROBE
    return json.loads(buffer.raw[:length].decode()) if length >= 0 else None


def main():
    probe = ctypes.CDLL(sys.argv[1])
    probe.ncclguard_python_stacks_probe.restype = ctypes.c_long
    probe.ncclguard_python_stacks_probe.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_long]

    saver = threading.Thread(target=save_checkpoint, name="checkpointer", daemon=True)
    saver.start()
    sleeping.wait()
    # Until the saver is inside time.sleep(), not still returning from sleeping.set().
    deadline = time.monotonic() + 30
    while sys._current_frames()[saver.ident].f_lineno != marked_line("SLEEP"):
        if time.monotonic() > deadline:
            raise TimeoutError("the saver thread never reached time.sleep()")
        time.sleep(0.01)

    result = {
        "version": "%d.%d.%d" % sys.version_info[:3],
        "executable": os.path.realpath(sys.executable),
        "script": __file__,
        "main_thread": threading.get_ident(),
        "saver_thread": saver.ident,
        "lines": {marker: marked_line(marker) for marker in ("SLEEP", "PROBE", "MAIN", "MAIN_CALLER", "ENTRY")},
    }
    result["from_watchdog"] = call_probe(probe, 0)  # MAIN
    result["from_caller"] = call_probe(probe, 1)  # MAIN_CALLER
    print(json.dumps(result))


main()  # ENTRY
