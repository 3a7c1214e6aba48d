"""A ps.json secret (the Redis password) never shows in a message, a log line or a repr."""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path

import pytest
from ps_samples import REALISTIC_PS

from hps_core.cli.main import main
from hps_core.config import load_ps_config, parse_ps_config
from hps_core.errors import ConfigError

SECRET = "pw-9f8e7d6c-not-for-logs"


def with_password(password: object) -> dict:
    document = copy.deepcopy(REALISTIC_PS)
    document["volatile_db"]["password"] = password
    return document


def test_a_parsed_config_keeps_its_password_out_of_repr() -> None:
    config = parse_ps_config(with_password(SECRET), "/srv/models/repo")
    assert config.volatile_db.password == SECRET
    assert SECRET not in repr(config) and SECRET not in str(config)
    assert config.to_dict()["volatile_db"]["password"] == SECRET  # written back to a ps.json


@pytest.mark.parametrize(
    "fault", [("num_partitions", "eight"), ("address", ""), ("user_name", 7), ("bogus_key", 1)]
)
def test_errors_beside_a_password_do_not_show_it(fault: tuple[str, object]) -> None:
    document = with_password(SECRET)
    document["volatile_db"][fault[0]] = fault[1]
    document["models"][0]["max_batch_size"] = -1
    try:
        parse_ps_config(document, "/srv/models/repo")
    except ConfigError as exc:
        assert SECRET not in str(exc)
        assert "max_batch_size" in str(exc)
    else:
        pytest.fail("the config was accepted")


@pytest.mark.parametrize("password", [12345678, ["pw", 1], {"pw": SECRET}, 3.25])
def test_a_password_of_the_wrong_type_is_refused_without_its_value(password: object) -> None:
    with pytest.raises(ConfigError, match=r"volatile_db\.password: expected a string") as info:
        parse_ps_config(with_password(password), "/srv/models/repo")
    assert "not shown" in str(info.value)
    for shown in ("12345678", "3.25", SECRET):
        assert shown not in str(info.value)


def test_loading_and_checking_log_and_print_no_password(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "ps.json"
    path.write_text(json.dumps(with_password(SECRET)))
    with caplog.at_level(logging.DEBUG):
        load_ps_config(path)
        main(["check", str(path)])  # its files do not exist here: it reports problems
    printed = capsys.readouterr()
    assert SECRET not in caplog.text
    assert SECRET not in printed.out and SECRET not in printed.err
