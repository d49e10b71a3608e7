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


def assert_no_doctor_findings(result, capsys):
    """A healthy run: the training doctor ran (its signals are in the metrics) and found nothing at
    any iteration of any seed, warned nothing, and, for a run with a directory, wrote an empty
    doctor.jsonl, and `rmtjax doctor RUN` says "no findings"."""
    from rmtjax import doctor
    from rmtjax.cli import main

    flags = {k: v for k, v in result.metrics.items() if k.startswith(doctor.PREFIX) and k[len(doctor.PREFIX):] in doctor.KINDS}
    assert "early_collapse" in {k[len(doctor.PREFIX):] for k in flags}, sorted(result.metrics)
    assert np.isfinite(result.metrics["doctor_return"][:, -1]).all()
    for k, v in flags.items():
        assert not np.any(v > 0.5), (k, np.argwhere(v > 0.5)[:3], doctor.findings(
            {n: m.T for n, m in result.metrics.items()})[:1])
    assert not [w for w in result.warnings if w.startswith("doctor:")]
    if result.run_dir is not None:
        assert (result.run_dir / "doctor.jsonl").read_text() == ""
        capsys.readouterr()
        assert main(["doctor", str(result.run_dir)]) == 0
        assert capsys.readouterr().out.strip() == f"{result.run_dir}: no findings"
