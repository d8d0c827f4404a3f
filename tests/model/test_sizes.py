import pytest

from multicritic import get_model_dims

# Appendix B of the paper and RLlib's debug sizes, typed in from SPEC §2.
TABLE = {
    "nano": (16, 16, 1, 4, 4),
    "micro": (32, 32, 1, 8, 8),
    "mini": (64, 64, 1, 16, 16),
    "XXS": (128, 128, 1, 32, 32),
    "XS": (256, 256, 1, 32, 32),
    "S": (512, 512, 2, 32, 32),
    "M": (1024, 640, 3, 32, 32),
    "L": (2048, 768, 4, 32, 32),
    "XL": (4096, 1024, 5, 32, 32),
}


@pytest.mark.parametrize("size", list(TABLE))
def test_table(size):
    dims = get_model_dims(size)
    got = (
        dims["gru_units"],
        dims["dense_hidden_units"],
        dims["num_dense_layers"],
        dims["num_z_categoricals"],
        dims["num_z_classes"],
    )
    assert got == TABLE[size]


def test_overrides_and_none():
    assert get_model_dims("XS", num_dense_layers=3)["num_dense_layers"] == 3
    assert get_model_dims("XS", num_dense_layers=None)["num_dense_layers"] == 1
    dims = get_model_dims(None, dense_hidden_units=7)
    assert dims["dense_hidden_units"] == 7 and dims["gru_units"] is None


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"model_size": "XXL"}, "model_size: got 'XXL'"),
        ({"model_size": "xs"}, "model_size"),
        ({"model_size": "XS", "gru_units": 0}, "gru_units: got 0"),
        ({"model_size": "XS", "hidden": 3}, "unknown dimension"),
    ],
)
def test_bad_input(kwargs, match):
    size = kwargs.pop("model_size")
    with pytest.raises(ValueError, match=match):
        get_model_dims(size, **kwargs)
