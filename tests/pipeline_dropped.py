"""Test program: start a pipeline, answer one request, then drop the coordinator without its
shutdown (as a caller that failed half-way would) and collect it; print what happened, then stop
the stage processes it left."""

import asyncio
import gc
import sys

from duplex.config import load_pipeline
from duplex.models.toy.stages import BUILDERS
from duplex.runtime.coordinator import Coordinator
from duplex.runtime.processes import StageProcesses


async def dropped() -> StageProcesses:
    coord = Coordinator(load_pipeline(sys.argv[1]), BUILDERS)
    await coord.start()
    await coord.submit(data={"text": "warm up"}, eos=True).collect()
    return coord.procs  # the coordinator itself is let go here, its sockets open


if __name__ == "__main__":
    procs = asyncio.run(dropped())
    print("collecting", flush=True)
    gc.collect()
    print("collected", flush=True)
    procs.terminate()
