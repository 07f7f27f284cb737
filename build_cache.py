"""Build a simulation cache on a Ray cluster: python build_cache.py ADDRESS URI."""

import sys
import time

from oscillator import prior, simulator

from pipekit_train.core.data import CachedDataset, RayBuildExecutor, SimulationDataset

if __name__ == "__main__":
    address, uri = sys.argv[1], sys.argv[2]
    sims = SimulationDataset(simulator, prior, 4000, seed=0)
    t0 = time.perf_counter()
    cache = CachedDataset.build(
        sims,
        uri,
        chunk_size=250,
        executor=RayBuildExecutor(address=address, runtime_env={"working_dir": "."}),
        progress=lambda done, total: print(f"chunk {done}/{total}", flush=True),
    )
    print(f"{cache} built in {time.perf_counter() - t0:.1f} s")
