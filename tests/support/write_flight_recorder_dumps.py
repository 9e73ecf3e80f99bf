"""Writes Flight Recorder dumps laid out as PyTorch's ProcessGroupNCCL writes them (format 2.10,
protocol-2 pickles of plain dicts, lists, tuples and strings), for the tests of analyze's reading.

    write_flight_recorder_dumps.py PREFIX RANKS STUCK_SEQ LATE_RANK

Every rank of a RANKS-rank default group issued all_reduce #1 .. #STUCK_SEQ-1, completed; every
rank but LATE_RANK also issued #STUCK_SEQ, which stays scheduled, called from train.py line 88
through torch's distributed_c10d.py. The file of rank r is PREFIX + str(r)."""
import pickle
import sys

prefix, ranks, stuck, late = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
frames = [
    {"name": "all_reduce", "filename": "/usr/lib/python3/dist-packages/torch/distributed/distributed_c10d.py",
     "line": 2501},
    {"name": "train_step", "filename": "/home/user/train.py", "line": 88},
    {"name": "<module>", "filename": "/home/user/train.py", "line": 120},
]
for rank in range(ranks):
    entries = []
    last = stuck - 1 if rank == late else stuck
    for seq in range(1, last + 1):
        entries.append({
            "frames": frames, "record_id": seq - 1, "pg_id": 0, "process_group": ("0", "default_pg"),
            "thread_name": "python3", "thread_id": "140000", "collective_seq_id": seq, "p2p_seq_id": 0,
            "op_id": seq, "profiling_name": "nccl:all_reduce", "time_created_ns": 1_700_000_000_000_000_000 + seq,
            "input_sizes": [[1024]], "input_dtypes": ["Float"], "output_sizes": [[1024]],
            "output_dtypes": ["Float"], "state": "completed" if seq < stuck else "scheduled",
            "time_discovered_started_ns": None, "time_discovered_completed_ns": None, "retired": seq < stuck,
            "timeout_ms": 600000, "is_p2p": False,
        })
    dump = {
        "version": "2.10",
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(ranks)))}},
        "comm_lib_version": "2.28.9",
        "pg_status": {"0": {"last_enqueued_collective": last, "last_started_collective": -1,
                            "last_completed_collective": stuck - 1}},
        "entries": entries,
    }
    with open(prefix + str(rank), "wb") as file:
        pickle.dump(dump, file, protocol=2)
