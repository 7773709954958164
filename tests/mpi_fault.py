"""Run ``rnntrain train`` under mpiexec or torchrun with a fault injected on one rank.

Used by tests/test_mpi.py and tests/test_torchdist.py:
    python tests/mpi_fault.py RANK KIND STEP CONFIG [overrides...]
KIND: "raise" (an exception in a worker), "kill" (SIGKILL itself), "stop" (SIGSTOP itself:
stuck, still alive), "kill-in-backward" (with dist.overlap on: SIGKILL itself during the
last task's backward, right after its first gradient bucket started), "kill-keep-sockets"
(fork a child that holds this rank's sockets open for 60 s, writing its pid to the
file $FAULT_PID_FILE, then SIGKILL itself: the peers' connections do not close), "term"
(SIGTERM to itself: this rank alone asks to stop), "baddata" (this rank
reads a missing data file: a UserError), "data=PATH" (this rank trains on another file;
both with the same config on every rank).
The fault hits rank RANK when it computes step STEP (0-based, within the epoch).
"""
import os
import signal
import sys
import time

from rnntrain import cli
from rnntrain.compute import tasks as step


def main():
    target, kind, at, *argv = sys.argv[1:]
    env = os.environ
    rank = int(env.get("RANK", env.get("PMI_RANK", env.get("OMPI_COMM_WORLD_RANK", "0"))))
    if rank == int(target):
        if kind == "baddata" or kind.startswith("data="):
            # this rank opens another training file than its config names (the config
            # stays the same on every rank: ranks whose configs differ stop at start-up)
            from rnntrain.data.dataset import Dataset
            other = "/nonexistent/train.nc" if kind == "baddata" else kind[5:]
            open_file, calls = Dataset.open, []

            def open_other(path, *a, **k):
                calls.append(path)
                return open_file(other if len(calls) == 1 else path, *a, **k)  # train first
            Dataset.open = staticmethod(open_other)
        elif kind == "kill-in-backward":
            from rnntrain.parallel.torchdist import GradBuckets
            launch, call, now = GradBuckets._launch, step.TaskComputer.__call__, [0]

            def track(self, worker, task):
                now[0] = self.key[2]
                return call(self, worker, task)

            def launch_then_die(self, b):
                launch(self, b)
                if now[0] == int(at) and b == 0:
                    os.kill(os.getpid(), signal.SIGKILL)
            step.TaskComputer.__call__ = track
            GradBuckets._launch = launch_then_die
        else:
            orig = step.TaskComputer.__call__

            def faulty(self, worker, task):
                if self.key[2] == int(at):
                    if kind == "raise":
                        raise RuntimeError(f"injected fault at step {at}")
                    if kind == "kill-keep-sockets":
                        child = os.fork()
                        if child == 0:  # holds the sockets (not the output), then goes
                            null = os.open(os.devnull, os.O_WRONLY)
                            os.dup2(null, 1)
                            os.dup2(null, 2)
                            time.sleep(60)
                            os._exit(0)
                        with open(env["FAULT_PID_FILE"], "w") as f:
                            f.write(str(child))
                    os.kill(os.getpid(), {"term": signal.SIGTERM, "stop": signal.SIGSTOP}
                            .get(kind, signal.SIGKILL))
                return orig(self, worker, task)
            step.TaskComputer.__call__ = faulty
    sys.exit(cli.main(["train", *argv]))


if __name__ == "__main__":
    main()
