"""benchmarks/scale_rehearsal.py's kill (issue 56, defect 9): torchrun starts each rank in a session of its own,
so killing torchrun's process group left the ranks running; the rehearsal now kills every process below the
launcher by its id and checks that none survives."""

from __future__ import annotations

import subprocess
import sys
import time

from benchmark_scripts import script

scale_rehearsal = script("scale_rehearsal")

# a launcher that starts a "rank" in a session of its own, as torchrun does, then waits
LAUNCHER = """
import subprocess, sys, time
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
print("started", flush=True)
time.sleep(120)
"""


def test_every_process_below_the_launcher_is_killed_even_in_a_session_of_its_own():
    proc = subprocess.Popen([sys.executable, "-c", LAUNCHER], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == "started"
        deadline = time.time() + 10
        while not scale_rehearsal.descendants(proc.pid) and time.time() < deadline:
            time.sleep(0.05)
        ranks = scale_rehearsal.descendants(proc.pid)
        assert len(ranks) == 1 and scale_rehearsal.alive(ranks[0])
        killed, survivors = scale_rehearsal.kill_tree(proc.pid)
        assert killed == [proc.pid, *ranks] and survivors == []
        proc.wait(timeout=10)
        assert not scale_rehearsal.alive(ranks[0])
    finally:
        if proc.poll() is None:
            proc.kill()
