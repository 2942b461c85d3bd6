import pytest

from settings.config import ConfigError, load_config


def test_default_config_is_the_taxi_job():
    config = load_config()
    assert config.name == "taxi"
    assert config.label.column == "tips"
    assert "tips" not in config.features
    assert config.schema_path.endswith("taxi_schema.pbtxt")
    assert config.beam.direct_running_mode == "auto"


def test_overrides_are_typed():
    config = load_config(None, ["training.train_steps=7", "training.hidden_units=[8, 4]", "training.clipnorm=null",
                                "training.batch_norm=true", "training.l2=1e-4"])
    assert config.training.train_steps == 7
    assert config.training.hidden_units == [8, 4]
    assert config.training.clipnorm is None
    assert config.training.batch_norm is True
    assert config.training.l2 == pytest.approx(1e-4)


def test_unknown_key_names_it_and_lists_valid_ones():
    with pytest.raises(ConfigError) as error:
        load_config(None, ["training.learning_rat=0.1"])
    message = str(error.value)
    assert "training.learning_rat" in message
    assert "training.learning_rate" in message and "training.optimizer" in message


def test_unknown_top_level_key(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("nmae: x\n")
    with pytest.raises(ConfigError, match="unknown config key 'nmae'.*name, model_name"):
        load_config(path)


@pytest.mark.parametrize(
    "override, expected",
    [
        ("training.train_steps=many", "'training.train_steps' must be an integer"),
        ("training.dropout=[1]", "'training.dropout' must be a number"),
        ("training.optimizer=rmsprop", "'training.optimizer' must be one of 'adam', 'sgd'"),
        ("training.batch_norm=1", "'training.batch_norm' must be true or false"),
        ("data.vocab_features=company", "'data.vocab_features' must be a list of a string"),
        ("training=3", "'training' must be a mapping"),
    ],
)
def test_wrong_types_name_the_key(override, expected):
    with pytest.raises(ConfigError, match=expected):
        load_config(None, [override])


def test_label_column_cannot_be_a_feature():
    with pytest.raises(ConfigError, match="label.column 'fare' is also listed as a feature"):
        load_config(None, ["label.column=fare"])


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "nope.yaml")


def test_malformed_override():
    with pytest.raises(ConfigError, match="must look like key.sub=value"):
        load_config(None, ["training.train_steps"])
