"""Test program: start a pipeline, print its run id and stage pids, stop cleanly on a signal."""

import asyncio
import json
import sys

from duplex.config import load_pipeline
from duplex.lifecycle import StopSignals
from duplex.models.toy.stages import BUILDERS
from duplex.runtime.coordinator import Coordinator


async def main() -> None:
    stop = StopSignals()
    async with Coordinator(load_pipeline(sys.argv[1]), BUILDERS) as coord:
        handle = coord.submit(data={"text": "warm up"}, eos=True)
        await handle.collect()
        pids = [view.pid for view in (await coord.stats()).values()]
        print(json.dumps({"run_id": coord.run_id, "pids": pids, "run_dir": coord.procs.run_dir}), flush=True)
        sig = await stop.wait()
        print(f"stopping on {sig.name}", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
