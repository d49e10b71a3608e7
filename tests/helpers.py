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
