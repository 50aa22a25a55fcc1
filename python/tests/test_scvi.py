"""deltacells.scvi with real scvi-tools: scvi.model.SCVI trained from a
dataset (the registry and the batches of the DataModule) and from the same
cells as an in-memory AnnData (scvi-tools' own path), with the same seed,
falls to the same loss within a stated tolerance; the latent representation
of the dataset's cells, in any order; the batches' tensors against the
AnnData's rows; covariates, class sampling, splits by group, a collection,
a dataset in a bucket (moto's S3 server), save and load; bad arguments named.
Data: the bundled 1,000 PBMC cells with a batch column of two values and a
few more (training_data.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import deltacells
from conftest import S3_ENV
from training_data import GENES, convert_with_columns, pbmc_with_columns

#: Training epochs of the comparison, and how near the two paths' last
#: training ELBOs must be (relative): the runs differ in their batches'
#: cells and in the validation cells drawn, not in the model or its seed.
EPOCHS = 6
TOLERANCE = 0.02


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread(scvi):  # noqa: ANN001, ANN201
    """torch on one thread for these tests: on 2 busy cores its second
    OpenMP thread spins (the comparison took 112 s instead of 23 s)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def adata(scvi):  # noqa: ANN001, ANN201
    return pbmc_with_columns()


@pytest.fixture(scope="module")
def root(scvi, tmp_path_factory: pytest.TempPathFactory) -> str:  # noqa: ANN001
    _, ds = convert_with_columns(tmp_path_factory.mktemp("scvi"))
    return str(ds)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("cache"))


def train_both(scvi, root: str, adata, cache: str):  # noqa: ANN001, ANN201
    from deltacells.scvi import DataModule

    options = dict(max_epochs=EPOCHS, accelerator="cpu", enable_progress_bar=False, enable_model_summary=False,
                   check_val_every_n_epoch=1)
    scvi.settings.seed = 0
    data = DataModule(root, batch_key="batch", train_size=0.9, cache_dir=cache)
    model = scvi.model.SCVI(registry=data.registry)
    model.train(datamodule=data, **options)
    scvi.settings.seed = 0
    own = adata.copy()
    scvi.model.SCVI.setup_anndata(own, batch_key="batch")
    reference = scvi.model.SCVI(own)
    reference.train(train_size=0.9, batch_size=128, **options)
    return data, model, reference


@pytest.fixture(scope="module")
def trained(scvi, root: str, adata, cache: str):  # noqa: ANN001, ANN201
    return train_both(scvi, root, adata, cache)


def test_scvi_trains_from_the_dataset_as_from_anndata(trained, capsys) -> None:  # noqa: ANN001
    data, model, reference = trained
    ours = model.history["elbo_train"].to_numpy(dtype=float).ravel()
    theirs = reference.history["elbo_train"].to_numpy(dtype=float).ravel()
    ours_val = model.history["elbo_validation"].to_numpy(dtype=float).ravel()
    theirs_val = reference.history["elbo_validation"].to_numpy(dtype=float).ravel()
    with capsys.disabled():
        print(f"\nSCVI, {EPOCHS} epochs: training ELBO from the dataset {ours.round(1).tolist()}, "
              f"from AnnData {theirs.round(1).tolist()}; last validation ELBO {ours_val[-1]:.1f} and "
              f"{theirs_val[-1]:.1f}")
    assert len(ours) == len(theirs) == EPOCHS
    # Both train: the loss falls, by much.
    assert ours[-1] < 0.8 * ours[0] and theirs[-1] < 0.8 * theirs[0]
    assert abs(ours[-1] - theirs[-1]) / theirs[-1] < TOLERANCE, (ours[-1], theirs[-1])
    assert abs(ours_val[-1] - theirs_val[-1]) / theirs_val[-1] < TOLERANCE, (ours_val[-1], theirs_val[-1])
    assert data.n_train == 900 and data.n_val == 100
    np.testing.assert_array_equal(np.sort(np.r_[model.train_indices, model.validation_indices]), np.arange(1000))
    # The module's shape is the anndata model's.
    assert model.module.n_input == reference.module.n_input == GENES
    assert model.module.n_batch == reference.module.n_batch == 2
    assert model.summary_stats.n_labels == reference.summary_stats.n_labels == 1


def test_latent_representation_of_the_datasets_cells(trained) -> None:  # noqa: ANN001
    data, model, _ = trained
    z = model.get_latent_representation(dataloader=data.inference_dataloader())
    assert z.shape == (1000, 10) and np.isfinite(z).all()
    # Cells in any order give those rows, whatever the batch size.
    some = np.array([999, 5, 0, 512, 5])
    part = model.get_latent_representation(dataloader=data.inference_dataloader(indices=some, batch_size=2))
    np.testing.assert_allclose(part, z[some], rtol=1e-5, atol=1e-6)
    assert len(data.inference_dataloader(batch_size=300)) == 4


def test_save_and_load_with_the_datamodule(scvi, trained, tmp_path: Path) -> None:  # noqa: ANN001
    data, model, _ = trained
    model.save(str(tmp_path / "model"), datamodule=data)
    # Loaded without the datamodule: scvi-tools 1.4.2's load(datamodule=...)
    # hands it on to SCVI's constructor, which refuses it; the registry and
    # the sizes it needs were saved with the model.
    loaded = scvi.model.SCVI.load(str(tmp_path / "model"))
    z = model.get_latent_representation(dataloader=data.inference_dataloader())
    np.testing.assert_allclose(loaded.get_latent_representation(dataloader=data.inference_dataloader()), z,
                               rtol=1e-5, atol=1e-6)


def test_batches_are_the_anndata_rows_and_codes(scvi, root: str, adata, cache: str) -> None:  # noqa: ANN001
    from deltacells.scvi import DataModule

    data = DataModule(root, 64, batch_key="batch", labels_key="cls", sample_key="donor",
                      categorical_covariate_keys=["kind", "donor"], continuous_covariate_keys=["n_counts"],
                      cache_dir=cache)
    column = {name: j for j, name in enumerate(adata.var_names)}
    order = np.array([column[name] for name in data.var_names])
    dense = adata.X.toarray()[:, order]
    seen = []
    for tensors in data.train_dataloader():
        cells = tensors["ind_x"].numpy().ravel()
        seen.append(cells)
        assert str(tensors["X"].dtype) == "torch.float32" and tensors["X"].shape == (len(cells), GENES)
        np.testing.assert_array_equal(tensors["X"].numpy(), dense[cells])
        obs = adata.obs.iloc[cells]
        np.testing.assert_array_equal(tensors["batch"].numpy().ravel(), obs["batch"].cat.codes)
        np.testing.assert_array_equal(tensors["labels"].numpy().ravel(), obs["cls"].cat.codes)
        np.testing.assert_array_equal(tensors["sample"].numpy().ravel(), obs["donor"].cat.codes)
        kinds = np.searchsorted(np.array(["x", "y", "z"]), obs["kind"].to_numpy().astype(str))
        np.testing.assert_array_equal(tensors["extra_categorical_covs"].numpy(),
                                      np.c_[kinds, obs["donor"].cat.codes])
        np.testing.assert_allclose(tensors["extra_continuous_covs"].numpy().ravel(), obs["n_counts"], rtol=1e-6)
        for key in ("batch", "labels", "sample", "extra_categorical_covs", "ind_x"):
            assert str(tensors[key].dtype) == "torch.int64", key
    np.testing.assert_array_equal(np.sort(np.concatenate(seen)), data.train_idx)
    registry = data.registry["field_registries"]
    assert list(registry["labels"]["state_registry"]["categorical_mapping"]) == ["A", "B", "C", "D"]
    assert registry["extra_categorical_covs"]["state_registry"]["n_cats_per_key"] == [3, 8]
    assert data.n_obs_per_sample.sum().item() == 1000
    # A model with every covariate trains on them.
    scvi.settings.seed = 0
    model = scvi.model.SCVI(registry=data.registry, n_latent=4)
    model.train(datamodule=data, max_epochs=1, accelerator="cpu", enable_progress_bar=False)
    assert model.get_latent_representation(dataloader=data.inference_dataloader()).shape == (1000, 4)


def test_class_sampling_and_a_split_by_donor(scvi, root: str, adata, cache: str) -> None:  # noqa: ANN001
    from deltacells.scvi import DataModule

    data = DataModule(root, 100, labels_key="cls", split_by="donor", train_size=0.75, validation_size=0.25,
                      balance="cls", num_samples=4000, cache_dir=cache)
    donors = adata.obs["donor"].to_numpy()
    assert not set(donors[data.train_idx]) & set(donors[data.val_idx])
    assert len(data.test_idx) == 0
    labels = np.concatenate([t["labels"].numpy().ravel() for t in data.train_dataloader()])
    assert len(labels) == 4000
    shares = np.bincount(labels, minlength=4) / len(labels)
    assert np.all(np.abs(shares - 0.25) < 0.05), shares  # the rarest class (5%) drawn as often as the others
    # Validation reads its cells once, unweighted.
    val = np.concatenate([t["ind_x"].numpy().ravel() for t in data.val_dataloader()])
    np.testing.assert_array_equal(val, data.val_idx)


def test_a_collection_and_a_bucket(scvi, root: str, s3_server: str, tmp_path: Path,  # noqa: ANN001
                                   monkeypatch: pytest.MonkeyPatch, cache: str) -> None:
    from deltacells.scvi import DataModule

    for key, value in S3_ENV.items():
        monkeypatch.setenv(key, value)
    source = Path(root).parent / "pbmc.h5ad"
    deltacells.convert(source, "s3://test/pbmc", tile_size=300, level=3, endpoint=s3_server, progress=False)
    remote = DataModule("s3://test/pbmc", batch_key="batch", endpoint=s3_server, cache_dir=str(tmp_path / "c1"))
    local = DataModule(root, batch_key="batch", cache_dir=cache)
    np.testing.assert_array_equal(remote.var_names, local.var_names)
    scvi.settings.seed = 0
    model = scvi.model.SCVI(registry=remote.registry, n_latent=4)
    model.train(datamodule=remote, max_epochs=2, accelerator="cpu", enable_progress_bar=False)
    assert model.get_latent_representation(dataloader=remote.inference_dataloader()).shape == (1000, 4)
    # Two datasets as one collection: the bucket's and the local one.
    coll = deltacells.open_collection({"local": root, "remote": "s3://test/pbmc"}, endpoint=s3_server,
                                      cache_dir=str(tmp_path / "c2"))
    data = DataModule(coll, batch_key="batch", categorical_covariate_keys=["donor"])
    assert data.n_obs == 2000 and data.n_vars == GENES and data.n_batch == 2
    model = scvi.model.SCVI(registry=data.registry, n_latent=4)
    model.train(datamodule=data, max_epochs=1, accelerator="cpu", enable_progress_bar=False)
    assert model.get_latent_representation(dataloader=data.inference_dataloader()).shape == (2000, 4)


def test_bad_arguments_are_named(scvi, root: str, cache: str) -> None:  # noqa: ANN001
    from deltacells.scvi import DataModule

    with pytest.raises(deltacells.InvalidArgumentError, match="normalize: scvi-tools models take the counts"):
        DataModule(root, normalize=1e4, cache_dir=cache)
    with pytest.raises(deltacells.UnknownNameError, match="no obs column 'nope'"):
        DataModule(root, batch_key="nope", cache_dir=cache)
    with pytest.raises(deltacells.InvalidArgumentError, match="continuous_covariate_keys: obs column 'batch' is"):
        DataModule(root, continuous_covariate_keys=["batch"], cache_dir=cache)
    with pytest.raises(deltacells.InvalidArgumentError, match="'partial' misses a value for 100 of the module's"):
        DataModule(root, batch_key="partial", cache_dir=cache)
    ds = deltacells.open_dataset(root, cache_dir=cache)
    assert DataModule(ds, batch_key="partial", cells=ds.obs.where("partial", "p")).n_obs == 900
    with pytest.raises(deltacells.InvalidArgumentError, match="train_size must be a number from 0 to 1"):
        DataModule(root, train_size=1.5, cache_dir=cache)
    with pytest.raises(deltacells.InvalidArgumentError, match="add up to more than 1"):
        DataModule(root, train_size=0.8, validation_size=0.3, cache_dir=cache)
    with pytest.raises(deltacells.ArgumentTypeError, match="nope: not an argument of DataModule"):
        DataModule(root, nope=1, cache_dir=cache)
