# serial.py: the same cache built in this process
import sys, time
from oscillator import prior, simulator
from pipekit_train.core.data import CachedDataset, SimulationDataset

t0 = time.perf_counter()
cache = CachedDataset.build(
    SimulationDataset(simulator, prior, 4000, seed=0), sys.argv[1], chunk_size=250
)
print(f"{cache} built in {time.perf_counter() - t0:.1f} s")

# compare.py: two stores, file by file
import sys
from pathlib import Path
import fsspec

local, remote = Path(sys.argv[1]), sys.argv[2]
fs, root = fsspec.core.url_to_fs(remote)
a = {str(p.relative_to(local)): p.read_bytes() for p in local.rglob("*") if p.is_file()}
b = {p[len(root) + 1 :]: fs.cat_file(p) for p in fs.find(root)}
print(f"{len(a)} files here, {len(b)} there, identical: {a == b}")
