"""Repository-wide test set-up.

The models in the tests are tiny and the CI machine has 2 cores: intra-op thread pools
(torch's OpenMP, BLAS) only contend with the other processes a test starts (a
kill-and-resume worker, DDP ranks, sweep workers) and can slow a torch step 50-fold.
One thread per process, unless the caller chose otherwise. Subprocesses inherit it.
"""

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
