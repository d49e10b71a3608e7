"""PPO's CartPole-v1 preset on 4 CPU devices (mean fusion) beside 1 device, 4 seeds, 500k steps.

    XLA_FLAGS=--xla_force_host_platform_device_count=4 python -m benchmarks ppo_devices

Prints each run's summary and every seed's mean return over the last 10% of iterations.
"""

import jax
import numpy as np

import rmtjax


def add_arguments(ap) -> None:
    pass


def run(args) -> None:
    for devices in (4, 1):
        cfg = rmtjax.make_config("ppo", "CartPole-v1", {"train.num_seeds": 4, "train.progress": False,
                                                         "distributed.devices": devices})
        r = rmtjax.train(cfg, jax.random.key(0))
        late = r.metrics["episode_return"][:, -max(1, r.metrics["episode_return"].shape[1] // 10):].mean(1)
        print(devices, "devices:", r.summary(), "| last-10% mean per seed", np.round(late, 1), flush=True)
