"""Small helpers several test files share."""

import jax
import numpy as np


def host(tree):
    """A numpy copy of a state (typed PRNG keys by their data), safe from buffer donation."""
    def leaf(x):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x = jax.random.key_data(x)
        return np.asarray(jax.device_get(x))

    return jax.tree.map(leaf, tree)


def cut_after_first_checkpoint(run_dir, dest, steps):
    """A copy of the finished run `run_dir` at `dest` as if it had stopped after its first
    checkpoint (`steps`: the checkpoint iterations, sorted); returns `dest`."""
    import shutil

    shutil.copytree(run_dir, dest)
    for step in steps[1:]:
        shutil.rmtree(dest / "checkpoints" / str(step))
    (dest / "summary.json").unlink()
    return dest


def assert_same_run(ref, resumed, skip_prefix=None):
    """Every metric (but those named by `skip_prefix`) and every state leaf equal; the metrics hold
    no wall-clock values (`TrainResult.timing` does)."""
    assert set(resumed.metrics) == set(ref.metrics)
    for k in ref.metrics:
        if skip_prefix is None or not k.startswith(skip_prefix):
            np.testing.assert_array_equal(resumed.metrics[k], ref.metrics[k], err_msg=k)
    for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(host(ref.state))[0],
                            jax.tree.leaves(host(resumed.state))):
        np.testing.assert_array_equal(a, b, err_msg=jax.tree_util.keystr(path))
