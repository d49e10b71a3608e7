"""Real Atari 2600 games (`atari:<Game>`, e.g. `atari:Breakout`, `atari:Pong`) through ale-py,
run on the host by the gymnasium adapter, with the standard preprocessing.

Each env is `ALE/<Game>-v5` made with `frameskip=1` and wrapped in gymnasium's
`AtariPreprocessing`, which gives the usual protocol (Machado et al. 2018; Mnih et al. 2015):

| setting | default | `env.params` key |
|---|---|---|
| frame skip (the action repeated, rewards summed) | 4 | `frame_skip` |
| max-pool over the last two frames of a skip | always | |
| grey scale, resized to 84 × 84, observation uint8 [84, 84, 1] | 84 | `screen_size` |
| sticky actions: each emulator frame repeats the previous action with p | 0.25 | `repeat_action_probability` |
| episodic life (a lost life ends the episode) | off | `terminal_on_life_loss` |
| no-op starts (up to N no-ops after a reset) | 0 (sticky actions randomise instead) | `noop_max` |
| minimal action set | on | `full_action_space` |
| time limit in emulator frames (a truncation) | 108,000 (27,000 steps) | `max_num_frames_per_episode` |

Two settings of the standard protocol live in rmtjax's own env wrappers, not here: stack the
last four frames with `env.frame_stack: 4` (observations [84, 84, 4]) and clip the rewards
the agent learns from with `env.reward_clip: 1`; the logged `episode_return` is always the raw
game score. ROMs come with the ale-py wheel (≥ 0.9); the preprocessing needs OpenCV
(`opencv-python-headless`); both are in the `atari` extra.

`render(state)` (through `VecEnv.render`) returns the emulator's full-colour screen, uint8
[210, 160, 3].
"""

from __future__ import annotations

import functools

PREPROCESSING = {"frame_skip": 4, "screen_size": 84, "terminal_on_life_loss": False, "noop_max": 0}
MAKE = {"repeat_action_probability": 0.25, "full_action_space": False, "max_num_frames_per_episode": 108_000}


def _registered() -> dict[str, str]:
    """Game name -> ALE id, for the v5 ids ale-py registers."""
    import ale_py
    import gymnasium as gym

    gym.register_envs(ale_py)
    return {k[len("ALE/"):-len("-v5")]: k for k in gym.registry if k.startswith("ALE/") and k.endswith("-v5")}


def names() -> list[str]:
    return sorted(_registered())


def has(name: str) -> bool:
    return name in _registered()


def make(name: str, env_cfg):
    import gymnasium as gym
    from gymnasium.wrappers import AtariPreprocessing

    from rmtjax.schema import ConfigError, close_matches
    from rmtjax.envs.functional import check_names
    from rmtjax.envs.gymnasium_env import GymnasiumEnv
    from rmtjax.envs.vec import VecEnv

    ids = _registered()
    check_names("atari", name, ids)
    pre, make_kwargs = dict(PREPROCESSING), dict(MAKE)
    for k, v in env_cfg.params.items():
        if k in pre:
            pre[k] = v
        elif k in make_kwargs or k in ("mode", "difficulty"):
            make_kwargs[k] = v
        else:
            raise ConfigError(f"env.params.{k}: atari ids take {', '.join(sorted([*PREPROCESSING, *MAKE, 'mode', 'difficulty']))}."
                              f"{close_matches(str(k), [*PREPROCESSING, *MAKE])}")
    make_kwargs.update(frameskip=1, render_mode="rgb_array")  # the wrapper skips frames (and max-pools)
    wrap = functools.partial(AtariPreprocessing, grayscale_obs=True, grayscale_newaxis=True, scale_obs=False, **pre)
    try:
        env = GymnasiumEnv(ids[name], env_cfg.num_envs, make_kwargs, env_cfg.host_vectorization, wrappers=(wrap,),
                           label=f"atari:{name}")
    except gym.error.DependencyNotInstalled as e:
        raise ConfigError(f"env.id: atari:{name} needs a package that is not installed: {e}. "
                          f"pip install 'rmtjax[atari]'") from None
    except (TypeError, ValueError, gym.error.Error) as e:
        raise ConfigError(f"env.params: atari:{name} with {dict(env_cfg.params)}: {e}") from None
    return VecEnv(env, None, env_cfg)
