"""Videos of a trained policy: one greedy episode per seed, rendered to a GIF or an MP4.

    rmtjax eval runs/cartpole --video cartpole.gif       # the seeds side by side, one file
    rmtjax eval runs/cartpole --video cartpole.mp4 --per-seed   # cartpole_seed0.mp4, ...

`render_video(source, path)` (source: a run directory or a `TrainResult`) plays one greedy
episode (`agent.act`) per seed on a fresh environment of the run's config, with the
observation-normalisation statistics the agent trained with, frozen (as `rmtjax.evaluate`
does), step by step, and draws every step:

- gymnax's classic-control envs (CartPole, Acrobot, Pendulum, MountainCar and its continuous
  version) with a renderer of this module (Pillow), from the env state;
- MinAtar games (and any gymnax env whose observation is an image) from the observation's
  channels, each in its own colour; any other gymnax env as a bar chart of its observation;
- `gymnasium:` envs with gymnasium's own `render_mode="rgb_array"` (classic control needs
  pygame, which `rmtjax[box2d]` brings).

An episode that ends keeps its last frame until every seed's has ended (or `max_steps`).
Writing needs `rmtjax[video]`: Pillow for `.gif`, imageio with PyAV for `.mp4`.
"""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from rmtjax.schema import ConfigError

FORMATS = (".gif", ".mp4")
TILE = (240, 160)  # width, height of one seed's picture for the envs drawn here
MAX_TILE_WIDTH = 320  # gymnasium's frames are scaled down to this


@dataclasses.dataclass
class Video:
    """What `render_video` wrote: `paths`, and per seed the episode's `returns`, `lengths` and
    whether it `finished` before `max_steps`; `frames` is the number of frames per file."""

    paths: list[Path]
    frames: int
    returns: np.ndarray
    lengths: np.ndarray
    finished: np.ndarray

    def summary(self) -> str:
        per_seed = np.array2string(self.returns, precision=1, separator=", ")
        return (f"wrote {', '.join(map(str, self.paths))}: {self.frames} frames, one greedy episode per seed, "
                f"returns {per_seed}")


def _check_path(path) -> Path:
    if path is None or not str(path).strip():
        raise ConfigError("--video: an empty path was given; name a file ending in .gif or .mp4")
    if "\x00" in str(path):
        raise ConfigError(f"--video {str(path)!r}: a path holds no NUL character")
    path = Path(path)
    if path.suffix.lower() not in FORMATS:
        raise ConfigError(f"--video {path}: the file must end in .gif or .mp4 (got {path.suffix or 'no suffix'!r})")
    if path.is_dir():
        raise ConfigError(f"--video {path}: it is a directory; name a file ending in .gif or .mp4")
    return path


def _check_target(path: Path, overwrite: bool) -> None:
    """A video is never written through a link, and replaces an existing file only when asked."""
    if path.is_symlink():
        raise ConfigError(f"--video {path}: it is a symbolic link; rmtjax writes no video through one (name the "
                          f"file itself)")
    if os.path.lexists(path):
        if not path.is_file():
            raise ConfigError(f"--video {path}: it exists and is not a regular file")
        if not overwrite:
            raise ConfigError(f"--video {path}: the file exists; choose another name or pass --overwrite "
                              f"(render_video(..., overwrite=True)) to replace it")


def _writer_check(path: Path) -> None:
    try:
        if path.suffix.lower() == ".gif":
            import PIL  # noqa: F401
        else:
            import imageio.v3  # noqa: F401
            import av  # noqa: F401
    except ImportError as e:
        raise ConfigError(f"--video {path}: writing {path.suffix} needs {e.name}; install it with "
                          f"pip install 'rmtjax[video]'") from None


def render_video(source, path, *, key=None, max_steps: int | None = None, per_seed: bool = False,
                 fps: int = 30, overwrite: bool = False) -> Video:
    """Render one greedy episode per seed of `source` (a run directory or a `TrainResult`) into
    `path` (`.gif` or `.mp4`): the seeds tiled in one video, or with `per_seed` one file per
    seed, `<stem>_seed<k><suffix>`. `max_steps` bounds the episodes (default: the env's time
    limit, else 1,000). An existing file is replaced only with `overwrite`; a symbolic link at
    the path is always refused (the file is written beside it and renamed into place)."""
    import jax

    from rmtjax.driver import load_run

    path = _check_path(path)
    _writer_check(path)
    if max_steps is not None and (not isinstance(max_steps, int) or isinstance(max_steps, bool) or max_steps < 1):
        raise ConfigError(f"max_steps: expected an integer ≥ 1, got {max_steps!r}")
    if not isinstance(fps, int) or not 1 <= fps <= 240:
        raise ConfigError(f"fps: expected an integer in [1, 240], got {fps!r}")
    if not per_seed:
        _check_target(path, overwrite)  # before anything is computed
    result = load_run(source) if isinstance(source, (str, os.PathLike)) else source
    key = jax.random.key(0) if key is None else key
    if per_seed:
        for s in range(result.config.train.num_seeds):
            _check_target(path.with_name(f"{path.stem}_seed{s}{path.suffix}"), overwrite)
    tiles, returns, lengths, finished = play(result, key, max_steps)
    seeds = len(tiles)
    if per_seed:
        paths = [path.with_name(f"{path.stem}_seed{s}{path.suffix}") for s in range(seeds)]
        for s, p in enumerate(paths):
            _write(p, [_label(f, s, None) for f in tiles[s]], fps)
        n_frames = max(len(t) for t in tiles)
    else:
        frames = _grid([[_label(f, s, None) for f in t] for s, t in enumerate(tiles)])
        _write(path, frames, fps)
        paths, n_frames = [path], len(frames)
    return Video(paths, n_frames, returns, lengths, finished)


def play(result, key, max_steps: int | None = None):
    """One greedy episode per seed of the trained `result`, step by step on the host: per seed a
    list of frames (uint8 [H, W, 3]), then the returns, lengths and finished flags [num_seeds]."""
    import jax

    from rmtjax.agents import build_agent
    from rmtjax.envs import is_host_env, make_env, split_id
    from rmtjax.envs.vec import VecEnv

    config = result.config
    agent = build_agent(dataclasses.replace(config, distributed=type(config.distributed)()))
    env_cfg = dataclasses.replace(config.env, num_envs=1, host_vectorization="sync")
    host = is_host_env(config.env.id)
    if host:  # gymnasium draws its own frames
        from rmtjax.envs import gymnasium_env

        _, name = split_id(config.env.id)
        gymnasium_env.make(name, env_cfg)  # the id's checks (allowed imports, known id) and its errors
        raw = gymnasium_env.GymnasiumEnv(name, 1, {**config.env.params, "render_mode": "rgb_array"}, "sync")
        env = VecEnv(raw, None, env_cfg)
    else:
        env = make_env(env_cfg)
    draw = None if host else renderer(env.env, env.default_params)
    limit = max_steps or env.spec.max_episode_steps or 1000
    state = result.state
    seeds = config.train.num_seeds

    def view(inner):
        # what the gymnax renderers read: the env state, and its observation where the env has one
        if host:
            return None
        return inner, _raw_obs(env.env, inner, env.default_params)

    def reset(k, stats):
        obs, st = env.reset(k, obs_stats=stats)
        return obs, st, view(st.inner)

    def step(params, obs, st, carry, reset, k):
        k_act, k_env = jax.random.split(k)
        action, carry = agent.act_step(params, carry, obs, reset, k_act)  # a recurrent agent's memory in `carry`
        obs, st, _, _, _, info = env.step(k_env, st, action, frozen=True)
        return obs, st, view(st.inner), carry, info["done"]

    keys = jax.random.split(key, seeds)
    reset_keys = jax.vmap(lambda k: jax.random.fold_in(k, 0))(keys)
    obs, st, seen = jax.jit(jax.vmap(reset))(reset_keys, state.env_state.obs_stats)
    step = jax.jit(jax.vmap(step))
    carry = jax.vmap(lambda _: agent.initial_carry(1))(np.arange(seeds))
    reset = np.ones((seeds, 1), bool)

    def frames_now(seen):
        if host:
            pics = raw._vec.render()
            return [_fit(np.asarray(p)) for p in pics]
        seen = jax.device_get(seen)
        return [draw(jax.tree.map(lambda x: x[s, 0], seen)) for s in range(seeds)]

    tiles = [[f] for f in frames_now(seen)]
    done = np.zeros(seeds, bool)
    returns = np.zeros(seeds, np.float32)
    lengths = np.zeros(seeds, np.int32)
    t = 0
    while t < limit and not done.all():
        keys = jax.vmap(lambda k: jax.random.fold_in(k, t + 1))(keys)
        obs, st, seen, carry, reset = step(state.params, obs, st, carry, reset, keys)
        t += 1
        ended = np.asarray(st.episodes_done[:, 0] > 0) & ~done
        returns = np.where(ended, np.asarray(st.last_return[:, 0]), returns)
        lengths = np.where(ended, np.asarray(st.last_length[:, 0]), lengths)
        pics = frames_now(seen) if (~done & ~ended).any() else None
        for s in range(seeds):
            if not done[s] and not ended[s]:
                tiles[s].append(pics[s])
        done |= ended
    running = ~done
    returns = np.where(running, np.asarray(st.episode_return[:, 0]), returns)
    lengths = np.where(running, np.asarray(st.episode_length[:, 0]), lengths)
    if host:
        raw.close()
    return tiles, returns, lengths, done


def _raw_obs(env, inner, params):
    """The env's own observation of each state (for MinAtar and the generic pictures), or None."""
    import jax

    get_obs = getattr(env, "get_obs", None)
    if get_obs is None:
        return None
    try:
        return jax.vmap(lambda s: get_obs(s, params))(inner)
    except Exception:  # an env whose get_obs takes other arguments: its picture uses the state alone
        return None


# -- drawing ---------------------------------------------------------------------------------
def renderer(env, params):
    """A function `(inner_state, raw_obs) -> uint8 [H, W, 3]` for the gymnax env `env`."""
    fields = set(getattr(type(env), "__module__", "").split("."))
    if "minatar" in fields:
        return lambda seen: _channels(seen[1])
    name = type(env).__name__
    known = {"CartPole": _cartpole, "MaskedCartPole": _cartpole, "Acrobot": _acrobot, "Pendulum": _pendulum,
             "MountainCar": _mountain_car, "ContinuousMountainCar": _mountain_car}
    if name in known:
        draw = known[name]
        return lambda seen: draw(seen[0], params)
    return lambda seen: _generic(seen[1])


def _canvas():
    from PIL import Image, ImageDraw

    img = Image.new("RGB", TILE, (255, 255, 255))
    return img, ImageDraw.Draw(img)


def _cartpole(state, params):
    img, d = _canvas()
    w, h = TILE
    limit = float(getattr(params, "x_threshold", 2.4))
    scale = (w - 20) / (2 * limit)
    ground = h - 40
    cx = w / 2 + float(state.x) * scale
    d.line([(0, ground), (w, ground)], fill=(0, 0, 0), width=1)
    d.rectangle([cx - 20, ground - 12, cx + 20, ground + 4], fill=(60, 60, 60))
    length = 2 * float(getattr(params, "length", 0.5)) * scale
    theta = float(state.theta)
    tip = (cx + length * math.sin(theta), ground - 8 - length * math.cos(theta))
    d.line([(cx, ground - 8), tip], fill=(200, 130, 70), width=6)
    d.ellipse([cx - 3, ground - 11, cx + 3, ground - 5], fill=(120, 120, 200))
    return np.asarray(img)


def _acrobot(state, params):
    img, d = _canvas()
    w, h = TILE
    scale = h / 4.4
    c = (w / 2, h / 2)
    a1, a2 = float(state.joint_angle1), float(state.joint_angle2)
    p1 = (c[0] + scale * math.sin(a1), c[1] + scale * math.cos(a1))
    p2 = (p1[0] + scale * math.sin(a1 + a2), p1[1] + scale * math.cos(a1 + a2))
    d.line([(0, c[1] - scale), (w, c[1] - scale)], fill=(0, 0, 0), width=1)  # the height to swing above
    d.line([c, p1], fill=(0, 80, 160), width=6)
    d.line([p1, p2], fill=(0, 80, 160), width=6)
    for p in (c, p1):
        d.ellipse([p[0] - 4, p[1] - 4, p[0] + 4, p[1] + 4], fill=(200, 200, 0))
    return np.asarray(img)


def _pendulum(state, params):
    img, d = _canvas()
    w, h = TILE
    r = h * 0.38
    c = (w / 2, h / 2)
    theta = float(state.theta)  # 0 is upright
    tip = (c[0] + r * math.sin(theta), c[1] - r * math.cos(theta))
    d.line([c, tip], fill=(200, 80, 80), width=8)
    d.ellipse([c[0] - 4, c[1] - 4, c[0] + 4, c[1] + 4], fill=(0, 0, 0))
    u = float(getattr(state, "last_u", 0.0))  # the torque, as an arc's length
    if u:
        d.arc([c[0] - 20, c[1] - 20, c[0] + 20, c[1] + 20], -90, -90 + 45 * u, fill=(0, 0, 0), width=2)
    return np.asarray(img)


def _mountain_car(state, params):
    img, d = _canvas()
    w, h = TILE
    lo, hi = float(getattr(params, "min_position", -1.2)), float(getattr(params, "max_position", 0.6))
    xs = np.linspace(lo, hi, 100)

    def to_px(x):
        return ((x - lo) / (hi - lo) * (w - 10) + 5, h - 20 - (math.sin(3 * x) + 1) / 2 * (h - 50))

    d.line([to_px(x) for x in xs], fill=(0, 0, 0), width=2)
    goal = float(getattr(params, "goal_position", 0.45))
    gx, gy = to_px(goal)
    d.line([(gx, gy), (gx, gy - 25)], fill=(0, 0, 0), width=2)
    d.polygon([(gx, gy - 25), (gx + 12, gy - 20), (gx, gy - 15)], fill=(220, 200, 0))
    cx, cy = to_px(float(state.position))
    d.ellipse([cx - 7, cy - 14, cx + 7, cy], fill=(40, 120, 40))
    return np.asarray(img)


_PALETTE = np.array([(230, 60, 60), (60, 160, 230), (250, 200, 40), (90, 200, 90), (200, 90, 200),
                     (250, 140, 40), (40, 200, 200), (160, 110, 60), (130, 130, 250), (120, 120, 120)], np.uint8)


def _channels(obs, cell: int = 16):
    """An image observation [H, W, C] (MinAtar: one boolean channel per kind of object) as a
    picture: each channel in its own colour on black, each cell `cell` pixels wide."""
    if obs is None:
        raise ConfigError("video: this env gives no observation to draw from")
    x = np.asarray(obs, np.float32)
    if x.ndim == 2:
        x = x[..., None]
    img = np.zeros(x.shape[:2] + (3,), np.float32)
    for c in range(x.shape[-1]):
        img += np.clip(x[..., c:c + 1], 0, 1) * _PALETTE[c % len(_PALETTE)]
    img = np.clip(img, 0, 255).astype(np.uint8)
    return img.repeat(cell, 0).repeat(cell, 1)


def _generic(obs):
    """Any other env: an image observation as `_channels`, a vector as bars (value ± 3 fills half)."""
    if obs is not None and np.ndim(obs) >= 2:
        return _channels(obs, cell=max(1, 160 // max(np.shape(obs)[:2])))
    img, d = _canvas()
    w, h = TILE
    v = np.atleast_1d(np.asarray(obs if obs is not None else [0.0], np.float32)).ravel()[:32]
    bar = (w - 10) / len(v)
    mid = h / 2
    for i, x in enumerate(v):
        top = mid - float(np.clip(x / 3, -1, 1)) * (h / 2 - 5)
        d.rectangle([5 + i * bar + 1, min(mid, top), 5 + (i + 1) * bar - 1, max(mid, top)], fill=(70, 110, 200))
    d.line([(0, mid), (w, mid)], fill=(0, 0, 0))
    return np.asarray(img)


def _fit(frame):
    """A gymnasium frame scaled down to at most MAX_TILE_WIDTH pixels wide."""
    from PIL import Image

    frame = np.asarray(frame, np.uint8)[..., :3]
    h, w = frame.shape[:2]
    if w <= MAX_TILE_WIDTH:
        return frame
    size = (MAX_TILE_WIDTH, max(1, round(h * MAX_TILE_WIDTH / w)))
    return np.asarray(Image.fromarray(frame).resize(size, Image.BILINEAR))


def _label(frame, seed: int, text: Any):
    from PIL import Image, ImageDraw

    img = Image.fromarray(frame)
    ImageDraw.Draw(img).text((4, 2), f"seed {seed}" if text is None else str(text), fill=(128, 128, 128))
    return np.asarray(img)


def _grid(tiles):
    """Per-seed frame lists -> one frame list, the seeds in a near-square grid; a seed whose
    episode ended shows its last frame."""
    seeds = len(tiles)
    cols = math.ceil(math.sqrt(seeds))
    rows = math.ceil(seeds / cols)
    h = max(t[0].shape[0] for t in tiles)
    w = max(t[0].shape[1] for t in tiles)
    n = max(len(t) for t in tiles)
    gap = 2
    out = []
    for i in range(n):
        canvas = np.full((rows * (h + gap) - gap, cols * (w + gap) - gap, 3), 40, np.uint8)
        for s, t in enumerate(tiles):
            f = t[min(i, len(t) - 1)]
            r, c = divmod(s, cols)
            canvas[r * (h + gap):r * (h + gap) + f.shape[0], c * (w + gap):c * (w + gap) + f.shape[1]] = f
        out.append(canvas)
    return out


def _write(path: Path, frames, fps: int) -> None:
    from rmtjax import safefs

    path.parent.mkdir(parents=True, exist_ok=True)
    # a fresh temporary file beside `path`, renamed over it: never written through a link planted there
    with safefs.atomic_file(path) as f:
        if path.suffix.lower() == ".gif":
            from PIL import Image

            images = [Image.fromarray(x) for x in frames]
            images[0].save(f, format="GIF", save_all=True, append_images=images[1:],
                           duration=max(20, round(1000 / fps)), loop=0)
            return
        import imageio.v3 as iio

        h, w = frames[0].shape[:2]  # the usual MP4 encoding (yuv420p) wants even sides
        frames = [np.pad(x, ((0, h % 2), (0, w % 2), (0, 0)), mode="edge") for x in frames]
        # PyAV encodes in this process (ffmpeg's libraries in its wheel): no subprocess forked from a JAX process
        f.write(iio.imwrite("<bytes>", np.stack(frames), plugin="pyav", codec="libx264", fps=fps, extension=".mp4"))
